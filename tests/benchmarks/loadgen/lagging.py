"""A consumer held back on one partition past `alive_within`, beside a caught-up twin
(issue 27, item 5): the release rule must not take what it has not read for silence.

`python -m tests.benchmarks.loadgen.lagging --help` says how to run it; its check on a small
fleet is tests/benchmarks/test_loadgen.py.

A wave of the load generator (`sim`, `waves`) is played in fleet time into two real
consumer cores, each with its own SQLite state, that share nothing but the stream: the
records go to partitions as the local hub places them (a stable hash of the VmId). The
caught-up twin is handed each partition's records as the fleet makes them, read to the end;
the held one the same, but for `hold` fleet seconds it reads nothing of one partition
(what the VMs of that partition send waits there), then reads it all at once and is caught
up again. Both make a pass every step (`tick`), on a clock that is fleet time. No command
is answered: the platform starts every event at its NotBefore, so both twins see one fleet.

What is counted, per twin, over its Release decisions (slots freed because the event's VMs
fell silent, docs/policy.md#when-a-slot-is-released):

- unfounded: a release of an event one of whose VMs never was silent for `alive_within`
  between the event's appearance and the release (each VM's records, as the fleet sent
  them): the rule took unread records for silence;
- kept: a release by the held twin of an event the caught-up twin still counted at that
  moment (its ledger), the slot a caught-up consumer keeps.

In the waves the load generator plays, every event ends within minutes of starting, so a
slot freed by a false silence is mostly one the fleet would free soon anyway: the harm shows
as `unfounded`, and `kept` is the stricter count of the same mistake.
"""

from __future__ import annotations

import argparse
import bisect
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from bridge import recordtypes as rt
from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer.core import Consumer
from bridge.consumer.reading import Position
from bridge.consumer.state.sqlite import SqliteStore
from bridge.localhub import PARTITIONS, partition_for
from bridge.policy.file import loads
from bridge.records import parse_time
from tests.benchmarks.loadgen import waves
from tests.benchmarks.loadgen.fleet import Fleet, build
from tests.benchmarks.loadgen.play import revision
from tests.benchmarks.loadgen.policy import POLICY_YAML
from tests.benchmarks.loadgen.sim import FleetClock, Sim
from tests.benchmarks.rig import ROOT, say
from tests.support.records import Sender

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
ALIVE_WITHIN = 660.0  # consumer.alive_within's default
STEP = 10.0  # fleet seconds between hand-overs and passes
LEAD_IN = 600.0  # fleet seconds of heartbeats before the wave


@dataclass
class Twin:
    name: str
    consumer: Consumer
    store: SqliteStore
    decisions: list[rt.Decision] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # releases of slots the caught-up twin counted

    def releases(self) -> list[tuple[str, float]]:
        """(event key, fleet second) of each Release decision."""
        found = []
        for decision in self.decisions:
            if decision["DecisionAction"] == "Release":
                at = parse_time(decision["TimeGenerated"])
                assert at is not None
                found.append((fs.event_key(decision["EventId"]), (at - T0).total_seconds()))
        return found


@dataclass
class LagResult:
    wave: str
    vms: int
    partition: int  # the one the held twins are held back on
    hold: tuple[float, float]  # fleet seconds: from, until
    records: int
    held_records: int  # records of that partition the held twins read late
    releases: dict[str, int]  # twin -> Release decisions
    unfounded: dict[str, list[str]]  # twin -> releases of VMs not silent for alive_within
    kept: dict[str, list[str]]  # twin -> releases of slots the caught-up twin still counted
    seconds: float  # wall seconds the run took

    def lines(self) -> list[str]:
        start, end = self.hold
        out = [
            f"{self.wave}: {self.vms:,} VMs, {self.records:,} records; a held consumer reads "
            f"nothing of partition {self.partition} from fleet second {start:,.0f} to "
            f"{end:,.0f} ({end - start:,.0f} s; alive_within {ALIVE_WITHIN:g} s), then its "
            f"{self.held_records:,} records at once ({self.seconds:.1f} s wall)",
            "",
            "| consumer | slots released | of VMs not silent for alive_within "
            "| of slots the caught-up consumer kept |",
            "|---|---:|---:|---:|",
        ]
        for name, count in self.releases.items():
            out.append(
                f"| {name} | {count} | {len(self.unfounded[name])} | {len(self.kept[name])} |"
            )
        for name in self.releases:
            out += [f"- {name}, unfounded: {line}" for line in self.unfounded[name][:3]]
            out += [f"- {name}, kept: {line}" for line in self.kept[name][:3]]
        return out


CAUGHT_UP, HELD, TODAY = "caught up", "held back", "held back, on its clock (before issue 27)"


