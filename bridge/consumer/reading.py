"""How far the consumer has read each partition, and which VMs' silence that vouches for.

The release rule (docs/policy.md#when-a-slot-is-released) frees the budget slot of an event
whose VMs have all been silent for `consumer.alive_within`. Measured on the consumer's clock
alone (`heard`: when it last folded a record of the VM), silence is silence only for a
consumer that has read everything. One that runs behind the partition carrying a VM's
records has not read what the VM said meanwhile: after `alive_within` of lag it took every
VM of that partition for deleted and freed their slots (issue 27, item 5).

So a source says, with each batch, where it read it (`Position`): the partition, named so
that no other source's partition has its name, and a moment before which every record
enqueued in that partition has now been handed over (`caught_up`; None where the source
cannot say). The consumer keeps per partition the latest such moment (its read mark), and
for each VM the partition its records come on (`partition` in the VM document, beside
`heard`). For the release rule a VM is silent only when its partition's mark is more than
`alive_within` past `heard`: everything the VM could have sent in that span has been read,
and none of it was the VM's. A consumer that is caught up sees its marks follow its clock
within seconds, and releases as it always did; one that is behind sees them stop where its
reading stopped, and releases nothing of that partition until it has caught up. VMs of the
partitions it is not behind on are released as before.

Why a read mark per partition rather than each record's enqueued time, or the consumer's
clock with a lag allowance: a mark says what was *not* in the partition, which no record
can; it costs one small document per partition instead of a field per record; and it
leaves the rule itself (and `heard`, on the consumer's clock, where a VM's wrong clock
cannot reach) as it was. `heard` is when a record was folded, never earlier than when it
was enqueued, so comparing it with a mark errs on the side of keeping a slot. The marks a
source gives are on the hub's clock (Event Hubs' enqueued times) or the consumer's (the
local hub); the two differ by the hosts' clock skew, seconds at most against
`alive_within`'s minutes.

Several consumer processes share the partitions and the fleet state: a VM of a partition
another process reads is judged by that process's mark, which it writes to the state
(`partition/<name>`, a `MarkDocument`) at most once a pace (`mark_pace`, a tenth of
`alive_within`); each process's re-evaluation pass reads the others' back at most that
often, while the release rule asks about a VM. So a consumer never vouches for a partition
it does not read beyond what its reader has read, and no batch waits for a mark to be
read. A partition no consumer has marked (not yet read to its end, or read by a source that
cannot say) vouches for no silence: its events wait for their VMs' own word, or for
`consumer.stale_after`. Records handed over with no position (a caller that reads no
partition: `policy explain`, tests) leave a VM's partition as it was; a VM that never had
one (documents written before this) is judged on the consumer's clock, as before.

What each source says (bridge/consumer/sources, bridge/consumer/functionapp.py):

- the local hub: a read that returns fewer records than it asked for reached the end of
  the partition, as of the moment the read began;
- Event Hubs (`se-bridge consume`): a batch is caught up to its newest event's enqueued
  time; an idle partition is asked for its last enqueued sequence number (at most every
  few seconds), and is caught up as of the question if this consumer has handled it;
- Azure Functions: a batch is caught up to its newest event's enqueued time. The trigger
  runs only when there are events, so a partition that falls entirely silent (every VM
  on it deleted) releases nothing by silence until it carries a record again: in a fleet
  that is seconds to minutes (every agent heartbeats every 5 minutes), in one of a few VMs
  at worst `consumer.stale_after`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TypedDict

from bridge.consumer.state import Conflict, Doc, Store, update
from bridge.policy.model import FleetView
from bridge.records import iso, parse_time

PARTITION = "partition"  # the collection of read marks, one document per partition
# A mark is written to the state when it has moved and this process last wrote it a pace
# ago, and the others' are read back at most once a pace, by the re-evaluation pass and
# only while the release rule asks about a VM: a consumer that reads no partition of a VM
# releases its event up to two paces (and a pass) later than the one that reads it. A
# tenth of alive_within keeps that within a fifth of the silence the rule waits for, at a
# cost that does not grow with records: written per batch, the marks were most of an idle
# consumer's Table Storage requests (issue 35; docs/capacity.md#figures-behind-the-codes-choices).
MARKS_PER_ALIVE_WITHIN = 10


def mark_pace(alive_within: float) -> timedelta:
    """How often a read mark is written, and the others' read back, at most."""
    return timedelta(seconds=alive_within / MARKS_PER_ALIVE_WITHIN)


@dataclass(frozen=True)
class Position:
    """Where a batch was read: its partition, and how far that partition has been read."""

    partition: str  # unique among every source's partitions: see `eventhubs_partition`
    # Every record enqueued in the partition before this has been handed over, with this
    # batch or before; None: the source cannot say.
    caught_up: datetime | None = None


