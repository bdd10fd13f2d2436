"""What the consumers ask of the fleet state's table partitions in a Spot eviction storm
(issue 15): the approval ledger's one partition above all.

`python -m tests.benchmarks.ledger_storm --vms 100000 --consumers 1 2 4` plays the load
generator's storm (5,000 Preempt events within 2 minutes, tests/benchmarks/loadgen) in fleet
time through 1, 2 and 4 real consumer cores (bridge.consumer.core.Consumer), each with the
records of its share of the VMs, as Event Hubs partitions divide them, and a re-evaluation
pass every 5 fleet seconds, staggered. They share one SQLite fleet state whose looks count as
queries, as Table Storage's do (`feed_interval`): the consumers then decide batches on the
ledger they keep, the path a deployment on Table Storage takes, where another consumer may
have changed a budget group since.

Played in fleet time, not on the wall clock, so the storm runs at its real rate (5,000 events
in 2 minutes, whatever this machine manages; the budgets allow about 2,900 approvals at
100,000 VMs). Played one consumer after another, so no write lands between another's read
and its write: the conflicts of two writes at the same instant are not shown (each costs a
failed write and what `read_again` reads, a few documents).

Counted per run, as Table Storage would serve it (2,000 entities a second per partition), for
every request of every collection, each entity charged to the partition it is in (`vm` and
`event` spread over 16 partitions each, the ledger in one):
- looks: each returns every document of its collection written since 10 s before the
  consumer's previous look of it (all of them at its first, or at a full scan), counted from
  when each was last written (the VMs every 15 s, the events and the ledger at every pass);
- documents read by key and written (an entity each, in a transaction too).
For the ledger also: its looks, conflicts (before the locks kept the history of their writes,
each read the ledger again), documents read by key (before an approval its groups' locks and
its shard, a release's shard, after a conflict what it contested and what changed it) and
documents written. The busiest 10 s of each collection's busiest partition is what that
partition must take. Prints a table; `--out FILE` keeps it. A few minutes per run at 100,000
VMs.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from bridge import recordtypes as rt
from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer.core import Consumer
from bridge.consumer.state import Conflict, Doc, bucket
from bridge.consumer.state.sqlite import SqliteStore
from bridge.policy.file import loads
from tests.benchmarks.loadgen import waves
from tests.benchmarks.loadgen.fleet import build
from tests.benchmarks.loadgen.policy import POLICY_YAML
from tests.benchmarks.loadgen.sim import FleetClock, Sim
from tests.support.records import Sender

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
STEP = 0.25  # fleet seconds between batches: a consumer's batch holds what its VMs sent in one
LEAD_IN = 30.0  # fleet seconds of heartbeats before the storm
TAIL = 60.0
LOOK_BACK = 10.0  # a look on Table Storage asks from 10 s before the previous one began
PARTITION_TARGET = 2000  # entities a second per table partition (Table Storage's target)


def partition_of(collection: str, key: str) -> str:
    """The table partition document `key` of `collection` is in (bridge.consumer.state.tables:
    `vm` and `event` spread over fs.PARTITIONS, the ledger in one)."""
    count = fs.PARTITIONS.get(collection)
    return collection if count is None else f"{collection}-{bucket(key, count):02d}"


@dataclass
class Load:
    """What the consumers ask of the fleet state's table partitions, shared by their stores:
    entities per partition per fleet second, and the ledger's looks, conflicts and reads."""

    now: float = 0.0
    # collection -> document -> (its partition, fleet second it was last written)
    written: dict[str, dict[str, tuple[str, float]]] = field(default_factory=dict)
    per_second: Counter[tuple[str, int]] = field(default_factory=Counter)
    looks: int = 0  # of the ledger, as the rest below
    look_entities: int = 0
    conflicts: int = 0
    fetched: int = 0
    written_entities: int = 0

    def reset(self) -> None:
        """Count from here (the storm's lead-in), keeping what was written when."""
        kept = Load(now=self.now, written=self.written)
        self.__dict__.update(kept.__dict__)

    def since(self, collection: str, moment: float) -> Counter[str]:
        """Per partition, the documents of `collection` last written at or after `moment`."""
        return Counter(
            home for home, at in self.written.get(collection, {}).values() if at >= moment
        )

    def wrote(self, collection: str, keys: Iterable[str]) -> None:
        docs = self.written.setdefault(collection, {})
        for key in keys:
            docs[key] = (partition_of(collection, key), self.now)

    def charge(self, collection: str, keys: Iterable[str]) -> int:
        """Charge a read or write of documents `keys` to their partitions; how many."""
        homes = Counter(partition_of(collection, key) for key in keys)
        self.charge_partitions(homes)
        return sum(homes.values())

    def charge_partitions(self, entities: Counter[str]) -> None:
        second = int(self.now)
        for home, count in entities.items():
            self.per_second[home, second] += count

    def busiest(self, collection: str, window: int = 10) -> tuple[str, float]:
        """The partition of `collection` with the most entities a second over `window` fleet
        seconds, and that rate."""
        seconds: dict[str, Counter[int]] = {}
        for (home, second), count in self.per_second.items():
            if home == collection or home.startswith(f"{collection}-"):
                seconds.setdefault(home, Counter())[second] += count
        top = ("", 0.0)
        for home, counts in seconds.items():
            first, last = min(counts), max(counts)
            rate = max(
                sum(counts[s] for s in range(start, start + window)) / window
                for start in range(first, last + 1)
            )
            top = max(top, (home, rate), key=lambda t: t[1])
        return top