def run(
    fleet: Fleet,
    plan: waves.WavePlan,
    directory: Path,
    *,
    partition: int,
    hold: tuple[float, float],
    seed: int = 1,
) -> LagResult:
    """Play `plan` into the twins; the held ones read nothing of `partition` during `hold`
    (fleet seconds). One says so (read marks); the other says every partition is read to
    its end, which makes the release rule the one before read marks: silence on the
    consumer's clock."""
    began = time.monotonic()
    sim = Sim(fleet, plan, FleetClock(T0), seed=seed, offset=LEAD_IN)
    now = [T0]
    policy = loads(POLICY_YAML, "loadgen policy")

    def twin(name: str, file: str) -> Twin:
        store, decisions = SqliteStore(directory / file), list[rt.Decision]()
        consumer = Consumer(
            store,
            Sender(),
            policy,
            decisions.extend,
            ConsumerSettings(alive_within=ALIVE_WITHIN),
            now=lambda: now[0],
            host_name=name,
        )
        return Twin(name, consumer, store, decisions)

    twins = caught, held, today = (
        twin(CAUGHT_UP, "caught.db"),
        twin(HELD, "held.db"),
        twin(TODAY, "today.db"),
    )
    heard: dict[int, list[float]] = defaultdict(list)  # VM -> fleet seconds of its records
    waiting: list[dict[str, Any]] = []
    records = late = 0
    t = 0.0
    for chunk in sim.warm_up():
        batch = _by_partition(fleet, chunk, heard, t)
        for one in twins:
            _hand_over(one.consumer, batch, now[0])
        records += len(chunk)
    # Until the wave is over and the held twins have caught up for a whole alive_within.
    while not sim.finished(t) or t < hold[1] + ALIVE_WITHIN + 2 * STEP:
        t += STEP
        now[0] = T0 + timedelta(seconds=t)
        before = {one.name: len(one.releases()) for one in twins}
        emitted = sim.advance(t)
        records += len(emitted)
        batch = _by_partition(fleet, emitted, heard, t)
        _hand_over(caught.consumer, batch, now[0])
        caught.consumer.tick()
        counted = set(caught.consumer.ledger.entries())
        holding = hold[0] <= t < hold[1]
        if holding:
            waiting += batch.pop(partition, [])
        elif waiting:
            batch[partition] = waiting + batch.get(partition, [])
            late, waiting = late + len(waiting), []
        _hand_over(held.consumer, batch, now[0], behind={partition} if holding else set())
        _hand_over(today.consumer, batch, now[0])
        for one in (held, today):
            one.consumer.tick()
            fresh = one.releases()[before[one.name] :]
            one.kept += [f"{key} at fleet second {at:,.0f}" for key, at in fresh if key in counted]
    events = {fs.event_key(e.event_id): e for e in plan.events}
    result = LagResult(
        wave=plan.name,
        vms=len(fleet),
        partition=partition,
        hold=hold,
        records=records,
        held_records=late,
        releases={one.name: len(one.releases()) for one in twins},
        unfounded={one.name: _unfounded(one, events, heard) for one in twins},
        kept={one.name: one.kept for one in twins},
        seconds=time.monotonic() - began,
    )
    for one in twins:
        one.consumer.close()
    return result


def _by_partition(
    fleet: Fleet,
    emitted: Sequence[tuple[int, dict[str, Any]]],
    heard: dict[int, list[float]],
    t: float,
) -> dict[int, list[dict[str, Any]]]:
    batch: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for index, record in emitted:
        batch[partition_for(fleet.vms[index].vm_id)].append(record)
        heard[index].append(t)
    return batch


def _hand_over(
    consumer: Consumer,
    batch: dict[int, list[dict[str, Any]]],
    now: datetime,
    behind: set[int] | None = None,
) -> None:
    """Every partition's records, read to its end now (but those it is `behind` on)."""
    for partition in range(PARTITIONS):
        caught_up = None if partition in (behind or set()) else now
        consumer.process(batch.get(partition, []), Position(f"hub/{partition}", caught_up))


def _unfounded(
    twin: Twin, events: dict[str, waves.SimEvent], heard: dict[int, list[float]]
) -> list[str]:
    found = []
    for key, at in twin.releases():
        event = events[key]
        since = LEAD_IN + event.appear
        for index in event.vms:
            if not silent_for(heard[index], since, at, ALIVE_WITHIN):
                found.append(
                    f"{event.event_type} {key} released at fleet second {at:,.0f}: "
                    f"VM {index} was never silent for {ALIVE_WITHIN:g} s since "
                    f"fleet second {since:,.0f}"
                )
                break
    return found


def silent_for(times: list[float], since: float, until: float, span: float) -> bool:
    """Whether a VM whose records went out at `times` (sorted) sent none for `span` seconds
    at some point between `since` and `until`."""
    start = bisect.bisect_left(times, since)
    marks = [
        times[start - 1] if start else since,
        *times[start : bisect.bisect_right(times, until)],
    ]
    return any(b - a >= span for a, b in zip(marks, [*marks[1:], until], strict=True))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.loadgen.lagging",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    p.add_argument("--wave", default="scale-in", choices=sorted(waves.WAVES))
    p.add_argument("--vms", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--partition", type=int, default=0, help="the partition held back (0)")
    p.add_argument(
        "--hold",
        type=float,
        default=ALIVE_WITHIN + 600,
        help="fleet seconds the held consumer reads nothing of it (alive_within + 600)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "fleet-lagging.md")
    args = p.parse_args(argv)
    fleet = build(args.vms, args.seed)
    plan = waves.plan(args.wave, fleet, args.seed)
    start = LEAD_IN + first_start(plan)
    with tempfile.TemporaryDirectory() as directory:
        result = run(
            fleet,
            plan,
            Path(directory),
            partition=args.partition,
            hold=(start, start + args.hold),
            seed=args.seed,
        )
    command = "python -m tests.benchmarks.loadgen.lagging " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    text = "\n".join(
        [
            "# Fleet load: a consumer held back on one partition",
            "",
            f"`{command.strip()}` on {time.strftime('%Y-%m-%d %H:%M %Z')} at {revision()}.",
            "",
            *result.lines(),
            "",
        ]
    )
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    say(f"written to {args.out}")
    return 0


def first_start(plan: waves.WavePlan) -> float:
    """When the wave's first event starts (its NotBefore: nothing is approved), in the wave's
    seconds: holding a partition back from then leaves the twins a known event to release."""
    return min(e.appear + e.notice for e in plan.events)


if __name__ == "__main__":
    sys.exit(main())
