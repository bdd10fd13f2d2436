"""Fixtures every test directory shares."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator

import pytest

from tests.azurite import Azurite


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
