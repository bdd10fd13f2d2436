"""Fixtures every test directory shares, and the markers each test gets from what it needs."""

from __future__ import annotations

import gc
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.rig import Rig
from tests.chaos.run import run_chaos
from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.support import killtools, markers, processes
from tests.support.azurite import Azurite
from tests.support.browser import Chromium
from tests.support.processes import Processes

TESTS = Path(__file__).resolve().parent
# What starts a server or a process of its own, by the marker it gives a test that reaches it.
NEEDS: dict[object, str] = {
    Azurite: "azurite",
    EventHubsBroker: "broker",
    processes.Processes: "subprocess",
    processes.Proc: "subprocess",
    processes.Agent: "subprocess",
    processes.Simulator: "subprocess",
    processes.run_bridge: "subprocess",
    killtools.spawn_agent: "subprocess",
    killtools.AgentKiller: "subprocess",
    Rig: "subprocess",
    run_chaos: "subprocess",
    Chromium: "browser",
}


# First, so that -m reads the markers given here.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        definitions = [d[-1] for d in item._fixtureinfo.name2fixturedefs.values() if d]
        needs = markers.by_directory(item.path, TESTS)
        needs |= {markers.BY_FIXTURE[f] for f in item.fixturenames if f in markers.BY_FIXTURE}
        needs |= markers.reached(
            [item.function, *(d.func for d in definitions if not d.params)], NEEDS
        )
        needs |= markers.reached([d.func for d in definitions if d.params], NEEDS, by_name=False)
        for name in sorted(needs - {m.name for m in item.iter_markers()}):
            item.add_marker(name)
    # The modules of slow tests first: workers take modules in this order (--dist loadscope),
    # so the longest runs start at once instead of running alone at the end.
    slow = {getattr(item, "module", None) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: getattr(item, "module", None) not in slow)


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


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """Undo what a program's setup_logging does to the root logger (its handlers, its level,
    the azure logger's level), closing what it added. A handler left behind writes to the
    stream of the test that made it, closed by then, and prints "--- Logging error ---" into
    whichever later test logs on the same worker."""
    root, azure = logging.getLogger(), logging.getLogger("azure")
    handlers, level, azure_level = list(root.handlers), root.level, azure.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
    azure.setLevel(azure_level)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """One Azurite (blob, queue, table) per session, that is per xdist worker, started on first
    use; tests use their own names."""
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
