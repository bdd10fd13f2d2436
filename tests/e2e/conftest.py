"""Fixtures of the end-to-end tests; the process handling itself is in tests.support.processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bridge import schema
from tests.doubles.logs_ingestion import LogsIngestionDouble
from tests.support.cloud import RULE


@pytest.fixture
def logs() -> Iterator[LogsIngestionDouble]:
    """The Logs Ingestion double, declaring the stream generated from the record schema."""
    with LogsIngestionDouble(RULE, schema.DCR_STREAM, schema.dcr_stream_declaration()) as double:
        yield double
