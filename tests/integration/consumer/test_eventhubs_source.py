"""run_eventhubs against the Event Hubs test broker and Azurite, through the real SDKs.

Records go in through the real EventHubsSink; checkpoints and partition ownership land in an
Azurite blob container, one per test.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.eventhub import EventData, EventHubProducerClient
from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore

from bridge.config import Config, ConfigError, ConsumerSettings, EventHubsSettings, StorageSettings
from bridge.consumer.reading import Position
from bridge.consumer.sources.eventhubs import checkpoint_store, run_eventhubs
from bridge.retry import Backoff, RetryableError, ThrottledError
from bridge.sinks import SpooledRecord
from bridge.sinks.eventhubs import EventHubsSink
from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.support.azurite import Azurite
from tests.support.wait import eventually

HUB = "records"
LOAD_BALANCING = 1.0  # seconds: the test consumers' load-balancing interval
GROUP = "$Default"


@pytest.fixture
def config(broker: EventHubsBroker, azurite: Azurite) -> Config:
    return Config(
        eventhubs=EventHubsSettings(connection_string=broker.connection_string),
        storage=StorageSettings(connection_string=azurite.connection_string),
        consumer=ConsumerSettings(checkpoint_container=f"cp-{uuid.uuid4().hex[:16]}"),
    )


@pytest.fixture
def store(config: Config) -> BlobCheckpointStore:
    return checkpoint_store(config)


def send(config: Config, seqs: range, vms: int = 8) -> list[str]:
    """Records n of `seqs` for VM n % vms through the agent's sink: their RecordIds."""
    batch = []
    for n in seqs:
        body = {"RecordId": f"r{n}", "VmId": f"vm-{n % vms}", "SchemaVersion": 1, "N": n}
        batch.append(SpooledRecord(n, f"r{n}", "Event", json.dumps(body)))
    sink = EventHubsSink(config.eventhubs, config.identity)
    try:
        sink.send(batch)
    finally:
        sink.close()
    return [record.record_id for record in batch]


def namespace(broker: EventHubsBroker) -> str:
    # What the SDK names the namespace of Endpoint=sb://127.0.0.1:PORT in checkpoint blobs.
    return f"{broker.host}:{broker.port}"


def checkpoints(store: BlobCheckpointStore, broker: EventHubsBroker) -> dict[str, int]:
    """Checkpointed sequence number by partition (none before the container exists)."""
    try:
        found = store.list_checkpoints(namespace(broker), HUB, GROUP)
    except ResourceNotFoundError:
        return {}
    return {c["partition_id"]: int(c["sequence_number"]) for c in found}


def last_sequence_numbers(broker: EventHubsBroker) -> dict[str, int]:
    return {
        p: events[-1].sequence_number for p in broker.partition_ids if (events := broker.events(p))
    }


class Consumer:
    """run_eventhubs in a thread with short waits, recording what it hands over."""

    def __init__(
        self,
        config: Config,
        handler: Callable[[list[dict[str, Any]]], None] | None = None,
        *,
        checkpoint_interval: float = 0.0,
        ownership_expiration: float | None = None,
    ) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.positions: list[Position] = []
        self.poisoned: list[tuple[str, str, str, str]] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self._config, self._handler = config, handler
        self._checkpoint_interval = checkpoint_interval
        self._ownership_expiration = ownership_expiration
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            run_eventhubs(
                self._config,
                self._handle,
                self.stop,
                poison=lambda *args: self.poisoned.append(args),
                max_wait_time=0.2,
                load_balancing_interval=LOAD_BALANCING,
                ownership_expiration=self._ownership_expiration,
                checkpoint_interval=self._checkpoint_interval,
                backoff_factory=lambda: Backoff(initial=0.05, maximum=0.1),
            )
        except BaseException as err:
            self.errors.append(err)
            raise

    def _handle(self, records: list[dict[str, Any]], position: Position) -> None:
        self.positions.append(position)
        if not records:
            return  # only how far a partition was read
        self.batches.append(records)
        if self._handler is not None:
            self._handler(records)

    @property
    def ids(self) -> list[str]:
        return [record["RecordId"] for batch in self.batches for record in batch]

    def __enter__(self) -> Consumer:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        started = time.monotonic()
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "run_eventhubs did not stop"
        assert not self.errors
        self.stopped_in = time.monotonic() - started


