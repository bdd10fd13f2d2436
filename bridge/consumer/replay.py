"""What-if: recorded history through a policy, and what would have differed from what was
decided (`se-bridge policy replay`, docs/policy.md#replaying-history).

Records in, a `Replay` out; no I/O, and the only clock is the records' own TimeGenerated.
The history is what the agents recorded (Heartbeat, Event, Hook and Approval records) and
what the consumer decided (its Decision records), from a Log Analytics export or the jsonl
files of the agents' and the consumer's sinks. A sample, one record a line:

    {"RecordType": "Heartbeat", "VmId": "1b1f...", "VmName": "web_0", ...}
    {"RecordType": "Event", "VmId": "1b1f...", "EventId": "C7061BAC-...",
     "EventStatus": "Scheduled", "TimeGenerated": "2026-11-21T10:00:00.000Z", ...}
    {"RecordType": "Decision", "EventId": "C7061BAC-...", "DecisionAction": "Approve",
     "DecisionRule": "user-initiated", "TargetVmId": "1b1f...", "CommandId": "3d0c...", ...}
    {"RecordType": "Approval", "VmId": "1b1f...", "CommandId": "3d0c...",
     "ApprovalOutcome": "Approved", ...}

The agents' records go, in TimeGenerated order, through the production consumer
(bridge.consumer.core.Consumer: its fold, its decision pass, the policy's `evaluate`, the
ledger) over an in-memory state, on a clock set to each batch's time, with the re-evaluation
pass (`tick`) as `Replayer` says. Nothing is re-implemented: a replay cannot drift from what
the consumer does. The Decision records it says are then compared, event by event, with the
history's.

What the history answered stays the history's: the platform starts and ends events when the
records say, an approval the consumer sent is answered (or not) by the history's Approval
record. An approval the history never sent is taken as approved by its VM at once (`assumed`),
as a cooperative agent approves. What a replay cannot reproduce is marked, not counted as a
difference (`Mark`): a person's part, the agents' silence, the timing of reads, a drain the
history never ran.
"""

from __future__ import annotations

import bisect
import gc
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from itertools import chain
from typing import Literal, cast

from bridge import recordtypes as rt
from bridge.commands.message import Command
from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer.core import Consumer
from bridge.consumer.state.memory import MemoryStore
from bridge.consumer.verdicts import RELEASE_RULE
from bridge.policy.model import PERSON_RULE, Policy
from bridge.records import RecordView, is_decision, iso, parse_time

# The reason of a Defer that waits for a live VM to carry the approval (bridge.policy.evaluation):
# who is live is the agents' silence, measured on the consumer's clock.
NO_CARRIER = "no live VM reports the event to carry the approval"
# The consumer reading an event's first record later than this (its first decision's time
# less the record's) was lagging, stopped, or got the record late: what it had read then is
# not what the records' times say (docs/policy.md#what-a-replay-cannot-reproduce).
READ_LAG = timedelta(seconds=60)
# The re-evaluation pass while no event waits for one (Replayer): what only time passing
# decides (a VM's silence, an unanswered approval, a stale event) is found up to this much later
# than by the consumer, unless the history's decisions say when.
IDLE_PASS = timedelta(seconds=300)
# A history replayed as it is read (`replay_chunks`) hands a record to the replay once it has
# read one this much newer: records this far out of time order in the file cost nothing more;
# further, the history is replayed again once read.
ORDER_SLACK = timedelta(minutes=10)

MarkKind = Literal["person", "silence", "timing", "drain"]


@dataclass(frozen=True)
class Decided:
    """One decision about one event, recorded or replayed: what tells decisions apart
    (`said`: action, rule, target, reason) and the budgets' lines of its explanation."""

    at: datetime
    action: str
    rule: str | None
    reason: str
    target: str | None  # TargetVmId
    target_name: str | None
    attempt: int
    command_id: str | None
    budgets: tuple[str, ...] = ()
    person: bool = False  # a person decided it, or a pause stopped it
    asked: bool = False  # a person was asked (an ask rule)

    @property
    def said(self) -> tuple[str, str | None, str | None, str]:
        return self.action, self.rule, (self.target or "").lower() or None, self.reason


