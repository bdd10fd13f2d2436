"""Fixtures the component tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import Fleet
from bridge.simulator.vms import demo_vms
from tests.support.approvals import Harness


@pytest.fixture
def sim() -> Iterator[tuple[Simulator, SimulatorServer]]:
    """The demo fleet's simulator in real time, serving on a free port."""
    simulator = Simulator(Fleet(demo_vms(seed=0), time_scale=1.0))
    with SimulatorServer(simulator) as server:
        yield simulator, server


@pytest.fixture
def harness(sim: tuple[Simulator, SimulatorServer], tmp_path: Path) -> Iterator[Harness]:
    """An in-process agent with a command listener against `sim` (test modules may override)."""
    made = Harness(sim[1], tmp_path)
    yield made
    made.stop()
