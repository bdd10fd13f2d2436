"""The Event Hubs test broker, driven by the real azure-eventhub SDK (synchronous API).

Each SDK client needs about half a second to connect (the SDK polls in 50 ms steps) and a
consumer about 1.5 s before its first event, so the tests share clients where they can.
"""

from __future__ import annotations

import gc
import json
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
import requests
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient
from azure.eventhub.exceptions import AuthenticationError, ConnectError, EventDataSendError

from bridge.sinks.eventhubs_https import sas_token
from tests.doubles import eventhubs_amqp, eventhubs_rest
from tests.doubles.eventhubs_amqp import AMQP_HEADER, SASL_HEADER
from tests.doubles.eventhubs_broker import (
    INTERNAL_ERROR,
    SERVER_BUSY,
    UNAUTHORIZED,
    EventHubsBroker,
)
from tests.support.wait import eventually

# Small retries: the SDK's defaults (3 retries, 0.8 s exponential backoff) make failures slow.
FAST: dict[str, Any] = {"retry_total": 1, "retry_backoff_factor": 0.01, "retry_backoff_max": 0.05}
NO_RETRY: dict[str, Any] = {**FAST, "retry_total": 0}


@pytest.fixture
def broker() -> Iterator[EventHubsBroker]:
    with EventHubsBroker(hub="hub", partitions=4) as running:
        yield running


@pytest.fixture
def producer(broker: EventHubsBroker) -> Iterator[EventHubProducerClient]:
    client = EventHubProducerClient.from_connection_string(broker.connection_string, **FAST)
    with client:
        yield client


def record(n: int, vm: str) -> EventData:
    event = EventData(json.dumps({"RecordId": f"{vm}-{n}", "N": n}))
    event.properties = {"RecordType": "Event", "N": n, "Raw": b"\x00\x01"}
    event.content_type = "application/json"
    return event


def send(producer: EventHubProducerClient, events: list[EventData], **where: Any) -> None:
    batch = producer.create_batch(**where)
    for event in events:
        batch.add(event)
    producer.send_batch(batch)


def receive(
    broker: EventHubsBroker,
    partition: str,
    starting_position: str | int | datetime,
    count: int,
    *,
    inclusive: bool = False,
    prefetch: int = 300,
    first: threading.Event | None = None,
) -> list[EventData]:
    """Events from one partition through EventHubConsumerClient.receive_batch, until `count`
    have arrived (or 15 s have passed: then the caller's assertion shows what is missing)."""
    client = EventHubConsumerClient.from_connection_string(
        broker.connection_string, consumer_group="$Default", **FAST
    )
    received: list[EventData] = []
    errors: list[Exception] = []

    def on_batch(_context: Any, events: list[EventData]) -> None:
        received.extend(events)
        if first is not None and received:
            first.set()
        if len(received) >= count:
            client.close()

    def on_error(_context: Any, error: Exception) -> None:
        errors.append(error)

    deadline = threading.Timer(15, client.close)
    deadline.start()
    try:
        client.receive_batch(
            on_event_batch=on_batch,
            on_error=on_error,
            partition_id=partition,
            starting_position=starting_position,
            starting_position_inclusive=inclusive,
            max_wait_time=0.2,
            prefetch=prefetch,
        )
    finally:
        deadline.cancel()
        client.close()
    assert not errors
    return received


def in_threads(*calls: Any) -> list[Any]:
    """Run (function, args, kwargs) calls concurrently: consumers spend their time waiting."""
    results: list[Any] = [None] * len(calls)
    failures: list[BaseException] = []

    def run(index: int, call: Any) -> None:
        function, args, kwargs = call
        try:
            results[index] = function(*args, **kwargs)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return results