@dataclass(frozen=True)
class Mark:
    """Why the replay cannot reproduce what was decided about an event: its `kind` and a
    sentence saying what."""

    kind: MarkKind
    why: str


@dataclass(frozen=True)
class EventReplay:
    """One event: what the history decided about it and what the replay decides."""

    event_id: str
    event_type: str | None
    event_source: str | None
    resources: tuple[str, ...]
    recorded: tuple[Decided, ...]
    replayed: tuple[Decided, ...]
    marks: tuple[Mark, ...] = ()
    # Approvals the history never sent, taken as approved at once by their VMs.
    assumed: tuple[str, ...] = ()

    @property
    def differs(self) -> bool:
        return [d.said for d in self.recorded] != [d.said for d in self.replayed]

    @property
    def counted(self) -> bool:
        """A difference the replay stands by: it differs and nothing marks it."""
        return self.differs and not self.marks


@dataclass(frozen=True)
class RuleTally:
    """Per rule, how many decisions of each action the history and the replay hold."""

    rule: str
    recorded: Mapping[str, int]
    replayed: Mapping[str, int]
    differing: int  # events that differ (counted) where this rule decided, on either side


@dataclass(frozen=True)
class Replay:
    events: tuple[EventReplay, ...]
    rules: tuple[RuleTally, ...]
    records: int  # the agents' records replayed
    decisions: int  # the Decision records of the history compared
    first: datetime | None
    last: datetime | None
    recorded_policies: tuple[str, ...]  # PolicySource of the history's decisions
    mode: str | None  # DecisionMode of the history's decisions compared

    @property
    def differing(self) -> tuple[EventReplay, ...]:
        return tuple(e for e in self.events if e.counted)

    @property
    def marked(self) -> tuple[EventReplay, ...]:
        return tuple(e for e in self.events if e.differs and e.marks)


# --- the history split, and its clock -------------------------------------------------------


@dataclass(frozen=True)
class History:
    """The records as the replay reads them: the agents' in time order (file order among
    equals), the consumer's Decision records compared (one DecisionMode), and the times the
    history shows the consumer deciding."""

    agents: tuple[RecordView, ...]
    decisions: tuple[rt.Decision, ...]
    mode: str | None
    # Each agent's record's TimeGenerated as `parse_time` reads it (None: it has none), read
    # here once for `Replayer.feed` rather than again there (issue 40).
    times: tuple[datetime | None, ...] = ()

    @classmethod
    def of(cls, records: Iterable[RecordView]) -> History:
        timed: list[tuple[datetime, int, RecordView, datetime | None]] = []
        said: list[tuple[datetime, rt.Decision]] = []
        last: datetime | None = None
        for n, record in enumerate(records):
            stamped = parse_time(record.get("TimeGenerated"))
            at = stamped or last
            if at is None:
                continue
            last = at
            if is_decision(record):
                said.append((at, record))
            else:
                timed.append((at, n, record, stamped))
        timed.sort()  # by time, then file order: no two share `n`, no record is compared
        decisions, mode = _compared(said)
        return cls(
            tuple(r for _, _, r, _ in timed),
            decisions,
            mode,
            tuple(stamped for _, _, _, stamped in timed),
        )


def _compared(
    said: Iterable[tuple[datetime, rt.Decision]],
) -> tuple[tuple[rt.Decision, ...], str | None]:
    """The Decision records (each with its time, in file order) a replay compares, in time
    order, and their DecisionMode."""
    unique: dict[tuple[str, str], rt.Decision] = {}
    for at, record in said:
        # The same record delivered twice is one (its RecordId and time); the same decision
        # said again later is another.
        unique.setdefault((str(record["RecordId"]), iso(at)), record)
    modes = {str(d.get("DecisionMode") or "normal") for d in unique.values()}
    mode = "normal" if "normal" in modes else next(iter(modes), None)
    decisions = sorted(
        (d for d in unique.values() if str(d.get("DecisionMode") or "normal") == mode),
        key=_time,
    )
    return tuple(decisions), mode


def _time(record: RecordView) -> datetime:
    at = parse_time(record.get("TimeGenerated"))
    assert at is not None, "History keeps only records with a time"
    return at


