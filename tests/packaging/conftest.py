"""Fixtures of the packaging tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import Fleet
from bridge.simulator.vms import demo_vms


@pytest.fixture
def imds() -> Iterator[SimulatorServer]:
    """The demo fleet's IMDS simulator in real time, on a free port."""
    with SimulatorServer(Simulator(Fleet(demo_vms(seed=0), time_scale=1.0))) as server:
        yield server