class StormStore(SqliteStore):
    """SQLite whose looks are queries, as Table Storage's (the consumer keeps the ledger, looks
    at the VMs every 15 s and keeps the events between passes), and which counts the entities
    each request would read or write in Table Storage's partitions."""

    feed_interval = 15.0

    def __init__(self, path: Path, load: Load) -> None:
        super().__init__(path)
        self.load = load
        self._looked: dict[str, float] = {}  # collection -> this consumer's previous look

    def scan(self, collection: str) -> list[Doc]:
        self._look(collection, None)
        return super().scan(collection)

    def scan_changes(
        self, collection: str, since: int | None, known: Mapping[str, Doc] | None = None
    ) -> tuple[list[Doc], int]:
        self._look(collection, since)
        return super().scan_changes(collection, since, known)

    def _look(self, collection: str, since: int | None) -> None:
        load = self.load
        previous = self._looked.get(collection)
        moment = float("-inf") if since is None or previous is None else previous - LOOK_BACK
        entities = load.since(collection, moment)
        load.charge_partitions(entities)
        self._looked[collection] = load.now
        if collection == fs.LEDGER:
            load.looks += 1
            load.look_entities += sum(entities.values())

    def read(self, collection: str, key: str) -> Doc | None:
        counted = self.load.charge(collection, [key])
        self.load.fetched += counted if collection == fs.LEDGER else 0
        return super().read(collection, key)

    def read_many(self, collection: str, keys: Sequence[str]) -> dict[str, Doc]:
        counted = self.load.charge(collection, keys)
        self.load.fetched += counted if collection == fs.LEDGER else 0
        return super().read_many(collection, keys)

    def write(self, collection: str, doc: Doc) -> Doc:
        self.load.charge(collection, [doc.key])
        written = super().write(collection, doc)
        self.load.wrote(collection, [doc.key])
        return written

    def write_many(self, collection: str, docs: Sequence[Doc]) -> tuple[list[Doc], list[str]]:
        self.load.charge(collection, [doc.key for doc in docs])
        written, conflicts = super().write_many(collection, docs)
        self.load.wrote(collection, [doc.key for doc in written])
        return written, conflicts

    def delete(self, collection: str, doc: Doc) -> None:
        self.load.charge(collection, [doc.key])
        super().delete(collection, doc)
        self.load.written.get(collection, {}).pop(doc.key, None)

    def write_all(self, collection: str, docs: Sequence[Doc]) -> list[Doc]:
        load = self.load
        load.charge(collection, [doc.key for doc in docs])
        try:
            written = super().write_all(collection, docs)
        except Conflict:
            load.conflicts += collection == fs.LEDGER
            raise
        if collection == fs.LEDGER:
            load.written_entities += len(docs)
        load.wrote(collection, [doc.key for doc in docs])
        return written


@dataclass
class Result:
    consumers: int
    vms: int
    events: int
    approvals: int
    approved_twice: int
    actions: Counter[str]
    load: Load
    seconds: float  # fleet seconds counted: from LOOK_BACK before the storm to the run's end
    passes: int  # re-evaluation passes, all consumers
    cpu: float