# --- the driver ------------------------------------------------------------------------------


class _Commands:
    """What the replayed consumer sends, kept to be answered; nothing leaves the process."""

    def __init__(self) -> None:
        self.sent: list[Command] = []

    def send(self, command: Command, time_to_live: float) -> None:
        self.sent.append(command)

    def close(self) -> None:
        pass


class Replayer:
    """The production consumer over an in-memory state, fed a history on the history's clock.

    `sent`: the commands the history sent (its Decision records name their CommandIds, which
    are the same for the same event, VM and kind) and when. An approval the replay sends that
    the history did not send by then (give or take `read_lag`, how much later the consumer
    may have read a record than it was written) is answered at once, as its VM would have;
    what the history holds answers the others.

    The re-evaluation pass (`tick`) runs every consumer.reevaluate_interval while an event
    waits for one (its last decision a Defer or an Ask), else every IDLE_PASS, and at the
    time of each decision of the history the replay has not taken (`feed`). A pass over
    events that wait for nothing decides nothing, and one at every interval of a month (half
    a million, each reading every event of the last stale_after) is what a replay would
    spend its time on. What a pass finds only by time passing (a VM silent for alive_within,
    an approval unanswered for approval_timeout, a stale event) it finds up to IDLE_PASS
    later than the consumer did, unless the history's decisions say when.
    """

    def __init__(
        self,
        policy: Policy,
        settings: ConsumerSettings,
        start: datetime,
        *,
        sent: Mapping[str, datetime] | None = None,
        read_lag: timedelta = READ_LAG,
        last_resort: bool = False,
    ) -> None:
        self.clock = start
        self.decisions: list[rt.Decision] = []
        self._commands = _Commands()
        self.consumer = Consumer(
            MemoryStore(),
            self._commands,
            policy,
            self.decisions.extend,
            replace(settings, mode="normal"),
            now=lambda: self.clock,
            host_name="replay",
        )
        self.consumer.decider.last_resort = last_resort  # ARM's acknowledge, as the live one
        # The in-memory state has no other client: no event leaves it but those the consumer
        # forgets (and drops from its index), so the change feed keeps the index whole, and
        # reading every event again at each idle pass was a fifth of a large replay (issue 40).
        self.consumer.fleet.events.rescan = None
        self._sent = dict(sent or {})
        self._lag = read_lag
        self.assumed: dict[str, list[str]] = {}  # event key -> CommandIds answered by us
        self.prepared: dict[str, list[str]] = {}  # event key -> VMs granted a drain by us
        self._interval = timedelta(seconds=settings.reevaluate_interval)
        self._idle = max(self._interval, IDLE_PASS)
        self._ticked = start
        self._waiting: set[str] = set()  # events a pass may decide again
        self._noted = 0  # decisions looked at for `_waiting`
        self._latest: dict[str, tuple[str, str | None, str | None, str]] = {}  # event -> said

    def close(self) -> None:
        self.consumer.close()

    @property
    def _next_tick(self) -> datetime:
        return self._ticked + (self._interval if self._waiting else self._idle)

    def feed(
        self,
        records: Sequence[RecordView],
        decided: Sequence[rt.Decision] = (),
        *,
        times: Sequence[datetime | None] = (),
    ) -> None:
        """Fold `records` (in time order) batch by batch, each on its own time, with the
        re-evaluation passes due between them, and one at the time of each of `decided` (the
        history's Decision records) that the replay has not decided so already: the consumer
        took it in a pass. A batch is one time's records, or a run of heartbeats up to the
        next pass (a heartbeat decides nothing; folding each alone costs half as much
        again). `times`: each record's TimeGenerated as `parse_time` reads it, when the
        caller has read them (`History.times`)."""
        stamps = times or [parse_time(r.get("TimeGenerated")) for r in records]
        self.feed_timed(zip(records, stamps, strict=True), decided)

    def feed_timed(
        self,
        timed: Iterable[tuple[RecordView, datetime | None]],
        decided: Sequence[rt.Decision] = (),
    ) -> None:
        """`feed` of the records with their times as `parse_time` reads them, taken one by
        one as they come (`replay_chunks`: a history still being read)."""
        hints = iter(sorted((_time(d), n) for n, d in enumerate(decided)))
        hint = next(hints, None)
        pending = hint[0] if hint else None
        batch: list[RecordView] = []
        at: datetime | None = None
        beats = True
        with _quiet():
            for record, stamped in timed:
                when = stamped or at or self.clock
                beat = record.get(rt.RECORD_TYPE) == "Heartbeat"
                if batch and at is not None and when != at and not (beats and beat):
                    self._process(batch, at)
                    batch, beats = [], True
                while True:  # the passes due before this record
                    due = min(self._next_tick, pending) if pending else self._next_tick
                    if due >= when:  # a pass at a batch's time comes after the batch
                        break
                    if batch and at is not None:
                        self._process(batch, at)
                        batch, beats = [], True
                        continue  # what it decided may bring the next pass forward
                    if pending is not None and due == pending:
                        if self._differs(decided[hint[1]] if hint else None):
                            self._tick(due)
                        hint = next(hints, None)
                        pending = hint[0] if hint else None
                    else:
                        self._tick(due)
                if not beat:
                    self._heard(record)
                batch.append(record)
                at, beats = when, beats and beat
            if batch and at is not None:
                self._process(batch, at)
            while hint is not None:  # the history's last decisions
                if self._differs(decided[hint[1]]):
                    self._tick(hint[0])
                hint = next(hints, None)

    def until(self, end: datetime) -> None:
        """Run the re-evaluation passes due up to `end` (after the last record)."""
        with _quiet():
            while self._next_tick <= end:
                self._tick(self._next_tick)

    def _process(self, batch: list[RecordView], at: datetime) -> None:
        self.clock = max(self.clock, at)
        self.consumer.process(batch)
        self._answer()

    def _tick(self, at: datetime) -> None:
        self.clock = max(self.clock, at)
        self._ticked = max(self._ticked, at)
        self.consumer.tick()
        self._answer()

    def _differs(self, theirs: rt.Decision | None) -> bool:
        """Whether the replay stands on another decision about the event of `theirs` than
        the history's record says was taken then."""
        if theirs is None or _about_no_event(theirs):
            return False
        return self._latest.get(fs.event_key(theirs["EventId"])) != decided(theirs).said

    def _heard(self, record: RecordView) -> None:
        """An event no longer Scheduled (for the VM that says so) waits for no pass."""
        if record.get(rt.RECORD_TYPE) == "Event" and record.get("EventStatus") != "Scheduled":
            self._waiting.discard(fs.event_key(str(record.get("EventId"))))

    def _answer(self) -> None:
        """Note which events wait for a pass, from the decisions just said; answer the
        approvals the history never sent, as their VMs would have at once (the ledger's own
        fold of an Approval record); a Prepare the history never sent is noted: nothing can
        say how its drain would have gone."""
        for decision in self.decisions[self._noted :]:
            if _about_no_event(decision):
                continue
            key, action = fs.event_key(decision["EventId"]), decision["DecisionAction"]
            self._latest[key] = decided(decision).said
            if action in ("Defer", "Ask"):
                self._waiting.add(key)
            else:
                self._waiting.discard(key)
        self._noted = len(self.decisions)
        sent, self._commands.sent = self._commands.sent, []
        answers: list[RecordView] = []
        for command in sent:
            theirs = self._sent.get(command.command_id)
            if theirs is not None and theirs <= self.clock + self._lag:
                continue
            key = fs.event_key(command.event_id)
            if command.type == "Prepare":
                self.prepared.setdefault(key, []).append(command.vm_id)
                continue
            self.assumed.setdefault(key, []).append(command.command_id)
            answers.append(_approved(command, self.clock))
        if answers:
            self.consumer.ledger.note_approvals(answers)


