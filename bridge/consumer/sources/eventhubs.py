"""The consumer's reader of Azure Event Hubs: batches of records to a handler, checkpoints in blobs.

`run_eventhubs` runs one azure-eventhub EventHubConsumerClient with a BlobCheckpointStore, so
several consumers (processes or machines) in one consumer group share the partitions: the SDK
balances them through ownership blobs in the checkpoint container.

What the SDK does not do for us, and this module does:
- It never hands a batch again when the callback raises (it drops the partition's consumer
  and carries on), so a failed batch is retried inside the callback until it succeeds or the
  consumer stops, and the checkpoint moves only after the handler returned.
- Its receive loop serves every partition in one thread: while a batch is being retried the
  other partitions wait too. That is the price of never skipping a batch.
- It stops only when `close()` is called: a thread calls it once `stop` is set.

Latency against cost: the SDK serves the partitions in turn, each turn waiting up to its
socket timeout (0.2 s by default) for frames, and holds a batch back until `max_wait_time`
has passed since the last one. Both are short here (SOCKET_TIMEOUT, BATCH_WAIT), because an
approval waits for every step of this path: at 0.05 s and 0.1 s a record waited up to 0.3 s
on 4 partitions (`handover_wait`), 265 ms at the median and 500 ms at p99 in benchmark 3 on a
quiet machine; at 0.01 s and 0.02 s, 55 ms and 100 to 150 ms (issue 35). The price is an idle
consumer's wake-ups: 3.6 % of a core instead of 1.65 % on the test broker (docs/capacity.md).
Checkpoints, on the other hand, are blob writes
billed per request: one per batch would make their cost grow with the fleet's records, so a
partition's checkpoint is written at most every `checkpoint_interval` seconds. A consumer
that takes a partition over reads again at most that much, which the fleet state's
deduplication and the approval ledger make harmless.

How far a partition has been read (bridge/consumer/reading.py): a batch is read up to its
newest event's enqueued time. An empty callback proves nothing (the SDK makes one also while
its link is down or opening), so an idle partition is asked for its last enqueued sequence
number, at most every PROBE_EVERY seconds: if this consumer has handled that event, the
partition was read to its end when the question was asked. That is one management request
per idle partition every few seconds; a busy partition asks nothing. The question is asked
in a thread of its own (`_Prober`) and its answer taken at the partition's next empty
callback: each opens a management link, about 0.5 s, and asked in the SDK's one receive
thread it held every partition's batches back meanwhile (issue 35: an Event record waited
0.4 s for its consumer at the median, 1.3 s at p99). A partition this consumer has handled
no event of since it took it over (after a clean handover, until its next event) is read
to no known point: its VMs' silence waits for that event.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bridge.cloud import identity
from bridge.config import Config, ConfigError
from bridge.consumer.reading import Position, eventhubs_partition
from bridge.consumer.sources.batches import (
    BatchRetry,
    BodyHandler,
    Message,
    PoisonHandler,
    RecordHandler,
    log_poison,
)
from bridge.records import utc_now
from bridge.redact import describe
from bridge.retry import Backoff, FailureStreak

if TYPE_CHECKING:
    from azure.eventhub import CloseReason, EventData, EventHubConsumerClient, PartitionContext
    from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore

log = logging.getLogger(__name__)
# The SDK's wait per partition turn (4 partitions: a 0.04 s round), and how long after its
# last callback a partition's batch is handed over (its empty callbacks come as often).
SOCKET_TIMEOUT = 0.01
BATCH_WAIT = 0.02


def handover_wait(partitions: int) -> float:
    """The longest a record waits in the SDK before it is handed over, on a consumer that reads
    `partitions`: it came just after its partition's turn, and waits for the others' turns
    (each up to SOCKET_TIMEOUT) and for BATCH_WAIT since its partition's last callback."""
    return partitions * SOCKET_TIMEOUT + BATCH_WAIT


PROBE_EVERY = 5.0  # seconds between questions to an idle partition about its last event