def test_every_record_is_handed_over_in_order_and_checkpointed(
    config: Config, broker: EventHubsBroker, store: BlobCheckpointStore
) -> None:
    sent = send(config, range(1, 41))
    with Consumer(config) as consumer:
        eventually(lambda: sorted(consumer.ids) == sorted(sent))
        eventually(lambda: checkpoints(store, broker) == last_sequence_numbers(broker))

    assert len(last_sequence_numbers(broker)) == 4  # the records really used every partition
    handled = [record for batch in consumer.batches for record in batch]
    for vm in range(8):
        mine = [r["N"] for r in handled if r["VmId"] == f"vm-{vm}"]
        assert mine == [n for n in range(1, 41) if n % 8 == vm]
    assert consumer.poisoned == []
    assert consumer.stopped_in < 10


def test_each_partition_is_said_read_to_its_end_once_its_last_event_is_handled(
    config: Config, broker: EventHubsBroker
) -> None:
    sent = send(config, range(1, 41))
    newest = {f"{namespace(broker)}/{HUB}/{p}": broker.events(p)[-1].enqueued_time
              for p in broker.partition_ids}  # fmt: skip

    def read_to_end(consumer: Consumer) -> bool:
        # Later than its last event: only the question to the idle partition says so.
        found = {p.partition for p in consumer.positions
                 if p.caught_up is not None and p.caught_up > newest[p.partition]}  # fmt: skip
        return found == newest.keys()

    with Consumer(config) as consumer:
        eventually(lambda: sorted(consumer.ids) == sorted(sent))
        eventually(lambda: read_to_end(consumer))
    now = datetime.now(timezone.utc)
    # A batch is read up to its newest event, no further.
    for position in consumer.positions:
        assert position.caught_up is not None
        assert newest[position.partition] - timedelta(minutes=1) < position.caught_up < now


def test_an_empty_partition_is_read_to_its_end(config: Config, broker: EventHubsBroker) -> None:
    sent = send(config, range(1, 4), vms=1)
    busy = broker.events()[0].partition
    empty = {f"{namespace(broker)}/{HUB}/{p}" for p in broker.partition_ids if p != busy}
    with Consumer(config) as consumer:
        eventually(lambda: sorted(consumer.ids) == sorted(sent))
        eventually(lambda: empty <= {p.partition for p in consumer.positions if p.caught_up})


def test_a_partition_held_back_is_read_only_up_to_what_was_handled(
    config: Config, broker: EventHubsBroker
) -> None:
    # Its receiver gets nothing (a link that is stuck or slow): the consumer keeps asking the
    # idle partition for its last event, which it has not handled: no mark past what it read.
    first = send(config, range(1, 3), vms=1)
    partition = broker.events()[0].partition
    name = f"{namespace(broker)}/{HUB}/{partition}"
    with Consumer(config) as consumer:
        eventually(lambda: sorted(consumer.ids) == sorted(first))
        broker.hold(partition)
        later = send(config, range(3, 5), vms=1)
        held_at, asked = datetime.now(timezone.utc), broker.partition_reads[partition]
        eventually(lambda: broker.partition_reads[partition] >= asked + 2)  # asked while held
        ours = [p.caught_up for p in consumer.positions if p.partition == name and p.caught_up]
        assert max(ours) < held_at  # nothing vouched for past the hold
        broker.release(partition)
        eventually(lambda: sorted(consumer.ids) == sorted(first + later))
        eventually(lambda: any(p.partition == name and p.caught_up and p.caught_up > held_at
                             for p in consumer.positions))  # fmt: skip