def _approved(command: Command, now: datetime) -> RecordView:
    """The part of an Approval record the ledger reads: the command's VM approved it."""
    return {
        rt.RECORD_TYPE: "Approval",
        "TimeGenerated": iso(now),
        "VmId": command.vm_id,
        "EventId": command.event_id,
        "CommandId": command.command_id,
        "ApprovalSource": "Central",
        "ApprovalOutcome": "Approved",
        "ApprovalDetail": "assumed by the replay: the history never sent this approval",
    }


@contextmanager
def _quiet() -> Iterator[None]:
    """A replay's decisions are not news: the consumer's INFO lines about them (approved,
    sent) would read as if something had happened."""
    chatty = logging.getLogger("bridge.consumer")
    level = chatty.level
    chatty.setLevel(logging.WARNING)
    try:
        yield
    finally:
        chatty.setLevel(level)


@contextmanager
def collector_off() -> Iterator[None]:
    """Python's cycle collector paused while a history is read or replayed, and resumed after
    (one paused before stays paused). A replay makes few cycles (about 19,000 objects of them
    for 100,000 records, freed once the collector runs again), but each of the collector's
    passes walks the records held in memory, a million for a large history, again and again:
    a quarter of the time of reading a history and of replaying it (issue 40,
    docs/benchmarks.md, 13)."""
    running = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if running:
            gc.enable()


