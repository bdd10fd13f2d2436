"""Fixtures of the end-to-end tests; the process handling itself is in tests.e2e.harness."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge import schema
from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.doubles.logs_ingestion import LogsIngestionDouble
from tests.e2e.cloud import RULE
from tests.e2e.harness import Processes


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """Processes started by one test; whatever still runs at its end is killed."""
    processes = Processes(tmp_path)
    try:
        yield processes
    finally:
        processes.close()


@pytest.fixture
def broker() -> Iterator[EventHubsBroker]:
    """The Event Hubs test broker (AMQP on a free port)."""
    with EventHubsBroker(hub="records", partitions=4) as running:
        yield running


@pytest.fixture
def logs() -> Iterator[LogsIngestionDouble]:
    """The Logs Ingestion double, declaring the stream generated from the record schema."""
    with LogsIngestionDouble(RULE, schema.DCR_STREAM, schema.dcr_stream_declaration()) as double:
        yield double
