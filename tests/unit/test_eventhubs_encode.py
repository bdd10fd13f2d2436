"""The sink's fix to azure-eventhub encoding each event twice as it joins a batch.

The bytes a batch carries must be exactly the SDK's own; only the number of encodings
changes. If an SDK upgrade changes how `EventDataBatch.add` measures and appends, the count
test fails and the fix must be looked at again (the SDK is pinned in pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from azure.eventhub import EventData, EventDataBatch
from azure.eventhub._pyamqp import _encode, utils

from bridge.sinks.eventhubs import encode_once


def events(count: int) -> Iterator[EventData]:
    for n in range(count):
        event = EventData(f'{{"RecordId": "{n:04d}", "VmId": "vm-{n % 3}"}}' + "x" * (n * 37))
        event.content_type = "application/json"
        event.properties = {"RecordType": "Event", "SchemaVersion": 1, "N": n}
        yield event


def batch_bytes(batch: EventDataBatch) -> list[bytes]:
    return [bytes(part) for part in batch._message[5]]  # the encoded events it will send


def encoded(message: Any) -> bytes:
    """`message` encoded anew by the SDK's own encoder."""
    buffer = bytearray()
    _encode.encode_payload(buffer, message)
    return bytes(buffer)


@pytest.fixture
def encodings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the SDK's event encodings from here on, whoever asks for them."""
    calls: list[int] = []
    original = _encode.encode_payload

    def counted(output: bytearray, message: Any) -> Any:
        calls.append(1)
        return original(output, message)

    monkeypatch.setattr("azure.eventhub._pyamqp._encode.encode_payload", counted)
    monkeypatch.setattr("azure.eventhub._pyamqp.utils.encode_payload", counted)
    return calls


def test_each_event_is_encoded_once_as_it_joins_a_batch(encodings: list[int]) -> None:
    encode_once()
    batch = EventDataBatch(max_size_in_bytes=1024 * 1024, partition_key="vm-1")
    encodings.clear()  # the batch measured its own empty envelope
    for event in events(40):
        batch.add(event)
    assert len(encodings) == 40
    assert len(batch) == 40


def test_the_batch_carries_the_sdks_own_bytes_for_every_event() -> None:
    encode_once()
    batch = EventDataBatch(max_size_in_bytes=1024 * 1024, partition_key="vm-1")
    for event in events(40):
        batch.add(event)
    # The partition key was set on each message before it was measured, so a stale
    # encoding would lack it: encoding anew must give the very same bytes.
    held = [event for event in batch._internal_events if isinstance(event, EventData)]
    sent = [encoded(event._message) for event in held]
    assert len(sent) == 40
    assert batch_bytes(batch) == sent
    assert all(b"vm-1" in part for part in batch_bytes(batch))


def test_a_full_batch_still_refuses_the_event_that_does_not_fit() -> None:
    encode_once()
    batch = EventDataBatch(max_size_in_bytes=2000)
    added = 0
    for event in events(100):
        try:
            batch.add(event)
        except ValueError as err:
            assert "size limit" in str(err)  # noqa: PT017
            break
        added += 1
    assert 0 < added < 100
    assert len(batch_bytes(batch)) == added
    assert batch.size_in_bytes <= 2000


def test_an_append_without_its_measure_encodes_the_message_itself() -> None:
    encode_once()
    measured, other = (EventDataBatch()._amqp_transport.to_outgoing_amqp_message(
        e.raw_amqp_message) for e in events(2))  # fmt: skip
    utils.get_message_encoded_size(measured)  # type: ignore[no-untyped-call]
    target: list[Any] = [None, None, None, None, None, []]
    utils.add_batch(target, other)  # type: ignore[no-untyped-call]  # not the one measured
    assert target[5] == [encoded(other)]