# --- the replay -------------------------------------------------------------------------------


def replay(
    records: Iterable[RecordView],
    policy: Policy,
    settings: ConsumerSettings,
    *,
    last_resort: bool = False,
    read_lag: timedelta = READ_LAG,
) -> Replay:
    """`records` (a history: agents' records and the consumer's Decision records, in any
    order) through `policy`, and what would have differed from what was decided."""
    with collector_off():
        return _replay(records, policy, settings, last_resort=last_resort, read_lag=read_lag)


def _replay(
    records: Iterable[RecordView],
    policy: Policy,
    settings: ConsumerSettings,
    *,
    last_resort: bool,
    read_lag: timedelta,
) -> Replay:
    history = History.of(records)
    first, last = _span(history.agents, history.decisions)
    if first is None or last is None:
        return _outcome(history, None, first, last, read_lag)
    replayer = _replayer(
        history.decisions, first, policy, settings, read_lag=read_lag, last_resort=last_resort
    )
    try:
        replayer.feed(history.agents, history.decisions, times=history.times)
        replayer.until(last)
    finally:
        replayer.close()
    return _outcome(history, replayer, first, last, read_lag)


def replay_chunks(
    chunks: Iterable[Sequence[RecordView]],
    decisions: Sequence[RecordView],
    policy: Policy,
    settings: ConsumerSettings,
    *,
    last_resort: bool = False,
    read_lag: timedelta = READ_LAG,
) -> Replay:
    """`replay` of a history still being read: `chunks`, its records in file order a chunk at
    a time (a large file as a helper process reads it, bridge.consumer.explain.Chunked), are
    replayed as they come, the reading of one beside the replay of the others (issue 40: a
    million records in under a minute, docs/benchmarks.md, 13). `decisions`: the history's
    Decision records in file order, read ahead of the rest (a replay needs them all from its
    start).

    That holds while every chunk's records come after the last chunk's in time, as a file
    written as records come does, and the chunks' Decision records are `decisions`. Where
    either does not, every record is read and replayed again, all at once, as `replay` does:
    the result is `replay`'s of every chunk's records, always."""
    with collector_off():
        stream = _InOrder(chunks)
        if any(parse_time(d.get("TimeGenerated")) is None for d in decisions):
            # Such a record takes its time from the record before it: not known ahead.
            return _replay(stream.rest(), policy, settings, last_resort=last_resort,
                           read_lag=read_lag)  # fmt: skip
        told, mode = _compared((_time(d), cast(rt.Decision, d)) for d in decisions)
        timed = iter(stream)
        head = next(timed, None)
        if head is not None:
            first, _ = _span([head[0]], told)
            assert first is not None, "a record with a time"
            replayer = _replayer(
                told, first, policy, settings, read_lag=read_lag, last_resort=last_resort
            )
            whole = False
            try:
                replayer.feed_timed(chain([head], timed), told)
                whole = [d for _, d in stream.said] == list(decisions)
                history = History(tuple(stream.agents), told, mode, tuple(stream.times))
                _, last = _span(history.agents, told)
                if whole and last is not None:
                    replayer.until(last)
            except _Unordered:
                whole = False
            finally:
                replayer.close()
            if whole:
                return _outcome(history, replayer, first, last, read_lag)
        return _replay(stream.rest(), policy, settings, last_resort=last_resort,
                       read_lag=read_lag)  # fmt: skip


