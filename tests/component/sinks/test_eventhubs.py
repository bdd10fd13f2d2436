"""The Event Hubs sink against the AMQP test broker, through the real azure-eventhub client."""

from __future__ import annotations

import gc
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bridge.cloud.managedidentity import ImdsManagedIdentity
from bridge.config import Config, EventHubsSettings, IdentitySettings
from bridge.retry import PermanentError, PoisonRecords, RetryableError
from bridge.sinks import SpooledRecord, eventhubs
from bridge.sinks.eventhubs import EventHubsSink
from tests.doubles.eventhubs_broker import (
    SERVER_BUSY,
    UNAUTHORIZED,
    EventHubsBroker,
    StoredEvent,
)
from tests.support.records import assert_valid, event_record
from tests.support.wait import eventually


@pytest.fixture
def sink(broker: EventHubsBroker) -> Iterator[EventHubsSink]:
    s = EventHubsSink(
        EventHubsSettings(connection_string=broker.connection_string), IdentitySettings()
    )
    yield s
    s.close()
    gc.collect()  # the SDK drops broken sockets unclosed; collect them inside the test's filter


def vm_id(name: str) -> str:
    """A VmId is a GUID: one made from the short name the tests read better."""
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, name))


def spooled(count: int, start: int = 1, vm: str = "vm-1", **extra: Any) -> list[SpooledRecord]:
    out = []
    for n in range(start, start + count):
        record = event_record(rid=f"r{n}", VmId=vm_id(vm), **extra)
        assert_valid(record)
        out.append(SpooledRecord(n, f"r{n}", "Event", json.dumps(record)))
    return out


def assert_routed(broker: EventHubsBroker, batch: list[SpooledRecord]) -> list[StoredEvent]:
    """The broker holds `batch` in order, each event with the contract's partition key and
    application properties (docs/contracts.md, Delivery), whichever transport sent it."""
    events = broker.events()
    assert [json.loads(e.body) for e in events] == [json.loads(r.body) for r in batch]
    for event, record in zip(events, batch, strict=True):
        body = json.loads(record.body)
        assert event.partition_key == body["VmId"]
        assert event.application_properties == {
            "RecordType": "Event",
            "SchemaVersion": 1,
            "VmId": body["VmId"],
            "RecordId": record.record_id,
        }
    return events


def test_records_arrive_in_order_with_routing_properties(
    sink: EventHubsSink, broker: EventHubsBroker
) -> None:
    batch = [*spooled(3, vm="vm-a"), *spooled(2, start=4, vm="vm-b")]
    sink.send(batch)
    events = assert_routed(broker, batch)
    assert {e.content_type for e in events} == {"application/json"}
    by_vm = {e.partition_key: e.partition for e in events}
    assert {e.partition for e in events if e.partition_key == vm_id("vm-a")} == {
        by_vm[vm_id("vm-a")]
    }


def test_a_batch_larger_than_the_hub_limit_is_split_and_kept_in_order(
    sink: EventHubsSink, broker: EventHubsBroker
) -> None:
    batch = spooled(400, Description="x" * 4000)  # about 2 MB: several SDK batches
    sink.send(batch)
    assert [json.loads(e.body)["RecordId"] for e in broker.events()] == [r.record_id for r in batch]


