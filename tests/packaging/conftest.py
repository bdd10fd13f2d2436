"""Fixtures of the packaging tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import Fleet
from bridge.simulator.vms import demo_vms


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Undo what the agent's setup_logging does to the root logger, closing its log file."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture
def imds() -> Iterator[SimulatorServer]:
    """The demo fleet's IMDS simulator in real time, on a free port."""
    with SimulatorServer(Simulator(Fleet(demo_vms(seed=0), time_scale=1.0))) as server:
        yield server