class _Unordered(Exception):
    """A chunk holds a record from before the last chunk's newest: `History.of` orders them
    otherwise than the chunks come."""


class _InOrder:
    """The agents' records of `chunks` (a history's records in file order, a chunk at a time)
    as `History.of` orders them, each with its time as `parse_time` reads it. A record is
    handed on once the chunks have shown one ORDER_SLACK newer (what a file written as records
    come holds out of order is seconds apart: each VM's clock, the order they arrived in);
    one from before a record handed on already raises _Unordered. Every record read is kept
    (`read`), and the agents' and Decision records as they pass."""

    def __init__(self, chunks: Iterable[Sequence[RecordView]]) -> None:
        self._chunks = iter(chunks)
        self.read: list[RecordView] = []
        self.agents: list[RecordView] = []
        self.times: list[datetime | None] = []
        self.said: list[tuple[datetime, rt.Decision]] = []
        self._last: datetime | None = None

    def __iter__(self) -> Iterator[tuple[RecordView, datetime | None]]:
        waiting: list[tuple[datetime, int, RecordView, datetime | None]] = []
        handed: datetime | None = None  # the time of the last record handed on
        for chunk in self._chunks:
            timed: list[tuple[datetime, int, RecordView, datetime | None]] = []
            for n, record in enumerate(chunk, len(self.read)):
                stamped = parse_time(record.get("TimeGenerated"))
                at = stamped or self._last
                if at is None:
                    continue
                self._last = at
                if is_decision(record):
                    self.said.append((at, record))
                else:
                    timed.append((at, n, record, stamped))
            self.read += chunk
            if not timed:
                continue
            # Equal times go in file order, as History.of orders them: after those handed on.
            if handed is not None and min(t[0] for t in timed) < handed:
                raise _Unordered
            waiting += timed
            waiting.sort()  # by time, then file order (History.of's order)
            ready = bisect.bisect_right(waiting, waiting[-1][0] - ORDER_SLACK, key=_at)
            if ready:
                handed = waiting[ready - 1][0]
                yield from self._hand(waiting[:ready])
                del waiting[:ready]
        yield from self._hand(waiting)

    def _hand(
        self, timed: Sequence[tuple[datetime, int, RecordView, datetime | None]]
    ) -> Iterator[tuple[RecordView, datetime | None]]:
        for _, _, record, stamped in timed:
            self.agents.append(record)
            self.times.append(stamped)
            yield record, stamped

    def rest(self) -> list[RecordView]:
        """Every record, in file order: those read and those not yet."""
        for chunk in self._chunks:
            self.read += chunk
        return self.read


def _at(timed: tuple[datetime, int, RecordView, datetime | None]) -> datetime:
    return timed[0]


def _span(
    agents: Sequence[RecordView], decisions: Sequence[rt.Decision]
) -> tuple[datetime | None, datetime | None]:
    """The first and the last time of a history (its agents' records and its decisions, each
    in time order)."""
    times = [_time(r) for r in (*agents[:1], *agents[-1:])]
    times += [_time(d) for d in decisions[:1]] + [_time(d) for d in decisions[-1:]]
    return (min(times), max(times)) if times else (None, None)


def _replayer(
    decisions: Sequence[rt.Decision],
    first: datetime,
    policy: Policy,
    settings: ConsumerSettings,
    *,
    read_lag: timedelta,
    last_resort: bool,
) -> Replayer:
    sent: dict[str, datetime] = {}
    for d in decisions:
        if d.get("CommandId"):
            sent.setdefault(str(d["CommandId"]), _time(d))
    return Replayer(policy, settings, first, sent=sent, read_lag=read_lag, last_resort=last_resort)


