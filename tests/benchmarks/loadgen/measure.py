"""What a load run shows, computed from what it recorded: pure functions, no clock, no I/O.

The inputs are the wave's events as they played out (`SimEvent`: when each first reached a
hub, when it started and why, when it ended), the VMs deleted or silenced, the consumers'
Decision records, and the samples of the hubs taken every second. The checks do not reuse
the consumer's code: budget groups and rules are `policy`'s independent reading.

Budget violations. At each approval (the first Approve Decision of an event, at its
TimeGenerated), for every budget group the event's VMs are in: the VMs impacted then must
not exceed the group's limit. Impacted: the live VMs named by events approved before, or
started by the platform and already read by a consumer (its Started record checkpointed),
and not yet ended (left every document, or their VMs deleted), plus the new event's own.
A group's size follows docs/policy.md (live members and impacted ones); a member deleted or
silent counts for `alive_within` + `slack` after its last record, since a consumer may still
take it as alive that long. Both choices can only make the check more lenient than the
consumer's own view, never stricter: a violation found is one the consumer could have seen.

Wrong approvals: an Approve whose rule is not the first rule (of the independent reading)
that matches the event as it truly is, or whose first matching rule holds it.
"""

from __future__ import annotations

import bisect
import heapq
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tests.benchmarks.loadgen.fleet import Fleet
from tests.benchmarks.loadgen.policy import (
    APPROVING_RULES,
    BUDGETS,
    BudgetSpec,
    first_rule,
    group_of,
)
from tests.benchmarks.loadgen.waves import SimEvent
from tests.benchmarks.report import percentile


@dataclass(frozen=True)
class LagSample:
    """The hubs at one moment: records written and handled, and the oldest one waiting."""

    wall: float
    written: int
    consumed: int
    oldest_age: float  # seconds the oldest record not yet handled has waited (0: none)
    checkpoints: tuple[tuple[int, ...], ...]  # per hub, per partition: last offset handled


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds (utime + stime) each process had spent by one moment."""

    wall: float
    consumers: tuple[float, ...]  # per consumer process
    azurite: float | None  # the Azurite node process; None: the state is not in Azurite


def cpu_between(samples: Sequence[CpuSample], start: float, end: float) -> CpuSample | None:
    """CPU seconds spent between wall times `start` and `end` (the first sample at or after
    each, the last sample for an end past them); None with fewer than two samples there."""
    window = [s for s in samples if s.wall >= start]
    last = next((s for s in window if s.wall >= end), window[-1] if window else None)
    if not window or last is None or last.wall <= window[0].wall:
        return None
    first = window[0]
    return CpuSample(
        last.wall - first.wall,
        tuple(b - a for a, b in zip(first.consumers, last.consumers, strict=True)),
        None if first.azurite is None or last.azurite is None else last.azurite - first.azurite,
    )


def busiest(samples: Sequence[CpuSample], seconds: float = 10.0) -> CpuSample:
    """The highest share of one core any process took over a `seconds`-long stretch of
    samples, each process on its own (a consumer and Azurite each run their work on one
    thread: a share near 1 is a process at its limit). `wall` holds the stretch's length."""
    width = len(samples[0].consumers) if samples else 0
    best = [0.0] * width
    best_azurite: float | None = None if not samples or samples[0].azurite is None else 0.0
    begin = 0
    for end, sample in enumerate(samples):
        while sample.wall - samples[begin].wall > seconds:
            begin += 1
        span = sample.wall - samples[begin].wall
        if end == begin or span < seconds / 2:
            continue
        first = samples[begin]
        for i in range(width):
            best[i] = max(best[i], (sample.consumers[i] - first.consumers[i]) / span)
        if best_azurite is not None and sample.azurite is not None and first.azurite is not None:
            best_azurite = max(best_azurite, (sample.azurite - first.azurite) / span)
    return CpuSample(seconds, tuple(best), best_azurite)


@dataclass(frozen=True)
class Approval:
    at: float  # epoch seconds: the Decision's TimeGenerated
    event_id: str
    rule: str
    target: str | None


def epoch(text: object) -> float:
    if not isinstance(text, str):
        raise TypeError(f"not a record time: {text!r}")
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def clock(at: float) -> str:
    """Epoch seconds as the records write times."""
    return datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="milliseconds")


def approvals_of(decisions: Iterable[Mapping[str, Any]]) -> list[Approval]:
    """Every Approve Decision, oldest first."""
    found = [
        Approval(
            epoch(d["TimeGenerated"]),
            str(d["EventId"]).upper(),
            str(d["DecisionRule"]),
            d.get("TargetVmId"),
        )
        for d in decisions
        if d.get("DecisionAction") == "Approve"
    ]
    return sorted(found, key=lambda a: a.at)


