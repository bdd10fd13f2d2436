"""The standalone consumer's loopback page, for one operator, over each module's `decider`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.config import PeopleSettings
from bridge.consumer.people.server import PageServer, build_app
from tests.support.people import NOW, RecordingDesk


@pytest.fixture
def local(decider: RecordingDesk, tmp_path: Path) -> Iterator[PageServer]:
    app = build_app(PeopleSettings(page_address="127.0.0.1:0"), decider, tmp_path, lambda: NOW)
    server = PageServer(app, "127.0.0.1:0").start()
    yield server
    server.close()