def _outcome(
    history: History,
    replayer: Replayer | None,
    first: datetime | None,
    last: datetime | None,
    read_lag: timedelta,
) -> Replay:
    replayed: list[rt.Decision] = replayer.decisions if replayer else []
    assumed: dict[str, list[str]] = replayer.assumed if replayer else {}
    prepared: dict[str, list[str]] = replayer.prepared if replayer else {}
    events = compare(history, replayed, assumed, prepared, read_lag=read_lag)
    return Replay(
        events=events,
        rules=tally(events),
        records=len(history.agents),
        decisions=sum(1 for d in history.decisions if not _about_no_event(d)),
        first=first,
        last=last,
        recorded_policies=tuple(sorted({str(d["PolicySource"]) for d in history.decisions})),
        mode=history.mode,
    )


def _about_no_event(record: RecordView) -> bool:
    """A pause's or a resume's record names what it covers, in parentheses, not an event."""
    return str(record.get("EventId") or "").startswith("(")


def decided(record: rt.Decision) -> Decided:
    """A Decision record as the replay compares it."""
    explanation = str(record.get("DecisionExplanation") or "").splitlines()
    return Decided(
        at=_time(record),
        action=str(record["DecisionAction"]),
        rule=record.get("DecisionRule"),
        reason=str(record.get("DecisionReason") or ""),
        target=record.get("TargetVmId"),
        target_name=record.get("TargetVmName"),
        attempt=int(record.get("Attempt") or 0),
        command_id=record.get("CommandId"),
        budgets=tuple(line for line in explanation if line.startswith("budget ")),
        person=record.get("DecisionRule") == PERSON_RULE
        or bool(record.get("DecidedBy"))
        or bool(record.get("PauseScope")),
        asked=record["DecisionAction"] == "Ask" or bool(record.get("AskedTarget")),
    )


def compare(
    history: History,
    replayed: Sequence[rt.Decision],
    assumed: Mapping[str, Sequence[str]] | None = None,
    prepared: Mapping[str, Sequence[str]] | None = None,
    *,
    read_lag: timedelta = READ_LAG,
) -> tuple[EventReplay, ...]:
    """Each event the history's agents reported or either side decided about, with the
    decisions of both sides and why a difference cannot be reproduced, if it cannot.
    Pure."""
    assumed, prepared = assumed or {}, prepared or {}
    mine = _by_event([r for r in replayed if not _about_no_event(r)])
    theirs = _by_event([r for r in history.decisions if not _about_no_event(r)])
    told = _told(history.agents)
    late = _late_reads(history, theirs, read_lag)
    unanswered = _unanswered(history)
    found = []
    for key in sorted(told.keys() | mine.keys() | theirs.keys(), key=lambda k: _first(k, told)):
        recorded = tuple(decided(r) for r in theirs.get(key, ()))
        ours = tuple(decided(r) for r in mine.get(key, ()))
        sample = (told.get(key) or [*theirs.get(key, ()), *mine.get(key, ())])[0]
        event = EventReplay(
            event_id=str(sample.get("EventId")),
            event_type=_text(sample.get("EventType")),
            event_source=_text(sample.get("EventSource")),
            resources=tuple(str(n) for n in _list(sample.get("Resources"))),
            recorded=recorded,
            replayed=ours,
            assumed=tuple(assumed.get(key, ())),
        )
        if event.differs:
            event = replace(
                event,
                marks=_marks(event, late, unanswered.get(key, ()), prepared.get(key, ())),
            )
        found.append(event)
    return tuple(found)


def _by_event(records: Sequence[rt.Decision]) -> dict[str, list[rt.Decision]]:
    by: dict[str, list[rt.Decision]] = {}
    for record in records:
        by.setdefault(fs.event_key(record["EventId"]), []).append(record)
    return by


def _told(agents: Sequence[RecordView]) -> dict[str, list[RecordView]]:
    """The agents' Event records of each event, in time order."""
    told: dict[str, list[RecordView]] = {}
    for record in agents:
        event_id = record.get("EventId")
        if record.get(rt.RECORD_TYPE) == "Event" and isinstance(event_id, str):
            told.setdefault(fs.event_key(event_id), []).append(record)
    return told


def _first(key: str, told: Mapping[str, Sequence[RecordView]]) -> tuple[str, str]:
    """Events in the order they were first reported (those no agent reported last)."""
    records = told.get(key)
    return (str(records[0].get("TimeGenerated")) if records else "~", key)