# azure-eventhub 5.15.1 drops the socket of a connection that broke (here: the broker stopped)
# without closing it. The garbage collector then warns whenever it runs: an error under
# filterwarnings=error. A test that breaks connections ignores the warning while it runs and
# collects before it ends, so that the warning cannot land in a later test.
SDK_LEAKS_BROKEN_SOCKETS = pytest.mark.filterwarnings("ignore:unclosed <socket:ResourceWarning")


# --- management and sending -----------------------------------------------------------------


def test_properties_as_the_sdk_reads_them(
    broker: EventHubsBroker, producer: EventHubProducerClient
) -> None:
    hub = producer.get_eventhub_properties()
    assert hub["eventhub_name"] == "hub"
    assert hub["partition_ids"] == ["0", "1", "2", "3"]
    assert isinstance(hub["created_at"], datetime)

    empty = producer.get_partition_properties("2")
    assert empty["id"] == "2"
    assert empty["is_empty"] is True
    assert empty["last_enqueued_sequence_number"] == -1

    send(producer, [record(0, "a"), record(1, "a")], partition_id="2")
    stored = broker.events("2")
    after = producer.get_partition_properties("2")
    assert after["is_empty"] is False
    assert after["beginning_sequence_number"] == 0
    assert after["last_enqueued_sequence_number"] == 1
    assert after["last_enqueued_offset"] == stored[-1].offset
    assert after["last_enqueued_time_utc"] == stored[-1].enqueued_time

    # Every connection authenticated through $cbs with a valid SAS token for the hub.
    assert broker.tokens
    assert {t.audience for t in broker.tokens} == {f"sb://127.0.0.1:{broker.port}/hub"}
    assert {t.status for t in broker.tokens} == {202}
    assert all(t.token.startswith("SharedAccessSignature ") for t in broker.tokens)
    assert "SharedAccessSignature" not in repr(broker.tokens)


def test_batches_are_routed_by_partition_key_and_kept_exactly(
    broker: EventHubsBroker, producer: EventHubProducerClient
) -> None:
    for n in range(3):
        send(producer, [record(n, "vm-a")], partition_key="vm-a")
        send(producer, [record(n, "vm-b"), record(n + 10, "vm-b")], partition_key="vm-b")
    send(producer, [record(0, "any")])  # no key: round robin
    send(producer, [record(0, "p3")], partition_id="3")

    a = [e for e in broker.events() if e.partition_key == "vm-a"]
    b = [e for e in broker.events() if e.partition_key == "vm-b"]
    assert len({e.partition for e in a}) == 1  # one key, one partition
    assert len({e.partition for e in b}) == 1
    assert [json.loads(e.body)["N"] for e in a] == [0, 1, 2]
    assert [json.loads(e.body)["N"] for e in b] == [0, 10, 1, 11, 2, 12]
    assert broker.events("3")[-1].body == b'{"RecordId": "p3-0", "N": 0}'
    assert len(broker.events()) == 11

    first = a[0]
    assert first.body == b'{"RecordId": "vm-a-0", "N": 0}'
    assert first.application_properties == {"RecordType": "Event", "N": 0, "Raw": b"\x00\x01"}
    assert first.content_type == "application/json"
    assert first.properties["content_type"] == "application/json"
    assert first.annotations == {"x-opt-partition-key": "vm-a"}
    for partition in broker.partition_ids:  # offsets grow, sequence numbers count from 0
        events = broker.events(partition)
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert [int(e.offset) for e in events] == sorted({int(e.offset) for e in events})