def test_a_second_run_resumes_after_the_checkpoints(
    config: Config, broker: EventHubsBroker, store: BlobCheckpointStore
) -> None:
    first_sent = send(config, range(1, 13))
    with Consumer(config) as first:
        eventually(lambda: sorted(first.ids) == sorted(first_sent))
        eventually(lambda: checkpoints(store, broker) == last_sequence_numbers(broker))
    second_sent = send(config, range(13, 19))
    with Consumer(config) as second:
        eventually(lambda: sorted(second.ids) == sorted(second_sent))
        time.sleep(1.5)  # anything handed over again would have arrived by now
    assert sorted(second.ids) == sorted(second_sent)


def test_a_failing_batch_is_retried_in_the_callback_and_checkpointed_after_success(
    config: Config,
    broker: EventHubsBroker,
    store: BlobCheckpointStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="bridge.consumer.sources.eventhubs")
    sent = send(config, range(1, 6), vms=1)
    partition = broker.events()[0].partition
    seen: list[dict[str, int]] = []

    def fail_twice(_records: list[dict[str, Any]]) -> None:
        seen.append(checkpoints(store, broker))
        if len(seen) <= 2:
            raise (RetryableError if len(seen) == 1 else ThrottledError)("state store busy")

    with Consumer(config, fail_twice) as consumer:
        eventually(lambda: checkpoints(store, broker).get(partition) == 4)

    batches = [[r["RecordId"] for r in batch] for batch in consumer.batches]
    # The failing batch is handed over again as it was until it succeeds (how many records
    # the SDK put in it depends on when their frames came in), then the rest, each once.
    assert batches[0] == batches[1] == batches[2]
    assert [record for batch in batches[2:] for record in batch] == sent
    assert seen[:3] == [{}, {}, {}]  # nothing checkpointed while it failed
    # Retried inside the callback: had it raised, the SDK would have dropped the partition
    # (OWNERSHIP_LOST) and read it again from the checkpoint a load-balancing cycle later.
    closes = [r.getMessage() for r in caplog.records if "stopped reading" in r.getMessage()]
    assert closes
    assert all("SHUTDOWN" in message for message in closes)


def test_a_stop_during_retries_checkpoints_nothing_and_the_next_run_gets_the_batch(
    config: Config, broker: EventHubsBroker, store: BlobCheckpointStore
) -> None:
    sent = send(config, range(1, 4), vms=1)

    def always_fails(_records: list[dict[str, Any]]) -> None:
        raise RetryableError("state store down")

    with Consumer(config, always_fails) as failing:
        eventually(lambda: len(failing.batches) >= 3)
    assert checkpoints(store, broker) == {}
    assert failing.stopped_in < 10
    with Consumer(config) as working:
        eventually(lambda: working.ids == sent)


def test_checkpoints_held_back_by_the_interval_are_written_at_shutdown(
    config: Config, broker: EventHubsBroker, store: BlobCheckpointStore
) -> None:
    first = send(config, range(1, 4), vms=1)
    partition = broker.events()[0].partition
    with Consumer(config, checkpoint_interval=3600) as consumer:
        eventually(lambda: consumer.ids == first)
        # The first batch's checkpoint is written at once (the SDK may have handed r1-r3 over
        # in one batch or more: up to its last record), the next ones held back.
        eventually(lambda: partition in checkpoints(store, broker))
        held = checkpoints(store, broker)[partition]
        assert held <= 2
        second = send(config, range(4, 7), vms=1)
        eventually(lambda: consumer.ids == first + second)
        # The partition's batches are handed over one after the other: once a later one is,
        # the second one's checkpoint, had it been written per batch, would be there.
        later = send(config, range(7, 8), vms=1)
        eventually(lambda: consumer.ids == first + second + later)
        assert checkpoints(store, broker) == {partition: held}
    assert checkpoints(store, broker) == {partition: 6}


# Records as vm-1 sends them: the consumer refuses a VmId other than the partition key.
R1 = '{"RecordId": "r1", "VmId": "vm-1"}'
R2 = '{"RecordId": "r2", "VmId": "vm-1"}'