def _late_reads(
    history: History, theirs: Mapping[str, Sequence[rt.Decision]], lag: timedelta
) -> list[tuple[datetime, datetime, str]]:
    """When the consumer read late: from an event's first record to its first decision,
    where that took longer than `lag` (`READ_LAG`), with the event's id."""
    first: dict[str, datetime] = {}
    for record in history.agents:
        event_id = record.get("EventId")
        if record.get(rt.RECORD_TYPE) == "Event" and isinstance(event_id, str):
            first.setdefault(fs.event_key(event_id), _time(record))
    late = []
    for key, decisions in theirs.items():
        began, ended = first.get(key), _time(decisions[0])
        if began is not None and ended - began > lag:
            late.append((began, ended, str(decisions[0]["EventId"])))
    return late


def _unanswered(history: History) -> dict[str, list[str]]:
    """Per event, the approvals the history sent that no Approval record answered."""
    answers = {
        str(r.get("CommandId"))
        for r in history.agents
        if r.get(rt.RECORD_TYPE) == "Approval" and r.get("CommandId")
    }
    found: dict[str, list[str]] = {}
    for record in history.decisions:
        command = record.get("CommandId")
        if command and record["DecisionAction"] == "Approve" and command not in answers:
            found.setdefault(fs.event_key(record["EventId"]), []).append(str(command))
    return found


def _marks(
    event: EventReplay,
    late: Sequence[tuple[datetime, datetime, str]],
    unanswered: Sequence[str],
    prepared: Sequence[str],
) -> tuple[Mark, ...]:
    """Why the difference of `event` is not the policy's alone, if it is not."""
    both = (*event.recorded, *event.replayed)
    marks = []
    if any(d.person for d in event.recorded):
        marks.append(Mark("person", "a person decided it, or a pause held it"))
    if any(d.asked for d in both):
        marks.append(Mark("person", "a person was asked: the replay cannot know the answer"))
    if any(d.rule == RELEASE_RULE or NO_CARRIER in d.reason for d in both):
        marks.append(
            Mark("silence", "it turned on which agents were silent, on the consumer's clock")
        )
    if unanswered:
        marks.append(
            Mark(
                "silence",
                "no Approval record answers an approval the consumer sent: it asked the "
                "next VM after consumer.approval_timeout",
            )
        )
    if prepared:
        marks.append(
            Mark(
                "drain",
                "the replay grants a drain the history never ran "
                f"({', '.join(sorted(prepared))}): how long it would have taken is unknown",
            )
        )
    moments = [d.at for d in _first_difference(event)]
    for began, ended, event_id in late:
        if any(began <= at <= ended for at in moments):
            marks.append(
                Mark(
                    "timing",
                    f"the consumer read event {event_id} {(ended - began).total_seconds():.0f} s "
                    f"after its first record ({iso(began)} to {iso(ended)}): what it had "
                    "read then is not what the records' times say",
                )
            )
            break
    return tuple(marks)


def _first_difference(event: EventReplay) -> list[Decided]:
    """The first decision of each side where the two sides part."""
    for a, b in zip(event.recorded, event.replayed, strict=False):
        if a.said != b.said:
            return [a, b]
    n = min(len(event.recorded), len(event.replayed))
    return [*event.recorded[n : n + 1], *event.replayed[n : n + 1]]


def tally(events: Sequence[EventReplay]) -> tuple[RuleTally, ...]:
    """Per rule, the decisions each side took by action, and the events that differ."""
    recorded: dict[str, Counter[str]] = {}
    replayed: dict[str, Counter[str]] = {}
    differing: Counter[str] = Counter()
    for event in events:
        for side, decisions in ((recorded, event.recorded), (replayed, event.replayed)):
            for d in decisions:
                side.setdefault(d.rule or "", Counter())[d.action] += 1
        if event.counted:
            for rule in {d.rule or "" for d in (*event.recorded, *event.replayed)}:
                differing[rule] += 1
    return tuple(
        RuleTally(rule, dict(recorded.get(rule, {})), dict(replayed.get(rule, {})), differing[rule])
        for rule in sorted(recorded.keys() | replayed.keys())
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []
