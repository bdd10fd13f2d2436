"""Fixtures every test directory shares."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator

import pytest


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
