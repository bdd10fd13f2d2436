"""The Log Analytics sink against the strict Logs Ingestion double, with a real MI token.

The token comes from the IMDS simulator's identity endpoint through the agent's own
managed-identity credential (AZURE_POD_IDENTITY_AUTHORITY_HOST), and TLS trust from
REQUESTS_CA_BUNDLE: the production code runs unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bridge import schema
from bridge.config import Config, IdentitySettings, LogAnalyticsSettings
from bridge.retry import PermanentError, PoisonRecords, RetryableError, ThrottledError
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import Fleet
from bridge.simulator.vms import demo_vms
from bridge.sinks import SpooledRecord
from bridge.sinks.loganalytics import LogAnalyticsSink
from tests.doubles.logs_ingestion import LogsIngestionDouble
from tests.support.records import assert_valid, event_record

RULE = "dcr-00000000000000000000000000000001"


@pytest.fixture
def double() -> Iterator[LogsIngestionDouble]:
    with LogsIngestionDouble(RULE, schema.DCR_STREAM, schema.dcr_stream_declaration()) as d:
        yield d


@pytest.fixture
def imds() -> Iterator[SimulatorServer]:
    with SimulatorServer(Simulator(Fleet(demo_vms(seed=0)))) as server:
        yield server


@pytest.fixture
def sink(
    double: LogsIngestionDouble, imds: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LogAnalyticsSink]:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(double.ca_bundle))
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", imds.vm_url("vm-0"))
    config = Config(
        loganalytics=LogAnalyticsSettings(endpoint=double.endpoint, rule_id=RULE),
        identity=IdentitySettings(kind="managed"),
    )
    s = LogAnalyticsSink(config.loganalytics, config.identity)
    yield s
    s.close()


def spooled(count: int, start: int = 1, **extra: Any) -> list[SpooledRecord]:
    out = []
    for n in range(start, start + count):
        record = event_record(rid=f"r{n}", **extra)
        out.append(SpooledRecord(n, f"r{n}", "Event", json.dumps(record)))
    return out


def test_records_arrive_exactly_with_a_managed_identity_token(
    sink: LogAnalyticsSink, double: LogsIngestionDouble, imds: SimulatorServer
) -> None:
    batch = spooled(3)
    sink.send(batch)
    stored = double.records()
    assert stored == [json.loads(r.body) for r in batch]
    for record in stored:
        assert_valid(record)
    assert len(double.tokens_seen) == 1
    assert imds.simulator.counters()["vm-0"]["GET token"] == 1  # fetched once, then cached


def test_check_is_a_harmless_round_trip(
    sink: LogAnalyticsSink, double: LogsIngestionDouble
) -> None:
    assert "accepted a request" in sink.check()
    assert double.records() == []
    assert [r.status for r in double.requests] == [204]


def test_a_batch_over_the_upload_limit_is_split_under_1_mib(
    sink: LogAnalyticsSink, double: LogsIngestionDouble
) -> None:
    batch = spooled(1500)
    sink.send(batch)
    assert len(double.records()) == 1500
    assert len(double.requests) >= 2
    assert all(r.status == 204 for r in double.requests)
    assert all((r.uncompressed_size or 0) <= 1024 * 1024 for r in double.requests)


def test_429_is_throttled_with_retry_after(
    sink: LogAnalyticsSink, double: LogsIngestionDouble
) -> None:
    double.script(429, retry_after=7)
    with pytest.raises(ThrottledError) as info:
        sink.send(spooled(2))
    assert info.value.retry_after == 7.0
    sink.send(spooled(2))
    assert len(double.records()) == 2


@pytest.mark.parametrize(
    ("status", "kind", "advice"),
    [
        (403, PermanentError, "Monitoring Metrics Publisher role on the data collection rule"),
        (404, PermanentError, "check loganalytics.endpoint, loganalytics.rule_id"),
        (401, PermanentError, "managed identity"),
        (503, RetryableError, "503"),
        (502, RetryableError, "502"),
    ],
)
def test_failures_carry_advice(
    sink: LogAnalyticsSink,
    double: LogsIngestionDouble,
    status: int,
    kind: type[Exception],
    advice: str,
) -> None:
    double.script(status)
    with pytest.raises(kind) as info:
        sink.send(spooled(1))
    assert type(info.value) is kind
    assert advice in str(info.value)
    for token in double.tokens_seen:
        assert token not in str(info.value)


def test_service_down_is_retryable(sink: LogAnalyticsSink, double: LogsIngestionDouble) -> None:
    double.down()
    with pytest.raises(RetryableError, match="cannot reach the Logs Ingestion API"):
        sink.send(spooled(1))
    double.up()
    sink.send(spooled(1))
    assert len(double.records()) == 1


def test_one_bad_record_is_poison_and_the_rest_arrive(
    sink: LogAnalyticsSink, double: LogsIngestionDouble
) -> None:
    good = spooled(4)
    bad = spooled(1, start=5, DocumentIncarnation="not a number")
    with pytest.raises(PoisonRecords) as info:
        sink.send([*good[:2], *bad, *good[2:]])
    assert info.value.seqs == [5]
    assert [r["RecordId"] for r in double.records()] == ["r1", "r2", "r3", "r4"]


def test_every_record_refused_means_the_dcr_does_not_match(
    sink: LogAnalyticsSink, double: LogsIngestionDouble
) -> None:
    narrow = {"columns": [c for c in schema.dcr_stream_declaration()["columns"]
                          if c["name"] != "EventId"]}  # fmt: skip
    double.add_stream(RULE, schema.DCR_STREAM, narrow)
    with pytest.raises(PermanentError) as info:
        sink.send(spooled(3))
    assert not isinstance(info.value, PoisonRecords)
    assert "redeploy infra/" in str(info.value)


@pytest.mark.slow
def test_without_a_managed_identity_the_error_says_what_to_do(
    double: LogsIngestionDouble, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(double.ca_bundle))
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", "http://127.0.0.1:9")  # nothing there
    config = replace(
        Config(),
        loganalytics=LogAnalyticsSettings(endpoint=double.endpoint, rule_id=RULE),
        identity=IdentitySettings(kind="managed"),
    )
    sink = LogAnalyticsSink(config.loganalytics, config.identity)
    try:
        with pytest.raises((PermanentError, RetryableError)) as info:
            sink.send(spooled(1))
    finally:
        sink.close()
    assert "Logs Ingestion API" in str(info.value)
    assert double.records() == []


def test_heartbeats_and_neighbours_events_may_wait_for_the_next_upload(
    sink: LogAnalyticsSink,
) -> None:
    # At fan-out 100 (a placement group) most records are about other VMs' events: those
    # share an upload a minute; this VM's own events, approvals and anything unclear go now.
    def spooled_as(record_type: str, body: dict[str, Any] | str) -> SpooledRecord:
        text = body if isinstance(body, str) else json.dumps(body)
        return SpooledRecord(1, "r1", record_type, text)

    assert sink.send_interval == 60.0
    assert sink.can_wait(spooled_as("Heartbeat", {"RecordType": "Heartbeat"}))
    assert sink.can_wait(spooled_as("Event", event_record(affects=False)))
    assert not sink.can_wait(spooled_as("Event", event_record(affects=True)))
    assert not sink.can_wait(spooled_as("Event", event_record(affects=None)))
    assert not sink.can_wait(spooled_as("Approval", {"RecordType": "Approval"}))
    assert not sink.can_wait(spooled_as("Event", "{not json"))