def run_eventhubs(
    config: Config,
    handler: RecordHandler,
    stop: threading.Event,
    *,
    poison: PoisonHandler = log_poison,
    batch_size: int = 100,
    max_wait_time: float = BATCH_WAIT,
    load_balancing_interval: float = 10.0,
    ownership_expiration: float | None = None,
    checkpoint_interval: float = 5.0,
    backoff_factory: Callable[[], Backoff] = Backoff,
    on_done: Callable[[str, list[dict[str, object]]], None] | None = None,
    bodies: BodyHandler | None = None,
) -> None:
    """Hand every record of the event hub to `handler`, batch by batch, until `stop` is set.

    Each partition resumes after its checkpoint in `consumer.checkpoint_container` (from the
    start of the hub when it has none). Raises ConfigError at once when settings are missing.
    `bodies`: the messages are not records (Event Grid's hub): their bodies go there.
    """
    store = checkpoint_store(config)
    if not _ensure_container(store, config, stop, backoff_factory()):
        return
    client = _client(config, store, load_balancing_interval, ownership_expiration)
    retry = BatchRetry(
        handler, poison, stop, _describe_hub(config), backoff_factory(), on_done, bodies=bodies
    )
    on_batch = _OnBatch(
        config,
        retry,
        backoff_factory(),
        interval=checkpoint_interval,
        probe=client.get_partition_properties,
    )
    finished = threading.Event()
    closer = threading.Thread(
        target=_close_when_stopped, args=(client, stop, finished), name="se-bridge eventhubs stop"
    )
    closer.start()
    try:
        client.receive_batch(
            on_event_batch=on_batch,
            on_error=_on_error,
            on_partition_initialize=_on_partition_initialize,
            on_partition_close=on_batch.closed,
            max_batch_size=batch_size,
            max_wait_time=max_wait_time,
            starting_position="-1",  # a partition without a checkpoint: from its first event
        )
    finally:
        finished.set()
        closer.join()
        on_batch.close()
        client.close()


def eventgrid_hub(config: Config) -> Config:
    """`config` as it reads Event Grid's hub (eventgrid.hub; its connection string, else
    the records hub's namespace and credentials), in the same consumer group and checkpoint
    container: the SDK keeps each hub's checkpoints and ownership apart by its name."""
    grid = config.eventgrid
    hub = dataclasses.replace(
        config.eventhubs,
        name=grid.hub,
        connection_string=grid.connection_string or config.eventhubs.connection_string,
    )
    return dataclasses.replace(config, eventhubs=hub)


def checkpoint_store(config: Config) -> BlobCheckpointStore:
    """The blob checkpoint store of `config.consumer.checkpoint_container`."""
    from azure.eventhub.extensions.checkpointstoreblob import (  # noqa: PLC0415 - SDK on demand
        BlobCheckpointStore,
    )

    storage, container = config.storage, config.consumer.checkpoint_container
    if storage.connection_string:
        return BlobCheckpointStore.from_connection_string(storage.connection_string, container)
    if storage.account:
        url = f"https://{storage.account}.blob.{storage.endpoint_suffix}"
        return BlobCheckpointStore(url, container, credential=identity.credential(config.identity))
    raise ConfigError(
        "the Event Hubs consumer keeps its checkpoints in blob storage: set storage.account "
        "(Entra ID auth) or storage.connection_string (SE_BRIDGE_STORAGE_ACCOUNT, "
        "SE_BRIDGE_STORAGE_CONNECTION_STRING)"
    )


def _client(
    config: Config,
    store: BlobCheckpointStore,
    load_balancing_interval: float,
    ownership_expiration: float | None = None,
) -> EventHubConsumerClient:
    from azure.eventhub import EventHubConsumerClient  # noqa: PLC0415

    hub = config.eventhubs
    options: dict[str, Any] = {
        "consumer_group": config.consumer.consumer_group,
        "checkpoint_store": store,
        "load_balancing_interval": load_balancing_interval,
        # Greedy: a starting consumer claims every partition it can at once, instead of one
        # per interval, so approvals do not wait for a slow start.
        "load_balancing_strategy": "greedy",
        "logging_enable": False,
        "socket_timeout": SOCKET_TIMEOUT,
    }
    if ownership_expiration is not None:  # else the SDK's: 6 load-balancing intervals
        options["partition_ownership_expiration_interval"] = ownership_expiration
    if hub.connection_string:
        return EventHubConsumerClient.from_connection_string(
            hub.connection_string, eventhub_name=hub.name or None, **options
        )
    if not (hub.namespace and hub.name):
        raise ConfigError(
            "the Event Hubs consumer needs eventhubs.namespace and eventhubs.name (Entra ID "
            "auth), or eventhubs.connection_string (SE_BRIDGE_EVENTHUBS_NAMESPACE, ..._NAME, "
            "..._CONNECTION_STRING)"
        )
    credential = identity.credential(config.identity)
    return EventHubConsumerClient(hub.namespace, hub.name, credential=credential, **options)


def _ensure_container(
    store: BlobCheckpointStore, config: Config, stop: threading.Event, backoff: Backoff
) -> bool:
    """Create the checkpoint container if missing; False if stopped before that worked."""
    from azure.core.exceptions import ResourceExistsError  # noqa: PLC0415

    container = config.consumer.checkpoint_container
    # The store keeps its ContainerClient private (checkpointstoreblob 1.x has no public way to
    # create the container), and a consumer should not need a person to. Read, never patched;
    # a release without it gets the container infra/ creates.
    client: Any = getattr(store, "_container_client", None)
    if client is None:
        log.info(
            "the checkpoint container %s is taken as created by the deployment "
            "(infra/modules/storage.bicep)",
            container,
        )
        return True
    streak = FailureStreak(backoff)
    while not stop.is_set():
        try:
            client.create_container()
        except ResourceExistsError:
            pass
        except Exception as err:  # storage unreachable or refusing: nothing to read without it
            first, delay = streak.failed(err)
            log.log(
                logging.WARNING if first else logging.DEBUG,
                "cannot create or reach the checkpoint container %s: %s; the consumer waits "
                "for it (grant %s the Storage Blob Data Contributor role on the account, or "
                "check storage.connection_string); retrying in %.1f s",
                *(container, describe(err, with_type=True), identity.describe(config.identity)),
                delay,
            )
            stop.wait(delay)
            continue
        return True
    return False


def _close_when_stopped(
    client: EventHubConsumerClient, stop: threading.Event, finished: threading.Event
) -> None:
    while not (stop.wait(0.2) or finished.is_set()):
        pass
    # A close() that lands before receive_batch has registered its processor is lost, so close
    # again until receive_batch has returned.
    while not finished.is_set():
        try:
            client.close()
        except Exception as err:  # closing a broken client: keep trying, receive_batch must end
            log.debug("closing the Event Hubs consumer failed: %s", describe(err))
        finished.wait(1.0)


Answer = tuple[datetime, Mapping[str, Any]]  # when a partition was asked, and what it said


