"""Fixtures of the end-to-end tests; the process handling itself is in tests.e2e.harness."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Processes


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """Processes started by one test; whatever still runs at its end is killed."""
    processes = Processes(tmp_path)
    try:
        yield processes
    finally:
        processes.close()