def test_an_event_that_is_not_a_record_goes_to_the_poison_callback(
    config: Config, broker: EventHubsBroker, store: BlobCheckpointStore
) -> None:
    producer = EventHubProducerClient.from_connection_string(config.eventhubs.connection_string)
    with producer:
        batch = producer.create_batch(partition_key="vm-1")
        for body in (R1, "not json", b"\xff\xfe", R2):
            batch.add(EventData(body))
        producer.send_batch(batch)
    events = broker.events()
    with Consumer(config) as consumer:
        eventually(lambda: consumer.ids == ["r1", "r2"])
        eventually(lambda: checkpoints(store, broker) == {events[0].partition: 3})

    partition = events[0].partition
    assert [p[:3] for p in consumer.poisoned] == [
        (partition, events[1].offset, "not json"),
        (partition, events[2].offset, "\\xff\\xfe"),  # the bytes stay visible
    ]
    assert all("not JSON" in p[3] for p in consumer.poisoned)


def test_missing_checkpoint_storage_is_a_config_error(broker: EventHubsBroker) -> None:
    config = Config(eventhubs=EventHubsSettings(connection_string=broker.connection_string))
    with pytest.raises(ConfigError, match=r"storage\.account"):
        run_eventhubs(config, lambda _records, _position: None, threading.Event())


def test_two_consumers_share_the_partitions_and_lose_nothing(
    config: Config, broker: EventHubsBroker, store: BlobCheckpointStore
) -> None:
    # Ownership lasts 30 s, not the SDK's 6 load-balancing intervals: on a loaded machine a
    # consumer that misses renewing for 6 s loses its partitions to the other, which is the
    # SDK's business, not what this test is about.
    with (
        Consumer(config, ownership_expiration=30) as one,
        Consumer(config, ownership_expiration=30) as two,
    ):
        # A consumer whose partition the other claimed reads it on until its next
        # load-balancing cycle (1 s here): the split must have held for a few cycles before
        # the records go in, or the one letting go may take the first of them (seen beside
        # four CPU-bound loops: r2 at one consumer, the rest of its VM's records at the other).
        since: dict[str, float] = {}  # the split, as text -> when it was first seen

        def balanced() -> bool:
            try:
                found = store.list_ownership(namespace(broker), HUB, GROUP)
            except ResourceNotFoundError:  # the consumers have not created the container yet
                return False
            owners = [o["owner_id"] for o in found if o["owner_id"]]
            split = repr(sorted((o["partition_id"], o["owner_id"]) for o in found))
            if len(owners) != 4 or sorted(owners.count(o) for o in set(owners)) != [2, 2]:
                return False
            if split not in since:
                since.clear()
                since[split] = time.monotonic()
            return time.monotonic() - since[split] >= 5 * LOAD_BALANCING

        eventually(balanced, timeout=90)
        sent = send(config, range(1, 81), vms=16)
        eventually(lambda: set(one.ids) | set(two.ids) == set(sent))

    assert one.ids, "the first consumer took no part"
    assert two.ids, "the second consumer took no part"
    # Each partition went to one of them, so each VM's records stayed with one, in order.
    for consumer in (one, two):
        for vm in {int(i[1:]) % 16 for i in consumer.ids}:
            mine = [int(i[1:]) for i in consumer.ids if int(i[1:]) % 16 == vm]
            assert mine == [n for n in range(1, 81) if n % 16 == vm]


def test_a_store_without_its_private_container_client_takes_the_deployed_container(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The private attribute is read, never required: a checkpointstoreblob release without it
    must not stop the consumer (the container comes from infra/)."""
    from bridge.consumer.sources.eventhubs import _ensure_container

    config = Config(consumer=ConsumerSettings(checkpoint_container="checkpoints"))
    caplog.set_level(logging.INFO, logger="bridge")
    store: Any = object()
    assert _ensure_container(store, config, threading.Event(), Backoff()) is True
    assert "taken as created by the deployment" in caplog.text