def test_interleaved_vms_go_in_one_sdk_batch_per_vm_each_in_spool_order(
    sink: EventHubsSink, broker: EventHubsBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink.check()
    producer = sink._get_producer()
    sent: list[int] = []
    real_send = producer.send_batch

    def counting_send(batch: Any, **kwargs: Any) -> None:
        sent.append(len(batch))
        real_send(batch, **kwargs)

    monkeypatch.setattr(producer, "send_batch", counting_send)
    batch = [
        record
        for n in range(10)
        for record in (spooled(1, 3 * n + 1, vm="vm-a") + spooled(1, 3 * n + 2, vm="vm-b")
                       + spooled(1, 3 * n + 3, vm="vm-c"))
    ]  # fmt: skip
    sink.send(batch)
    assert sent == [10, 10, 10]  # a backlog of many VMs is not one round trip per record
    for vm in ("vm-a", "vm-b", "vm-c"):
        arrived = [
            json.loads(e.body)["RecordId"] for e in broker.events() if e.partition_key == vm_id(vm)
        ]
        assert arrived == [r.record_id for r in batch if json.loads(r.body)["VmId"] == vm_id(vm)]
        assert len(arrived) == 10


def test_check_opens_a_sender_and_sends_nothing(
    sink: EventHubsSink, broker: EventHubsBroker
) -> None:
    assert "accepted a sender" in sink.check()
    assert broker.events() == []


@pytest.mark.filterwarnings("ignore:unclosed <socket:ResourceWarning")
def test_broker_down_is_retryable_and_the_next_send_after_it_returns_works(
    sink: EventHubsSink, broker: EventHubsBroker
) -> None:
    sink.send(spooled(1))
    broker.stop()
    with pytest.raises(RetryableError):
        sink.send(spooled(1, start=2))
    broker.start()
    sink.send(spooled(1, start=2))
    assert [json.loads(e.body)["RecordId"] for e in broker.events()] == ["r1", "r2"]


def test_busy_broker_is_retryable(sink: EventHubsSink, broker: EventHubsBroker) -> None:
    sink.check()
    broker.fail_sends(2, SERVER_BUSY)  # the SDK itself tries twice
    with pytest.raises(RetryableError) as info:
        sink.send(spooled(1))
    assert not isinstance(info.value, PermanentError)


def test_unauthorized_send_is_permanent_with_advice(
    sink: EventHubsSink, broker: EventHubsBroker
) -> None:
    sink.check()
    broker.fail_sends(2, UNAUTHORIZED)
    with pytest.raises(PermanentError) as info:
        sink.send(spooled(1))
    assert "the Send right" in str(info.value)  # a connection string: its policy's right
    assert broker.key not in str(info.value)


@pytest.mark.filterwarnings("ignore:unclosed <socket:ResourceWarning")
def test_refused_token_is_permanent_with_advice(
    sink: EventHubsSink, broker: EventHubsBroker
) -> None:
    broker.reject_tokens(10)
    with pytest.raises(PermanentError, match="the Send right"):
        sink.check()


def test_a_record_larger_than_any_batch_is_poison(
    sink: EventHubsSink, broker: EventHubsBroker
) -> None:
    huge = spooled(1, start=2, Description="x" * (1024 * 1024 + 10))
    with pytest.raises(PoisonRecords) as info:
        sink.send([*spooled(1), *huge, *spooled(1, start=3)])
    assert info.value.seqs == [2]
    assert broker.events() == []  # nothing went ahead, so the retry of the rest duplicates none


def test_namespace_and_name_use_an_entra_credential_not_a_key() -> None:
    config = Config(
        eventhubs=EventHubsSettings(namespace="contoso.servicebus.windows.net", name="records"),
        identity=IdentitySettings(kind="managed", client_id="11111111-2222-3333-4444-555555555555"),
    )
    sink = EventHubsSink(config.eventhubs, config.identity)
    producer = sink._get_producer()  # constructing connects nothing
    try:
        assert producer.eventhub_name == "records"
        assert producer._address.hostname == "contoso.servicebus.windows.net"
        # The VM's managed identity, read from IMDS (bridge.cloud.managedidentity).
        assert isinstance(producer._credential, ImdsManagedIdentity)
        assert producer._credential._client_id == "11111111-2222-3333-4444-555555555555"
    finally:
        sink.close()


def test_an_idle_producer_lets_its_connection_go_and_the_next_send_opens_one(
    sink: EventHubsSink, broker: EventHubsBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent that only heartbeats holds no connection between heartbeats (issue 15)."""
    sink.send(spooled(1))
    assert broker.connection_count == 1
    again = sink.idle()  # just sent: kept, and the delivery loop is asked to look again
    assert again is not None
    assert 0 < again <= eventhubs.IDLE_CLOSE
    assert broker.connection_count == 1
    monkeypatch.setattr(eventhubs, "IDLE_CLOSE", 0.0)
    assert sink.idle() is None
    eventually(lambda: broker.connection_count == 0, what="the idle sink to close its connection")
    sink.send(spooled(1, start=2))
    assert [json.loads(e.body)["RecordId"] for e in broker.events()] == ["r1", "r2"]
