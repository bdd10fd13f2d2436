"""Records in: the records not seen before, on the consumer's clock, as changes to the VM
and event documents (bridge.consumer.documents merges each record)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from bridge import recordtypes as rt
from bridge.consumer import documents as fs
from bridge.consumer.state import Mutation
from bridge.records import RecordView, is_decision, iso, parse_time
from bridge.redact import describe

log = logging.getLogger(__name__)

SEEN_RECORD_IDS = 100_000
# A record dated further ahead of the consumer's clock than this is taken as of now: clocks
# of healthy VMs (NTP, the Azure host's time sync) stay well within it.
MAX_AHEAD = timedelta(minutes=5)
D = TypeVar("D", fs.VmDocument, fs.EventDocument)


class Intake:
    """Which records are new (by RecordId, the last SEEN_RECORD_IDS), clamped to our clock."""

    def __init__(self) -> None:
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._warned = Once(10_000)  # VMs whose clock was said to be ahead

    def fresh(self, records: Sequence[RecordView], now: datetime) -> list[RecordView]:
        """The records of `records` not seen before, each on our clock (`_on_our_clock`)."""
        return [self._on_our_clock(r, now) for r in records if self._first_sight(r)]

    def remember(self, fresh: Sequence[RecordView]) -> None:
        """`fresh` is stored: seen again, its records are not folded again."""
        for record in fresh:
            self._seen[str(record.get("RecordId"))] = None
        while len(self._seen) > SEEN_RECORD_IDS:
            self._seen.popitem(last=False)

    def _first_sight(self, record: RecordView) -> bool:
        rid = record.get("RecordId")
        return isinstance(rid, str) and rid not in self._seen

    def _on_our_clock(self, record: RecordView, now: datetime) -> RecordView:
        """`record`, its TimeGenerated clamped to now when it is from the future.

        A VM whose clock was wrong at boot (or a forged record) dated a year ahead would
        otherwise make every later record of its VM and event look old: the event's end
        never folded in, its budget slot never released.
        """
        stamped = parse_time(record.get("TimeGenerated"))
        if stamped is None or stamped - now <= MAX_AHEAD:
            return record
        who = str(record.get("VmId") or record.get("HostName"))
        level = logging.WARNING if self._warned.add(who) else logging.DEBUG
        log.log(
            level,
            "record %s of VM %s is dated %s, %s ahead of this consumer's clock: "
            "taken as of now (check the VM's time synchronisation)",
            record.get("RecordId"),
            who,
            record.get("TimeGenerated"),
            stamped - now,
        )
        return {**record, "TimeGenerated": iso(now)}


def vm_mutations(
    records: Sequence[RecordView], heard: str, partition: str | None
) -> dict[str, Mutation]:
    by_vm: dict[str, list[RecordView]] = {}
    for record in records:
        vm_id = record.get("VmId")
        if isinstance(vm_id, str) and not is_decision(record):
            by_vm.setdefault(vm_id, []).append(record)

    def merge(value: fs.VmDocument, record: RecordView, heard: str) -> bool:
        return fs.merge_vm(value, record, heard, partition)

    return {vm_id: _folder(merge, mine, heard) for vm_id, mine in by_vm.items()}


# The records an event document folds; an Advisory makes one too, marked as an advisory: the
# policy never approves it (bridge.policy.gates.rebalance), but may drain its node.
_EVENT_RECORDS = ("Event", "Hook", "Advisory")


def event_mutations(records: Sequence[RecordView], heard: str) -> dict[str, Mutation]:
    by_event: dict[str, list[RecordView]] = {}
    for record in records:
        event_id = record.get("EventId")
        if record.get(rt.RECORD_TYPE) in _EVENT_RECORDS and isinstance(event_id, str):
            by_event.setdefault(fs.event_key(event_id), []).append(record)
    return {key: _folder(fs.merge_event, mine, heard) for key, mine in by_event.items()}


def _folder(
    merge: Callable[[D, RecordView, str], bool],
    records: Sequence[RecordView],
    heard: str,
) -> Callable[[dict[str, Any]], bool]:
    """A mutation for `bridge.consumer.state.update` that merges every record of `records`.

    A record whose merge fails is set aside (an ERROR, it stays in the hub and the logs'
    table): one record never stops the others of its batch and partition.
    """

    def fold(value: dict[str, Any]) -> bool:
        document = cast(D, value)  # the stored JSON is the document `merge` owns
        changed = False
        for record in records:
            before = dict(value)  # cheap; the merges replace what they change at the top
            try:
                changed = merge(document, record, heard) or changed
            except Exception as err:
                value.clear()
                value.update(before)
                log.error(
                    "record %s (%s of VM %s) could not be folded into the fleet state and "
                    "was set aside: %s",
                    record.get("RecordId"),
                    record.get(rt.RECORD_TYPE),
                    record.get("VmId"),
                    describe(err, with_type=True),
                )
        return changed

    return fold


class Once:
    """Remembers up to `size` keys: `add` is True the first time a key is seen."""

    def __init__(self, size: int) -> None:
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._size = size

    def add(self, key: str) -> bool:
        if key in self._keys:
            return False
        self._keys[key] = None
        while len(self._keys) > self._size:
            self._keys.popitem(last=False)
        return True
