"""Fixtures every test directory shares."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.support.azurite import Azurite
from tests.support.processes import Processes


@pytest.fixture(autouse=True)
def _sdk_sockets_collected_where_they_leak(request: pytest.FixtureRequest) -> Iterator[None]:
    # azure-eventhub drops broken connections without closing their sockets. Collecting them
    # at the end of the test that broke them keeps the ResourceWarning (an error here) from
    # surfacing at random in whatever test the garbage collector happens to run next.
    yield
    if "broker" in request.fixturenames:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "unclosed <socket", ResourceWarning)
            gc.collect()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """One Azurite (blob, queue, table) for the whole session; tests use their own names."""
    emulator = Azurite(tmp_path_factory.mktemp("azurite")).start()
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def broker() -> Iterator[EventHubsBroker]:
    """The Event Hubs test broker (AMQP on a free port): hub `records`, four partitions."""
    with EventHubsBroker(hub="records", partitions=4) as running:
        yield running


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """Processes started by one test; whatever still runs at its end is killed."""
    processes = Processes(tmp_path)
    try:
        yield processes
    finally:
        processes.close()