def eventhubs_partition(namespace: str, hub: str, partition_id: str) -> str:
    """An Event Hubs partition's name, the same from `se-bridge consume` and the Functions app."""
    return f"{namespace}/{hub}/{partition_id}"


def local_partition(directory: str, partition: int) -> str:
    """A local hub partition's name."""
    return f"local:{directory}/{partition}"


class MarkDocument(TypedDict, total=False):
    """`partition/<name>`: how far a partition has been read. A sample:

    {"read_to": "2026-11-21T10:00:05.000Z", "by": "consumer-vm-1"}
    """

    read_to: str  # every record enqueued in the partition before this has been folded
    by: str  # the host name of the consumer that read it that far


class ReadMarks:
    """This process's read marks, and the others' as the fleet state holds them.

    A batch's path (`note`, `read_to`) reads no mark: this process's are in memory, the
    others' as the re-evaluation pass last read them (`look`). A mark is written from the
    batch path, at its pace, over the ETag of this process's last write of it: one request,
    no read. Only a write that meets another writer's (a partition that changed hands)
    reads the document, and keeps the further of the two marks.
    """

    def __init__(
        self, store: Store, *, now: Callable[[], datetime], host_name: str, alive_within: float
    ) -> None:
        self._store, self._now, self._host = store, now, host_name
        self._pace = mark_pace(alive_within)
        self._mine: dict[str, datetime] = {}
        self._written: dict[str, Doc] = {}  # as this process last wrote (or read) it
        self._wrote: dict[str, datetime] = {}  # when, on the consumer's clock
        self._theirs: dict[str, datetime] = {}  # as last read from the state
        self._looked: datetime | None = None
        self._asked = False  # the release rule asked since the last look

    def note(self, position: Position) -> None:
        """The records of `position` up to its `caught_up` are folded into the state."""
        caught_up = position.caught_up
        if caught_up is None:
            return
        if caught_up.tzinfo is None:  # a source's naive time is UTC (enqueued times are)
            caught_up = caught_up.replace(tzinfo=timezone.utc)
        partition = position.partition
        mark = max(caught_up, self._mine.get(partition, caught_up))
        self._mine[partition] = mark
        now, wrote = self._now(), self._wrote.get(partition)
        if wrote is None or abs(now - wrote) >= self._pace:
            self._write(partition, mark)
            self._wrote[partition] = now

    def _write(self, partition: str, mark: datetime) -> None:
        text = iso(mark)
        last = self._written.get(partition)
        if last is not None and str(last.value.get("read_to", "")) >= text:
            return
        # Over the ETag of our last write: a write in between (another reader of the
        # partition) conflicts, and is read below. None: created, if nobody has.
        doc = Doc(
            partition,
            dict(MarkDocument(read_to=text, by=self._host)),
            last.etag if last is not None else None,
        )
        try:
            self._written[partition] = self._store.write(PARTITION, doc)
        except Conflict:
            self._merge(partition, text)

    def _merge(self, partition: str, text: str) -> None:
        """Write the mark `text` unless the stored one is further, reading it first."""

        def forward(value: dict[str, object]) -> bool:
            if str(value.get("read_to", "")) >= text:
                return False  # another reader of the partition got further: it stays
            value.update(MarkDocument(read_to=text, by=self._host))
            return True

        stored = update(self._store, PARTITION, partition, forward)
        if stored is not None:
            self._written[partition] = stored

    def look(self) -> None:
        """The re-evaluation pass's: read the others' marks back, at most once a pace, and
        only when the release rule asked about a VM since the last look."""
        now = self._now()
        if not self._asked or (self._looked is not None and abs(now - self._looked) < self._pace):
            return
        self._looked, self._asked = now, False
        self._theirs = {
            doc.key: moment
            for doc in self._store.scan(PARTITION)
            if (moment := parse_time(doc.value.get("read_to"))) is not None
        }

    def read_to(self, partition: str) -> datetime | None:
        """How far `partition` is known to have been read, by this process or another (as
        last looked at)."""
        self._asked = True
        known = [m for m in (self._mine.get(partition), self._theirs.get(partition)) if m]
        return max(known) if known else None

    def vouched(self, fleet: FleetView) -> Vouched:
        """`fleet` for the release rule: a VM is alive unless its silence is vouched for."""
        return Vouched(fleet, self)


@dataclass(frozen=True)
class Vouched:
    """Which VMs the release rule takes as alive: those `fleet` takes as alive, and those
    whose silence the reading of their partition does not vouch for."""

    fleet: FleetView
    marks: ReadMarks

    def alive(self, vm_id: str, now: datetime) -> bool:
        if self.fleet.alive(vm_id, now):
            return True
        vm = self.fleet.vms.get(vm_id)
        if vm is None or vm.last_seen is None or vm.partition is None:
            return False  # unknown, said goodbye (a Stop heartbeat), or read from no partition
        read_to = self.marks.read_to(vm.partition)
        return read_to is None or min(read_to, now) - vm.last_seen <= self.fleet.alive_within