def run(vms: int, consumers: int, seed: int, say: Callable[[str], None]) -> Result:
    fleet = build(vms, seed)
    plan = waves.plan("spot-storm", fleet, seed)
    sim = Sim(fleet, plan, FleetClock(T0), seed=seed, offset=LEAD_IN)
    load = Load()
    sender = Sender()
    actions: Counter[str] = Counter()
    settings = ConsumerSettings()
    policy = loads(POLICY_YAML, "tests/benchmarks/loadgen/policy.py")
    of = [zlib.crc32(f"hub:{vm.vm_id}".encode()) % consumers for vm in fleet]

    def emit(records: Sequence[rt.Decision]) -> None:
        actions.update(
            str(r.get("DecisionAction")) for r in records if r.get("RecordType") == "Decision"
        )

    with TemporaryDirectory(prefix="ledger-storm-") as tmp:
        path = Path(tmp) / "fleet.db"
        stores = [StormStore(path, load) for _ in range(consumers)]

        def clock() -> datetime:
            return T0 + timedelta(seconds=load.now)

        cores = [Consumer(store, sender, policy, emit, settings, now=clock) for store in stores]
        began = time.process_time()
        for chunk in sim.warm_up():
            feed(cores, of, chunk)
        say(f"{consumers} consumer(s): {vms:,} VMs' Start heartbeats handled")
        # Counted from LOOK_BACK before the storm: the warm-up writes every VM at fleet
        # second 0, which real agents do over their boots, and the first looks at the VMs
        # after it would charge them all.
        start = LEAD_IN - LOOK_BACK
        ticks = [
            LEAD_IN / 2 + k * settings.reevaluate_interval / consumers for k in range(consumers)
        ]
        answered = passes = 0
        end: float | None = None
        counting = False
        while end is None or load.now < end:
            load.now += STEP
            now = load.now
            if not counting and now >= start:
                load.reset()
                passes, counting = 0, True
            feed(cores, of, sim.advance(now))
            for k, core in enumerate(cores):
                if now >= ticks[k]:
                    ticks[k] += settings.reevaluate_interval
                    core.tick()
                    passes += 1
            for command in sender.sent[answered:]:
                sim.answer(command, now)
            answered = len(sender.sent)
            if end is None and now > LEAD_IN and sim.finished(now):
                end = now + TAIL
        cpu = time.process_time() - began
        for store in stores:
            store.close()
    per_event = Counter(c.event_id.lower() for c in sender.sent)
    return Result(
        consumers=consumers,
        vms=vms,
        events=len(plan.events),
        approvals=len(per_event),
        approved_twice=sum(1 for n in per_event.values() if n > 1),
        actions=actions,
        load=load,
        seconds=load.now - start,
        passes=passes,
        cpu=cpu,
    )


def feed(cores: Sequence[Consumer], of: Sequence[int], emitted: list[tuple[int, Any]]) -> None:
    """Each consumer's share of what the VMs sent, as one batch."""
    batches: list[list[dict[str, Any]]] = [[] for _ in cores]
    for index, record in emitted:
        batches[of[index]].append(record)
    for core, batch in zip(cores, batches, strict=True):
        if batch:
            core.process(batch)


def render(results: Sequence[Result], command: str) -> str:
    head = [f"{r.consumers} consumer{'s' if r.consumers > 1 else ''}" for r in results]
    rows: list[tuple[str, list[str]]] = []

    def row(name: str, cell: Callable[[Result], str]) -> None:
        rows.append((name, [cell(r) for r in results]))

    def per(r: Result, n: int) -> str:
        return f"{n:,} ({n / max(1, r.approvals):.2f} an approval)"

    row(
        "Storm (fleet seconds counted, from 10 s before it to the end of the run)",
        lambda r: f"{r.events:,} Preempt events, {r.seconds:,.0f} s",
    )
    row(
        "Approvals (events approved twice)",
        lambda r: (
            f"{r.approvals:,} ({r.approved_twice}), {r.approvals / max(1.0, r.seconds):.1f}/s"
        ),
    )
    row("Decisions", lambda r: ", ".join(f"{a} {n:,}" for a, n in sorted(r.actions.items())))
    row("Looks at the ledger", lambda r: per(r, r.load.looks))
    row("Entities the looks return on Table Storage", lambda r: per(r, r.load.look_entities))
    row("Conflicts", lambda r: per(r, r.load.conflicts))
    row(
        "Documents read by key (before approvals, releases, after conflicts)",
        lambda r: per(r, r.load.fetched),
    )
    row("Documents written", lambda r: per(r, r.load.written_entities))
    for collection in (fs.LEDGER, fs.EVENT, fs.VM):
        row(
            f"Busiest `{collection}` partition, 10 s (target {PARTITION_TARGET:,}/s)",
            functools.partial(busiest, collection=collection),
        )
    row("CPU of the run (all consumers, one process)", lambda r: f"{r.cpu:,.0f} s")
    lines = [
        "# The approval ledger in a Spot eviction storm",
        "",
        f"`{command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC "
        "(tests/benchmarks/ledger_storm.py says what is counted and how).",
        "",
        "| Measurement | " + " | ".join(head) + " |",
        "|---" * (len(head) + 1) + "|",
    ]
    lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows]
    return "\n".join(lines) + "\n"


def busiest(r: Result, collection: str) -> str:
    home, rate = r.load.busiest(collection)
    return f"{rate:,.0f} entities/s ({home})" if home else "none"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.ledger_storm",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--vms", type=int, default=100_000, help="fleet size (100000)")
    parser.add_argument("--consumers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    command = "python -m tests.benchmarks.ledger_storm " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    results = []
    for consumers in args.consumers:
        results.append(run(args.vms, consumers, args.seed, lambda text: print(text, flush=True)))
        print(render(results, command), flush=True)
    if args.out is not None:
        args.out.write_text(render(results, command), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