def test_a_batch_at_the_size_limit_arrives_whole(
    broker: EventHubsBroker, producer: EventHubProducerClient
) -> None:
    batch = producer.create_batch(partition_key="big")
    assert batch.max_size_in_bytes == 1024 * 1024  # what the broker advertised on the link
    with pytest.raises(ValueError, match="too large"):
        producer.create_batch(max_size_in_bytes=1024 * 1024 + 1)
    bodies = [b"%06d" % n + b"x" * 10_000 for n in range(104)]
    for body in bodies:
        batch.add(EventData(body))
    with pytest.raises(ValueError, match="size limit"):  # full
        batch.add(EventData(b"x" * 10_000))
    assert batch.size_in_bytes > 1024 * 1024 - 10_100
    producer.send_batch(batch)  # some 16 transfer frames of 64 KiB

    # One event as big as a batch can hold: delivered to a consumer in more than one frame.
    single = producer.create_batch(partition_id="0")
    size = single.max_size_in_bytes
    while True:
        try:
            single.add(EventData(b"q" * size))
            break
        except ValueError:
            size -= 8
    producer.send_batch(single)

    partition = broker.events()[0].partition
    assert [e.body for e in broker.events(partition)] == bodies
    assert broker.events("0")[-1].body == b"q" * size

    received, (largest,) = in_threads(
        (receive, (broker, partition, "-1", len(bodies)), {"prefetch": 10}),
        (receive, (broker, "0", broker.events("0")[-1].offset, 1), {"inclusive": True}),
    )
    assert [e.body_as_str().encode() for e in received] == bodies  # in order, within credit
    assert largest.body_as_str() == "q" * size


# --- receiving ------------------------------------------------------------------------------


def test_consumers_read_from_the_position_they_ask_for(
    broker: EventHubsBroker, producer: EventHubProducerClient
) -> None:
    send(producer, [record(n, "vm") for n in range(3)], partition_key="vm")
    time.sleep(0.01)  # a later enqueued time for the second batch
    send(producer, [record(n, "vm") for n in range(3, 5)], partition_key="vm")
    stored = broker.events()
    partition = stored[0].partition
    assert [e.partition for e in stored] == [partition] * 5

    everything, after_offset, from_sequence, after_time = in_threads(
        (receive, (broker, partition, "-1", 5), {}),
        (receive, (broker, partition, stored[1].offset, 3), {}),
        (receive, (broker, partition, 3, 2), {"inclusive": True}),
        (receive, (broker, partition, stored[2].enqueued_time, 2), {}),
    )

    assert [e.body_as_str() for e in everything] == [e.body.decode() for e in stored]
    assert [e.offset for e in after_offset] == [e.offset for e in stored[2:]]
    assert [e.sequence_number for e in from_sequence] == [3, 4]
    assert [e.sequence_number for e in after_time] == [3, 4]

    event, expected = everything[0], stored[0]
    assert event.properties == {b"RecordType": b"Event", b"N": 0, b"Raw": b"\x00\x01"}
    assert event.content_type == "application/json"
    assert event.partition_key == b"vm"
    assert event.offset == expected.offset
    assert event.sequence_number == expected.sequence_number
    assert event.enqueued_time == expected.enqueued_time
    assert event.enqueued_time is not None
    assert event.enqueued_time.tzinfo == timezone.utc


def test_a_consumer_gets_events_sent_while_it_listens(
    broker: EventHubsBroker, producer: EventHubProducerClient
) -> None:
    send(producer, [record(0, "live")], partition_id="1")
    listening = threading.Event()
    result: list[list[EventData]] = []
    consumer = threading.Thread(
        target=lambda: result.append(receive(broker, "1", "-1", 4, first=listening))
    )
    consumer.start()
    try:
        assert listening.wait(10)
        send(producer, [record(1, "live"), record(2, "live")], partition_id="1")
        send(producer, [record(3, "live")], partition_id="1")
    finally:
        consumer.join()
    assert [json.loads(e.body_as_str())["N"] for e in result[0]] == [0, 1, 2, 3]