class _Prober:
    """Asks idle partitions for their last enqueued event, each at most every `every`
    seconds, in a thread of its own (`run`); the receive thread only asks for a question
    (`want`) and takes the latest answer (`answer`), never waiting for one."""

    def __init__(
        self,
        ask: Callable[[str], Mapping[str, Any]],
        *,
        every: float = PROBE_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ask, self._every, self._clock = ask, every, clock
        self._changed = threading.Condition()
        self._wanted: dict[str, None] = {}  # partitions to ask, in the order asked for
        self._answers: dict[str, Answer] = {}
        self._asked: dict[str, float] = {}  # partition -> clock of its last question
        self._closed = False

    def want(self, partition: str) -> None:
        """Ask `partition` once its last question is `every` old."""
        with self._changed:
            last = self._asked.get(partition)
            if last is not None and self._clock() - last < self._every:
                return
            self._asked[partition] = self._clock()
            self._wanted[partition] = None
            self._changed.notify()

    def answer(self, partition: str) -> Answer | None:
        """The answer come in since the last call, if any."""
        with self._changed:
            return self._answers.pop(partition, None)

    def forget(self, partition: str) -> None:
        with self._changed:
            self._answers.pop(partition, None)
            self._wanted.pop(partition, None)
            self._asked.pop(partition, None)

    def run(self) -> None:
        """Ask what is wanted until `close`."""
        while self.step(wait=1.0) or not self._closed:
            pass

    def step(self, wait: float = 0.0) -> bool:
        """Ask the first partition wanted (waiting up to `wait` for one): whether one was."""
        with self._changed:
            if not self._wanted and not self._closed:
                self._changed.wait(wait)
            if not self._wanted or self._closed:
                return False
            partition = next(iter(self._wanted))
            del self._wanted[partition]
        asked = utc_now()
        try:
            answer = self._ask(partition)
        except Exception as err:  # asked again at its next idle round; meanwhile no mark moves
            log.debug("asking partition %s for its last event failed: %s", partition, describe(err))
            return True
        with self._changed:
            self._answers[partition] = (asked, answer)
        return True

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()


class _OnBatch:
    """The SDK's on_event_batch callback: hand over, then checkpoint, retrying in place.

    The SDK also calls it with no events once `max_wait_time` passes: that is when a
    handled batch whose checkpoint was held back gets it, once `interval` has passed, and
    when an idle partition is asked whether it has been read to its end (`probe`, the
    client's get_partition_properties, asked by a `_Prober` in a thread of its own; see the
    module's docstring).
    """

    def __init__(
        self,
        config: Config,
        retry: BatchRetry,
        backoff: Backoff,
        *,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
        probe: Callable[[str], Mapping[str, Any]] | None = None,
    ) -> None:
        self._config, self._retry, self._backoff = config, retry, backoff
        self._interval, self._clock = interval, clock
        self._prober = _Prober(probe, clock=clock) if probe is not None else None
        self._asking: threading.Thread | None = None
        self._written: dict[str, float] = {}  # partition -> monotonic time of its last write
        self._held: dict[str, EventData] = {}  # partition -> last handled, not checkpointed
        self._handled: dict[str, int] = {}  # partition -> sequence number of the last handled

    def close(self) -> None:
        """Stop asking (the thread that asks starts with the first question)."""
        if self._prober is not None:
            self._prober.close()
        if self._asking is not None:
            self._asking.join(timeout=5.0)  # a question in flight ends with its own timeout

    def __call__(self, context: PartitionContext, events: list[EventData]) -> None:
        # Once stopping, handle nothing more: a later batch checkpointed after an unhandled
        # one would skip it for good.
        if self._retry.stop.is_set():
            return
        partition = context.partition_id
        where = eventhubs_partition(
            context.fully_qualified_namespace, context.eventhub_name, partition
        )
        if events:
            messages = [Message(str(e.offset), _body(e), _sender(e)) for e in events]
            newest = max((e.enqueued_time for e in events if e.enqueued_time), default=None)
            if not self._retry.deliver(partition, messages, Position(where, newest)):
                return
            self._held[partition] = events[-1]
            if events[-1].sequence_number is not None:
                self._handled[partition] = events[-1].sequence_number
        elif (end := self._read_to_end(partition)) is not None and not self._retry.deliver(
            partition, [], Position(where, end)
        ):
            return
        if partition in self._held and self._due(partition):
            self._checkpoint(context, self._held.pop(partition))
            self._written[partition] = self._clock()

    def closed(self, context: PartitionContext, reason: CloseReason) -> None:
        """on_partition_close: a held checkpoint is written if the partition is still ours."""
        _on_partition_close(context, reason)
        last = self._held.pop(context.partition_id, None)
        self._written.pop(context.partition_id, None)
        self._handled.pop(context.partition_id, None)
        if self._prober is not None:
            self._prober.forget(context.partition_id)
        if last is None or reason.name != "SHUTDOWN":
            return  # ownership lost: the new owner reads the batch again, deduplicated
        try:
            context.update_checkpoint(last)
        except Exception as err:  # the next owner reads again from the previous checkpoint
            log.info(
                "the checkpoint of partition %s was not written at shutdown (%s); its "
                "next reader reads its last records again",
                context.partition_id,
                describe(err),
            )

    def _read_to_end(self, partition: str) -> datetime | None:
        """When an idle `partition` was found read to its end, by the answer come in since
        its last idle round; None when none came (asked lately, or not yet answered), it
        was not at its end, or there is nothing to compare with. Asks again when due."""
        if self._prober is None:
            return None
        if self._asking is None:
            self._asking = threading.Thread(
                target=self._prober.run, daemon=True, name="se-bridge eventhubs probe"
            )
            self._asking.start()
        found = self._prober.answer(partition)
        self._prober.want(partition)
        if found is None:
            return None
        asked, answer = found
        # Every event enqueued before `asked` is numbered at most `last`.
        handled, last = self._handled.get(partition), answer.get("last_enqueued_sequence_number")
        if answer.get("is_empty") or (
            handled is not None and isinstance(last, int) and last <= handled
        ):
            return asked
        return None

    def _due(self, partition: str) -> bool:
        last = self._written.get(partition)
        return last is None or self._clock() - last >= self._interval

    def _checkpoint(self, context: PartitionContext, last: EventData) -> None:
        streak = FailureStreak(self._backoff)
        while not self._retry.stop.is_set():
            try:
                context.update_checkpoint(last)
            except Exception as err:  # storage trouble: the batch is handled, keep its mark
                first, delay = streak.failed(err)
                log.log(
                    logging.WARNING if first else logging.DEBUG,
                    "cannot write the checkpoint of partition %s (offset %s) to container %s: "
                    "%s; retrying in %.1f s",
                    *(context.partition_id, last.offset, self._container, describe(err)),
                    delay,
                )
                self._retry.wait(delay)
                continue
            streak.succeeded()
            return

    @property
    def _container(self) -> str:
        return self._config.consumer.checkpoint_container


# An event as the eventhubs sink sends it (bridge/sinks/eventhubs.py), as the SDK receives it:
#   body: b'{"SchemaVersion": 1, "RecordId": "5f0c6d1e9a4b2c37", "RecordType": "Event", ...}'
#   properties: {b"RecordType": b"Event", b"SchemaVersion": 1, b"VmId": b"02aab8a4-...", ...}
#   content_type: "application/json"   partition_key: b"02aab8a4-..."   offset: "4096"
def _body(event: EventData) -> str:
    """The event's body as text; bytes that are not UTF-8 come out as \\xNN escapes, which no
    JSON parser accepts, so such an event is set aside as poison with its bytes still visible."""
    from azure.eventhub.amqp import AmqpMessageBodyType  # noqa: PLC0415

    if event.body_type != AmqpMessageBodyType.DATA:
        return event.body_as_str()
    raw = b"".join(event.body)  # type: ignore[arg-type]  # DATA bodies are iterables of bytes
    return raw.decode("utf-8", errors="backslashreplace")


def _describe_hub(config: Config) -> str:
    hub = config.eventhubs
    name = hub.name or "(named in the connection string)"
    where = f" in {hub.namespace}" if hub.namespace and not hub.connection_string else ""
    return f"event hub {name}{where}, consumer group {config.consumer.consumer_group}"


def _on_error(context: PartitionContext | None, error: Exception) -> None:
    # The SDK reports what it retries itself (lost links, load balancing against storage).
    partition = f"partition {context.partition_id}" if context is not None else "load balancing"
    log.warning("Event Hubs consumer (%s): %s; the SDK retries", partition, describe(error))


def _on_partition_initialize(context: PartitionContext) -> None:
    log.info("reading partition %s of event hub %s", context.partition_id, context.eventhub_name)


def _on_partition_close(context: PartitionContext, reason: CloseReason) -> None:
    log.info(
        "stopped reading partition %s of event hub %s (%s)",
        *(context.partition_id, context.eventhub_name, reason.name),
    )


def _sender(event: EventData) -> str | None:
    """The partition key the agent sent with (its VmId), as text."""
    key = event.partition_key
    if isinstance(key, bytes):
        return key.decode("utf-8", "replace")
    return key if isinstance(key, str) else None