@dataclass
class Latencies:
    to_decision: list[float] = field(default_factory=list)  # first record -> first Decision
    to_approval: list[float] = field(default_factory=list)  # first record -> first Approve
    undecided: list[str] = field(default_factory=list)  # reported, never decided
    actions: dict[str, int] = field(default_factory=dict)  # Decision records by action
    waits: Counter[str] = field(default_factory=Counter)  # Defer and Hold reasons, generalised

    def p(self, which: str, q: float) -> float | None:
        values = self.to_decision if which == "decision" else self.to_approval
        return percentile(values, q) if values else None


DECIDING = ("Approve", "Defer", "Hold")


def reason_kind(reason: str) -> str:
    """A Decision's reason without what names one event, group or number: its kind."""
    grouped = re.sub(r"VMs of \S+, ", "VMs of G, ", re.sub(r": \S+ has ", ": G has ", reason))
    return re.sub(r"(?<![\w-])\d[\d,.]*(?![\w-])", "N", grouped)[:90]


def latencies(events: Iterable[SimEvent], decisions: Iterable[Mapping[str, Any]]) -> Latencies:
    """How long each event waited from its first record in a hub to its first Decision."""
    first: dict[str, float] = {}
    approved: dict[str, float] = {}
    out = Latencies()
    for d in decisions:
        action = str(d.get("DecisionAction"))
        out.actions[action] = out.actions.get(action, 0) + 1
        if action in ("Defer", "Hold"):
            out.waits[f"{action}: {reason_kind(str(d.get('DecisionReason')))}"] += 1
        if action not in DECIDING:
            continue
        key, at = str(d["EventId"]).upper(), epoch(d["TimeGenerated"])
        first[key] = min(at, first.get(key, math.inf))
        if action == "Approve":
            approved[key] = min(at, approved.get(key, math.inf))
    for event in events:
        if event.first_record is None:
            continue  # no agent of it reported it (all silent or deleted)
        decided = first.get(event.event_id)
        if decided is None:
            out.undecided.append(event.event_id)
            continue
        # Decisions carry milliseconds: a decision in the same millisecond is 0, not below.
        out.to_decision.append(max(0.0, decided - event.first_record))
        if event.event_id in approved:
            out.to_approval.append(max(0.0, approved[event.event_id] - event.first_record))
    return out


def known_at(place: tuple[int, int, int], samples: Sequence[LagSample]) -> float | None:
    """When a consumer had handled the record at `place` (hub, partition, offset), as the
    first sample whose checkpoint covers it says; None if none does."""
    hub, partition, offset = place
    for sample in samples:
        if sample.checkpoints[hub][partition] >= offset:
            return sample.wall
    return None


@dataclass
class _Group:
    members: list[int]
    stops: list[float]  # sorted: when members were deleted or fell silent