def test_an_event_sent_over_rest_reaches_a_listening_receiver_at_once(
    broker: EventHubsBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The REST send's events are AMQP messages to a receiver, handed over when stored: with
    the connections' idle look slowed to a minute, only the wake-up delivers within 15 s."""
    monkeypatch.setattr(eventhubs_amqp, "_POLL", 60.0)
    listening = threading.Event()
    result: list[list[EventData]] = []
    partition = broker.partition_ids[zlib.crc32(b"vm-rest") % len(broker.partition_ids)]
    url = f"http://127.0.0.1:{broker.port}/hub/messages"
    token = sas_token(url.removesuffix("/messages"), broker.key_name, broker.key, 2**31)

    def post(*numbers: int) -> None:
        items = [
            {
                "Body": json.dumps({"N": n}),
                "UserProperties": {"RecordType": "Event", "N": n},
                "BrokerProperties": {"PartitionKey": "vm-rest"},
            }
            for n in numbers
        ]
        headers = {"Authorization": token, "Content-Type": eventhubs_rest.BATCH_TYPE}
        answer = requests.post(url, data=json.dumps(items), headers=headers, timeout=10)
        assert answer.status_code == 201, answer.text

    post(0)
    consumer = threading.Thread(
        target=lambda: result.append(receive(broker, partition, "-1", 3, first=listening))
    )
    consumer.start()
    try:
        assert listening.wait(10)
        post(1, 2)
    finally:
        consumer.join()
    assert [json.loads(e.body_as_str())["N"] for e in result[0]] == [0, 1, 2]
    assert result[0][1].properties == {b"RecordType": b"Event", b"N": 1}
    assert result[0][1].partition_key == b"vm-rest"


def test_only_a_producers_connection_counts_as_a_senders(
    broker: EventHubsBroker, producer: EventHubProducerClient
) -> None:
    send(producer, [record(0, "one")], partition_id="2")
    listening = threading.Event()
    counts: list[tuple[int, int]] = []

    consumer = threading.Thread(target=lambda: receive(broker, "2", "-1", 2, first=listening))
    consumer.start()
    try:
        assert listening.wait(10)
        counts.append((broker.connection_count, broker.sender_connection_count))
        send(producer, [record(1, "one")], partition_id="2")
    finally:
        consumer.join()
    [(connections, senders)] = counts
    assert senders >= 1  # the producer client's (one per partition it has sent to)
    assert connections - senders == 1  # the consumer's: it receives, it sends nothing


# --- failures -------------------------------------------------------------------------------


@SDK_LEAKS_BROKEN_SOCKETS
def test_an_outage_fails_sends_and_a_restart_on_the_same_port_keeps_the_events(
    broker: EventHubsBroker,
) -> None:
    producer = EventHubProducerClient.from_connection_string(broker.connection_string, **FAST)
    try:
        with producer:
            send(producer, [record(0, "vm")], partition_id="0")
            port, connection_string = broker.port, broker.connection_string

            broker.stop()
            assert broker.connection_count == 0
            started = time.monotonic()
            with pytest.raises(ConnectError, match="Connection refused"):
                send(producer, [record(1, "vm")], partition_id="0")
            assert time.monotonic() - started < 5

            broker.start()
            assert (broker.port, broker.connection_string) == (port, connection_string)
            send(producer, [record(2, "vm")], partition_id="0")  # the same client reconnects
    finally:
        del producer
        gc.collect()

    assert [json.loads(e.body)["N"] for e in broker.events("0")] == [0, 2]
    received = receive(broker, "0", "-1", 2)
    assert [json.loads(e.body_as_str())["N"] for e in received] == [0, 2]


@pytest.mark.parametrize(
    ("condition", "error"),
    [(SERVER_BUSY, "server-busy"), (INTERNAL_ERROR, "internal-error")],
)
def test_a_retryable_rejection_is_retried_once_by_the_producer_client(
    broker: EventHubsBroker, producer: EventHubProducerClient, condition: str, error: str
) -> None:
    broker.fail_sends(1, condition)
    send(producer, [record(0, "vm")])  # the client rebuilds its producer and sends again
    assert len(broker.events()) == 1

    broker.fail_sends(2, condition)
    with pytest.raises(EventDataSendError) as caught:
        send(producer, [record(1, "vm")])
    assert caught.value.error == error  # the AMQP condition after its namespace
    assert len(broker.events()) == 1

    send(producer, [record(2, "vm")])
    assert len(broker.events()) == 2


def test_an_unauthorized_rejection_is_an_event_data_send_error(
    broker: EventHubsBroker, producer: EventHubProducerClient
) -> None:
    broker.fail_sends(2, UNAUTHORIZED)
    with pytest.raises(EventDataSendError) as caught:
        send(producer, [record(0, "vm")])
    assert not isinstance(caught.value, AuthenticationError)
    assert caught.value.error == "unauthorized-access"
    assert broker.events() == []


def test_a_refused_token_is_an_authentication_error(broker: EventHubsBroker) -> None:
    wrong = broker.connection_string.replace("SharedAccessKey=SAS_KEY_VALUE", "SharedAccessKey=x")
    for connection_string, rejections in ((wrong, 0), (broker.connection_string, 10)):
        broker.reject_tokens(rejections)
        producer = EventHubProducerClient.from_connection_string(connection_string, **NO_RETRY)
        with producer, pytest.raises(AuthenticationError, match="401"):
            send(producer, [record(0, "vm")])
    assert issubclass(AuthenticationError, ConnectError)
    assert broker.events() == []
    assert {t.status for t in broker.tokens} == {401}


def test_a_message_over_the_limit_is_refused(
    broker: EventHubsBroker, producer: EventHubProducerClient
) -> None:
    with pytest.raises(ValueError, match="size limit"):
        producer.create_batch().add(EventData(b"x" * 1024 * 1024))
    with pytest.raises(ValueError, match="exceeds the Event Hub frame size limit"):
        producer.send_batch([EventData(b"x" * 1024 * 1024)])
    with pytest.raises(EventDataSendError) as caught:  # send_event has no client-side check
        producer.send_event(EventData(b"x" * 1024 * 1024))
    assert caught.value.error == "link:message-size-exceeded"
    assert broker.events() == []


def test_an_unknown_event_hub_or_partition_is_not_found(broker: EventHubsBroker) -> None:
    other = broker.connection_string.replace("EntityPath=hub", "EntityPath=other")
    producer = EventHubProducerClient.from_connection_string(other, **NO_RETRY)
    with producer, pytest.raises(ConnectError) as caught:
        send(producer, [record(0, "vm")])
    assert caught.value.error == "not-found"
    assert "could not be found" in str(caught.value)
    producer = EventHubProducerClient.from_connection_string(broker.connection_string, **NO_RETRY)
    with producer, pytest.raises(ConnectError) as caught:
        producer.get_partition_properties("9")
    assert caught.value.error == "not-found"
    assert "The partition '9' of 'hub' could not be found." in str(caught.value)


def test_garbage_and_broken_clients_do_not_hurt_the_broker(
    broker: EventHubsBroker, producer: EventHubProducerClient
) -> None:
    def raw(data: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
            return answer

    # Not AMQP: the REST side's, which sends only (then the client closes).
    assert raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 501")
    assert b"400" in raw(b"\x00\xff garbage\r\n\r\n")  # an HTTP/0.9 error page
    frame_too_big = struct.pack(">IBBH", 2**31, 2, 0, 0)
    assert raw(AMQP_HEADER + frame_too_big) == AMQP_HEADER
    nonsense = struct.pack(">IBBH", 16, 2, 0, 0) + b"\x00\x53\x10\xff\xff\xff\xff\xff"
    assert raw(AMQP_HEADER + nonsense) == AMQP_HEADER
    assert raw(SASL_HEADER + struct.pack(">IBBH", 100, 2, 1, 0) + b"\x00\x53")  # cut mid-frame
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
        sock.sendall(SASL_HEADER[:5])  # and hang up

    send(producer, [record(0, "vm")])
    assert len(broker.events()) == 1
    eventually(lambda: broker.connection_count <= 1)  # the producer's own
