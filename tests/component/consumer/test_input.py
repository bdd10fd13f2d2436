"""What the consumer refuses before it folds a record in: each refusal path, and the batch
goes on past it (bridge.consumer.sources.batches; bridge.consumer.validation.problem, the
service's gate)."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from prometheus_client import CollectorRegistry

from bridge import records, schema
from bridge.config import ConsumerSettings
from bridge.consumer import validation
from bridge.consumer.metrics import ConsumerMetrics
from bridge.consumer.replay import History, Replayer
from bridge.consumer.sources.batches import (
    MAX_RECORD_BYTES,
    BatchRetry,
    Message,
    NotARecord,
    check_record,
)
from bridge.policy.file import loads
from bridge.records import Health, Origin, VmIdentity, heartbeat_record
from bridge.retry import Backoff
from tests.benchmarks.bench_replay import POLICY, START, history
from tests.support.records import event_record

VM = "02aab8a4-74ef-476e-8182-f6d2ba4166a6"
NOW = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)


def heartbeat(vm_id: str | None = VM) -> dict[str, Any]:
    origin = Origin(VmIdentity(vm_id=vm_id, vm_name="web_0"), "host-a")
    return dict(heartbeat_record(origin, "Periodic", Health(3, 0, 0, 0, True, NOW), NOW))


def test_a_real_record_passes() -> None:
    body = json.dumps(heartbeat())
    assert check_record(body, VM)["VmId"] == VM
    assert check_record(json.dumps(heartbeat(None)), "host:host-a")["VmId"] is None


@pytest.mark.parametrize(
    ("body", "sender", "reason"),
    [
        ("x" * (MAX_RECORD_BYTES + 1), None, "more than"),
        ("{not json", None, "not JSON"),
        ("[1]", None, "not an object"),
        (json.dumps({**heartbeat(), "RecordType": "Evil"}), None, "RecordType must be one of"),
        (json.dumps({**heartbeat(), "Extra": 1}), None, "holds a field no record"),
        (json.dumps({**heartbeat(), "PendingEvents": "1"}), None, "PendingEvents must be integer"),
        (json.dumps({k: v for k, v in heartbeat().items() if k != "VmName"}), None, "lacks VmName"),
        (json.dumps({**heartbeat(), "TimeGenerated": "yesterday"}), None, "date-time"),
        (json.dumps(heartbeat()), "9c2e0000-0000-0000-0000-000000000000", "does not match"),
        (json.dumps(heartbeat(None)), "host:other", "does not match"),
        # Azure's word ends an event for every VM: only eventgrid.hub may carry it, never an
        # agent (issue 36)
        (json.dumps(event_record(Source="EventGrid")), None, "only from eventgrid.hub"),
    ],
)
def test_each_refusal_names_its_reason(body: str, sender: str | None, reason: str) -> None:
    with pytest.raises(NotARecord, match=reason):
        check_record(body, sender)


def test_the_check_agrees_with_jsonschema() -> None:
    validator = Draft202012Validator(schema.load())  # no date-time checker installed here
    base = heartbeat()
    variants = [
        base, {**base, "Tags": {"a": 1}}, {**base, "Tags": None}, {**base, "SchemaVersion": 2},
        {**base, "HeartbeatReason": "Later"}, {**base, "PlatformFaultDomain": True},
        {**base, "EventId": "E1"}, {"RecordType": "Event"}, {**base, "PendingEvents": 1.0},
        {**base, "PendingEvents": 1.5}, {**base, "VmId": "x/../y"}, {**base, "VmId": None},
    ]  # fmt: skip
    for record in variants:
        assert (validation.problem(dict(record)) is None) == validator.is_valid(record), record


def test_an_integral_float_where_the_schema_says_integer_is_valid_and_made_an_int() -> None:
    record = check_record(json.dumps({**heartbeat(), "PendingEvents": 1.0}), VM)
    assert record["RecordType"] == "Heartbeat"
    assert record["PendingEvents"] == 1
    assert type(record["PendingEvents"]) is int


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"VmId": "x/../y"}, "VmId"),  # cannot name a command channel
        ({"VmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6/.."}, "VmId"),
        ({"VmName": "web_\ud800"}, "VmName holds an unpaired surrogate"),
        ({"Tags": {"role": "\udfff"}}, "Tags.role holds an unpaired surrogate"),
        ({"TimeGenerated": "2026-19-39T29:59:59Z"}, "TimeGenerated"),
    ],
)
def test_values_that_would_break_the_consumer_later_are_refused_at_the_door(
    change: dict[str, Any], reason: str
) -> None:
    body = json.dumps({**heartbeat(), **change})  # a lone surrogate becomes "\\ud800"
    with pytest.raises(NotARecord, match=reason):
        check_record(body, None)


def test_a_refused_message_goes_to_the_dead_letters_and_the_batch_goes_on() -> None:
    handled: list[list[dict[str, Any]]] = []
    poisoned: list[tuple[str, str, str, str]] = []
    retry = BatchRetry(lambda records, _: handled.append(records),
                       lambda *p: poisoned.append(p), threading.Event(), "test")  # fmt: skip
    good, other = json.dumps(heartbeat()), json.dumps(heartbeat())
    messages = [Message("1", good, VM), Message("2", other, "someone-else"), Message("3", "oops")]
    assert retry.deliver("0", messages)
    assert [len(batch) for batch in handled] == [1]
    assert "does not match" in poisoned[0][3]
    assert [p[1] for p in poisoned] == ["2", "3"]


def test_a_record_the_schema_refuses_is_handled_once_though_the_metrics_see_it() -> None:
    """The metrics see a batch as it was read, before the service's gate sets a record aside:
    an Approval whose latency is not a number is not timed, and the batch is not retried."""
    metrics = ConsumerMetrics(CollectorRegistry())
    stop = threading.Event()
    handled: list[list[dict[str, object]]] = []

    def handler(records: list[dict[str, object]], _: object) -> None:
        handled.append(records)
        if len(handled) > 1:  # handled again: the batch would be retried for ever
            stop.set()

    outcome = records.ApprovalOutcome("C7061BAC", "Freeze", 3, "3d0c", "Central", "Approved", "ok")
    origin = Origin(VmIdentity(vm_id=VM, vm_name="web_0"), "host-a")
    approval = records.approval_record(origin, outcome, NOW)
    body = json.dumps({**approval, "ApprovalLatencyMs": "soon"})
    retry = BatchRetry(handler, lambda *p: None, stop, "test", Backoff(initial=0.001),
                       on_done=metrics.batch)  # fmt: skip
    assert retry.deliver("0", [Message("1", body, VM)])
    assert len(handled) == 1


def test_the_check_by_record_type_refuses_exactly_what_the_whole_schema_refuses() -> None:
    """`problem` checks a record against its RecordType's own compiled check (a quarter of the
    cost) and only then the whole schema: the two must agree on every record, so records of
    each type a fleet sends, each with every field another type has, every required field
    left out, every field of the wrong type, and another RecordType."""
    whole, refusal = validation._compiled()
    by_type = validation._compiled_by_type()
    assert set(by_type) == set(schema.record_types())

    def passes(check: Any, record: dict[str, Any]) -> bool:
        try:
            check(dict(record))
        except refusal:
            return False
        return True

    agents = history(3000)
    recorder = Replayer(loads(POLICY, "policy.yaml"), ConsumerSettings(), START)
    recorder.feed(History.of(agents).agents)
    recorder.close()
    samples: dict[str, dict[str, Any]] = {}
    for record in [*agents, *(dict(d) for d in recorder.decisions)]:
        samples.setdefault(record["RecordType"], record)
    assert set(samples) >= {"Heartbeat", "Event", "Approval", "Decision"}
    fields = list(schema.properties())
    checked = 0
    for kind, sample in samples.items():
        variants = [sample]
        variants += [{**sample, "RecordType": other} for other in by_type if other != kind]
        variants += [{k: v for k, v in sample.items() if k != f} for f in sample]
        wrongs: tuple[object, ...] = ("x", 1, None, [], 1.5)
        variants += [{**sample, f: wrong} for f in fields for wrong in wrongs]
        for record in variants:
            said = record.get("RecordType")  # as problem() picks its check
            check = by_type.get(said, whole) if isinstance(said, str) else whole
            assert passes(check, record) == passes(whole, record), record
            checked += 1
    assert checked > 1000
