"""Fixtures the component tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bridge.fleet import Fleet
from bridge.fleetspec import demo_vms
from bridge.simulator import Simulator, SimulatorServer


@pytest.fixture
def sim() -> Iterator[tuple[Simulator, SimulatorServer]]:
    """The demo fleet's simulator in real time, serving on a free port."""
    simulator = Simulator(Fleet(demo_vms(seed=0), time_scale=1.0))
    with SimulatorServer(simulator) as server:
        yield simulator, server