class BudgetCheck:
    """The independent budget check over one run (see the module's docstring)."""

    def __init__(
        self,
        fleet: Fleet,
        stopped: Mapping[int, float],
        *,
        alive_within: float,
        slack: float,
        budgets: Sequence[BudgetSpec] = BUDGETS,
    ) -> None:
        self.fleet, self.stopped, self.budgets = fleet, stopped, budgets
        self.grace = alive_within + slack
        self.groups: dict[tuple[str, str], _Group] = {}
        for vm in fleet:
            for budget in budgets:
                key = group_of(budget, vm)
                if key is not None:
                    group = self.groups.setdefault((budget.name, key), _Group([], []))
                    group.members.append(vm.index)
        for group in self.groups.values():
            group.stops = sorted(stopped[i] for i in group.members if i in stopped)

    def _live(self, index: int, at: float) -> bool:
        gone = self.stopped.get(index)
        return gone is None or at <= gone

    def _size(self, group: _Group, at: float) -> int:
        return len(group.members) - bisect.bisect_left(group.stops, at - self.grace)

    def violations(
        self,
        events: Mapping[str, SimEvent],
        approvals: Sequence[Approval],
        samples: Sequence[LagSample],
    ) -> list[str]:
        starts: list[tuple[float, str]] = []  # (impact begins, event) for every event
        first_approval: dict[str, float] = {}
        for approval in approvals:
            first_approval.setdefault(approval.event_id, approval.at)
        for key, event in events.items():
            begins = [first_approval[key]] if key in first_approval else []
            if event.started_by == "platform" and event.start_place is not None:
                known = known_at(event.start_place, samples)
                begins += [known] if known is not None else []
            if begins:
                starts.append((min(begins), key))
        starts.sort()
        impacted: dict[tuple[str, str], dict[int, int]] = {}  # group -> VM -> events
        ending: list[tuple[float, str]] = []
        cursor = 0
        found: list[str] = []
        for at, key in sorted((a, k) for k, a in first_approval.items()):
            while ending and ending[0][0] <= at:
                self._count(impacted, events[heapq.heappop(ending)[1]], -1)
            while cursor < len(starts) and starts[cursor][0] < at:
                other = starts[cursor][1]
                cursor += 1
                event = events[other]
                end = event.ended if event.ended is not None else math.inf
                if end > at:
                    self._count(impacted, event, +1)
                    heapq.heappush(ending, (end, other))
            approved = events.get(key)
            if approved is not None:
                found += self._check(impacted, approved, at)
        return found

    def _count(
        self, impacted: dict[tuple[str, str], dict[int, int]], event: SimEvent, step: int
    ) -> None:
        for index in event.vms:
            vm = self.fleet.vms[index]
            for budget in self.budgets:
                key = group_of(budget, vm)
                if key is None:
                    continue
                counts = impacted.setdefault((budget.name, key), {})
                counts[index] = counts.get(index, 0) + step
                if counts[index] <= 0:
                    del counts[index]

    def _check(
        self, impacted: dict[tuple[str, str], dict[int, int]], event: SimEvent, at: float
    ) -> list[str]:
        mine = [i for i in event.vms if self._live(i, at)]
        found = []
        for budget in self.budgets:
            keys = {group_of(budget, self.fleet.vms[i]) for i in mine} - {None}
            for key in sorted(k for k in keys if k is not None):
                group = self.groups[(budget.name, key)]
                busy = {i for i in impacted.get((budget.name, key), {}) if self._live(i, at)}
                busy |= {i for i in mine if group_of(budget, self.fleet.vms[i]) == key}
                limit = budget.limit(max(self._size(group, at), len(busy)))
                if len(busy) > limit:
                    found.append(
                        f"approving {event.event_id} ({event.event_type}) at {clock(at)} puts "
                        f"{len(busy)} VMs of {key} under maintenance; budget {budget.name} "
                        f"allows {limit} of {self._size(group, at)}"
                    )
        return found


def wrong_approvals(
    fleet: Fleet, events: Mapping[str, SimEvent], approvals: Iterable[Approval]
) -> list[str]:
    """Approvals no rule allowed: see the module's docstring."""
    found = []
    for approval in approvals:
        event = events.get(approval.event_id)
        if event is None:
            found.append(f"approved {approval.event_id}, an event the fleet never had")
            continue
        truth = first_rule(event.event_type, event.source, [fleet.vms[i] for i in event.vms])
        if truth not in APPROVING_RULES or truth != approval.rule:
            found.append(
                f"approved {approval.event_id} ({event.source} {event.event_type}) by rule "
                f"{approval.rule}; the first rule that matches it is {truth}"
            )
    return found


@dataclass(frozen=True)
class Lag:
    offered: int  # records written to the hubs in the window
    consumed: int  # records handled in the window
    seconds: float
    max_backlog: int  # records written and not yet handled, at the worst sample
    max_age: float  # the longest any record waited unhandled, at the samples
    p99_age: float
    end_backlog: int  # at the window's end

    @property
    def offered_rate(self) -> float:
        return self.offered / self.seconds if self.seconds > 0 else 0.0

    @property
    def consumed_rate(self) -> float:
        return self.consumed / self.seconds if self.seconds > 0 else 0.0


def lag(samples: Sequence[LagSample], start: float, end: float) -> Lag:
    """The hubs between wall times `start` and `end` (the first sample at or after each)."""
    window = [s for s in samples if start <= s.wall <= end]
    if len(window) < 2:
        raise ValueError("the window holds fewer than two samples")
    first, last = window[0], window[-1]
    ages = [s.oldest_age for s in window]
    return Lag(
        offered=last.written - first.written,
        consumed=last.consumed - first.consumed,
        seconds=last.wall - first.wall,
        max_backlog=max(s.written - s.consumed for s in window),
        max_age=max(ages),
        p99_age=percentile(ages, 99),
        end_backlog=last.written - last.consumed,
    )


def peak_rate(samples: Sequence[LagSample], seconds: float = 10.0) -> float:
    """The highest rate of handled records over any `seconds`-long stretch of samples."""
    best, begin = 0.0, 0
    for end, sample in enumerate(samples):
        while sample.wall - samples[begin].wall > seconds:
            begin += 1
        span = sample.wall - samples[begin].wall
        if end > begin and span >= seconds / 2:
            best = max(best, (sample.consumed - samples[begin].consumed) / span)
    return best
