"""What the consumer's record sources (local hub, Event Hubs) share: the handler contract,
turning a message body into a record, and the loop that hands one batch to the handler until
it succeeds or the consumer stops.

Every body is checked before the consumer sees it (`check_record`): at most
MAX_RECORD_BYTES, one JSON object, valid against record.schema.json, and, when the source
knows who sent it (the Event Hubs partition key, which the agent's sinks set to its VmId),
a VmId that matches. A body that fails goes to the poison callback with the reason (the
dead-letter store) and the rest of the batch goes on: a bad message never blocks its
partition. The sender check catches a misrouted or buggy sender, not a malicious one:
Event Hubs does not authenticate the partition key per message, so a sender with the
right to send may set any.

A source checkpoints a batch only after `BatchRetry.deliver` returned True, so a crash or a
stop at any point at worst hands a batch to the handler twice (at-least-once), and a batch
whose handler keeps failing holds its partition back instead of being skipped.

With each batch the handler learns where it was read (`bridge.consumer.reading.Position`):
the partition, and how far the source has read it, which is what lets the consumer take a
VM as silent (bridge/consumer/reading.py). A source that finds a partition read to its end
says so with a batch of no records.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast

from bridge import recordtypes as rt
from bridge.consumer import validation
from bridge.consumer.reading import Position
from bridge.records import RecordView
from bridge.redact import describe
from bridge.retry import Backoff, FailureStreak, RetryableError

log = logging.getLogger(__name__)

# Called with the records of one batch (parsed JSON objects, in partition order; perhaps none;
# not yet checked against the schema) and where they were read. Returns when state and
# dispatch have succeeded; raises bridge.retry.RetryableError / ThrottledError when the batch
# must be retried (nothing is checkpointed then).
RecordHandler = Callable[[list[dict[str, object]], Position], None]

# Called with the bodies of one batch as they are (a source of messages that are not records:
# Event Grid deliveries, bridge.consumer.secondsource) and where they were read; as
# RecordHandler otherwise.
BodyHandler = Callable[[list[str], Position], None]

# (partition, offset, body, reason) of a message that is not a record. It is skipped after
# this returns, so the callback must keep it somewhere (it is its only copy the consumer keeps).
PoisonHandler = Callable[[str, str, str, str], None]


# The largest record an agent makes is well under half of this: an Event whose Resources
# lists a large scale set, or a Hook with its 4 KiB output tail (escaped). Anything bigger
# is not an agent's record, and parsing and storing it would cost every consumer instance.
MAX_RECORD_BYTES = 64 * 1024
# Partition keys the agent uses before it knows its VmId (sinks: f"host:{HostName}").
HOST_KEY_PREFIX = "host:"


class NotARecord(ValueError):
    """A message body that is not a valid record: the message says why."""


class Message(NamedTuple):
    """One message of a batch: its offset, body, and who the source says sent it."""

    offset: str
    body: str
    sender: str | None = None  # the partition key (the agent's VmId); None when unknown


# A body as the agent ships it (one record, JSON text), for example:
#   {"SchemaVersion": 1, "RecordId": "5f0c6d1e9a4b2c37", "RecordType": "Heartbeat",
#    "TimeGenerated": "2022-04-11T22:10:00.000Z", "VmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
#    "VmName": "WestNO_0", ..., "DocumentIncarnation": 3, "PendingEvents": 1, "SpoolDepth": 0,
#    "ImdsHealthy": true, "LastImdsSuccess": "2022-04-11T22:09:59.000Z"}
def parse_record(body: str) -> dict[str, object]:
    """The record in `body`; NotARecord when it is not one JSON object."""
    try:
        value = json.loads(body)
    except ValueError as err:
        raise NotARecord(f"not JSON: {err}") from err
    except RecursionError as err:
        raise NotARecord("JSON nested too deeply") from err
    if not isinstance(value, dict):
        raise NotARecord(f"a JSON {type(value).__name__}, not an object")
    parsed: dict[str, object] = value
    return parsed


# A body as above, sent with partition key "02aab8a4-74ef-476e-8182-f6d2ba4166a6".
def check_record(body: str, sender: str | None = None) -> rt.Record:
    """The record in `body` if it is one an agent could have sent as `sender`; else NotARecord."""
    return cast(rt.Record, _checked(body, sender, full=True))  # the schema says it is one


def _checked(body: str, sender: str | None, *, full: bool) -> dict[str, object]:
    """`check_record`'s checks; `full=False` leaves out the schema (the caller checks the
    parsed record with `bridge.consumer.validation.problem`, as `se-bridge consume` does in
    front of the consumer)."""
    size = len(body.encode("utf-8", errors="surrogatepass"))
    if size > MAX_RECORD_BYTES:
        raise NotARecord(f"{size} bytes, more than the {MAX_RECORD_BYTES} a record may have")
    record = parse_record(body)
    problem = validation.problem(record) if full else None
    if problem is not None:
        raise NotARecord(f"not valid against record.schema.json: {problem}")
    if record.get("Source", "Agent") != "Agent":
        # Azure's view ends an event for every VM it names: it is read from eventgrid.hub
        # alone, which only the system topics may send to, never from a hub agents send to.
        raise NotARecord(
            f"Source {record.get('Source')!r}: a record of Azure's view comes only "
            "from eventgrid.hub; one sent with the agents' is refused"
        )
    if sender is not None and not _sent_by(record, sender):
        raise NotARecord(
            f"VmId {record.get('VmId')!r} does not match the sender's partition "
            f"key {sender!r}: refused, one VM may not speak for another"
        )
    return record


def _sent_by(record: RecordView, sender: str) -> bool:
    vm_id = record.get("VmId")
    if vm_id is None:  # before the VmId is known the agent keys its records by host name
        return sender == f"{HOST_KEY_PREFIX}{record.get('HostName')}"
    return str(vm_id).strip().lower() == sender.strip().lower()


def log_poison(partition: str, offset: str, body: str, reason: str) -> None:
    """The default poison callback: the body goes to the log, the only place it is kept."""
    log.error(
        "skipping the message at offset %s of partition %s: it is not a record (%s); "
        "its body, kept only in this log line, is %r",
        *(offset, partition, reason, body),
    )


@dataclass
class BatchRetry:
    """Hands one batch to the handler, retrying with backoff until it succeeds or `stop` is set."""

    handler: RecordHandler
    poison: PoisonHandler
    stop: threading.Event
    source: str  # "local hub /srv/hub", "event hub records": names the source in log lines
    backoff: Backoff = field(default_factory=Backoff)
    # Told (partition, records) once a batch was handled: the metrics' records and lag.
    on_done: Callable[[str, list[dict[str, object]]], None] | None = None
    # Set: the bodies go to it as they are, instead of records to `handler` (their checks
    # are its own, and it counts and logs what it refuses).
    bodies: BodyHandler | None = None
    _streak: FailureStreak = field(init=False)

    def __post_init__(self) -> None:
        self._streak = FailureStreak(self.backoff)

    def deliver(
        self,
        partition: str,
        messages: Sequence[tuple[str, str] | Message],
        position: Position | None = None,
    ) -> bool:
        """Hand (offset, body[, sender]) `messages` over: True once done, False if stopped.

        `position`: where they were read (default: `partition`, read to no known point).
        """
        position = position or Position(partition)
        if self.bodies is not None:
            return self._deliver_bodies(partition, [Message(*m) for m in messages], position)
        good, bad = _split([Message(*m) for m in messages])
        where = _where(self.source, partition, [Message(*m) for m in messages])
        while not self.stop.is_set():
            try:
                while bad:  # each poison message is handed over once, even if the handler fails
                    offset, body, reason = bad[0]
                    self.poison(partition, offset, body, reason)
                    bad.pop(0)
                if good or position.caught_up is not None:
                    # Parsed afresh each attempt: a failed attempt cannot leave edits behind.
                    records = [parse_record(body) for body in good]
                    self.handler(records, position)
                    if self.on_done is not None and records:
                        self.on_done(partition, records)
            except Exception as err:  # the loop never dies: a failed batch is retried
                self._failed(err, where)
                continue
            self._succeeded(where)
            return True
        return False

    def _deliver_bodies(self, partition: str, messages: list[Message], position: Position) -> bool:
        assert self.bodies is not None
        where = _where(self.source, partition, messages)
        while not self.stop.is_set():
            try:
                if messages or position.caught_up is not None:
                    self.bodies([m.body for m in messages], position)
            except Exception as err:  # the loop never dies: a failed batch is retried
                self._failed(err, where)
                continue
            self._succeeded(where)
            return True
        return False

    def wait(self, delay: float) -> None:
        """A pause that ends early when the consumer is told to stop."""
        self.stop.wait(delay)

    def _failed(self, err: Exception, where: str) -> None:
        first, delay = self._streak.failed(err)
        expected = isinstance(err, RetryableError)
        if first:
            log.warning(
                "handling %s failed%s: %s; retrying in %.1f s, nothing is checkpointed "
                "until it succeeds",
                *(
                    where,
                    "" if expected else " unexpectedly",
                    describe(err, with_type=not expected),
                ),
                delay,
                exc_info=None if expected else err,
            )
        else:
            log.debug(
                "handling %s failed again (%d): %s", where, self._streak.failures, describe(err)
            )
        self.wait(delay)

    def _succeeded(self, where: str) -> None:
        if ended := self._streak.succeeded():
            log.warning("handled %s after %d failed attempts", where, ended)


def _split(messages: Sequence[Message]) -> tuple[list[str], list[tuple[str, str, str]]]:
    """Bodies of records, and (offset, body, reason) of the messages that are not records."""
    good: list[str] = []
    bad: list[tuple[str, str, str]] = []
    for offset, body, sender in messages:
        try:
            _checked(body, sender, full=False)
        except NotARecord as err:
            bad.append((offset, body, str(err)))
        else:
            good.append(body)
    return good, bad


def _where(source: str, partition: str, messages: Sequence[Message]) -> str:
    if not messages:
        return f"an empty batch from partition {partition} of {source}"
    first, last = messages[0][0], messages[-1][0]
    span = f"offset {first}" if first == last else f"offsets {first} to {last}"
    return f"{len(messages)} messages ({span}) from partition {partition} of {source}"
