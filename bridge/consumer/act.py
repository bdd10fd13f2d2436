"""The decision pass: each event planned on the state held (bridge.consumer.decide), and for
those with something to do, read again, planned again and the Steps carried out.

The plan's Steps carry what they write and send as values (bridge.consumer.verdicts). Order
of effects for an approval, so that a crash anywhere loses none and doubles none: the ledger
entry (budget and target) is written first with its ETag; then the Decision record; then
the command; then the entry is marked sent. A crash before "sent" makes the
next pass resend the same command (same CommandId), never a second approval. This pass is
the ledger's writer for decisions: bridge.consumer.dispatch only says and sends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from bridge.commands.message import Command
from bridge.consumer import documents as fs
from bridge.consumer import verdicts
from bridge.consumer.decide import (
    AGAIN,
    DONE,
    NEXT,
    Apply,
    Ended,
    Grant,
    Grow,
    NoteStarted,
    Outcome,
    Release,
    Resend,
    Rules,
    Shrink,
    Situation,
    Step,
    Unrelease,
    ended,
    locks_first,
    plan,
)
from bridge.consumer.dispatch import Dispatch
from bridge.consumer.drains import with_grants
from bridge.consumer.fleet import Fleet
from bridge.consumer.fold import Once
from bridge.consumer.ledger import ApprovalLedger, LedgerState
from bridge.consumer.people.operatorlog import OperatorLog
from bridge.consumer.reading import ReadMarks
from bridge.consumer.state import Conflict, Doc
from bridge.consumer.views import VmSnapshot
from bridge.policy.model import FleetView, VmView
from bridge.redact import describe
from bridge.retry import RetryableError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Acting:
    """What the Steps of one event are carried out on: the ledger state it was planned on,
    the event as read, the VMs, the time; `fresh`: the state was read for this event (not
    the pass's), so an unsent approval in it was not sent by another consumer meanwhile."""

    state: LedgerState
    doc: Doc
    vms: Mapping[str, VmView]
    now: datetime
    fresh: bool


@dataclass(frozen=True)
class Planned:
    """What the first Step of an event, planned on a copy of it (`doc`) and the pass's ledger
    `state` at `now`, is; `situation`: what it was planned on (None for an ended event).

    Planning builds the Step's values (the Decision record, the signed command), so an
    event read again unchanged, on the same state, is carried out on this plan rather than
    planned a second time: the second build cost benchmark 5a 2 to 8% (issue 38)."""

    doc: Doc
    state: LedgerState
    version: int  # the state's when planned: it changes in place as it is read and committed
    now: datetime
    step: Step
    situation: Situation | None

    def holds_for(self, doc: Doc, state: LedgerState) -> bool:
        """Whether `doc` read again on `state` is what this was planned on: the same stored
        version of the event (an ETag names one value) on the same state, unchanged since."""
        return (
            state is self.state
            and state.version == self.version
            and doc.etag is not None
            and doc.etag == self.doc.etag
        )


class DecisionPass:
    """The decision pass over a set of events, and the Steps it carries out."""

    def __init__(
        self,
        fleet: Fleet,
        ledger: ApprovalLedger,
        dispatch: Dispatch,
        marks: ReadMarks,
        rules: Rules,
        *,
        now: Callable[[], datetime],
        people: OperatorLog | None = None,
    ) -> None:
        self.fleet = fleet
        self.people = people  # what people decided (bridge.consumer.people.operatorlog)
        self.ledger = ledger
        self.dispatch = dispatch
        self.marks = marks
        self.rules = rules
        self._now = now
        self._failures = Once(10_000)  # decision failures said at ERROR
        # ARM's acknowledge carries what no live agent can (bridge.consumer.armcarrier).
        self.last_resort = False

    @property
    def costly_looks(self) -> bool:
        """Whether a look at the ledger is a query to a service (Table Storage): it returns
        every shard and lock written in its last 10 s, in a storm all 96 of them, and
        batches come many a second, most with nothing to approve (issue 15)."""
        return self.fleet.store.feed_interval > 0

    def situation(
        self, state: LedgerState, doc: Doc, known_vms: VmSnapshot, now: datetime
    ) -> Situation:
        """The live event `doc` as a decision sees it, on the ledger `state`."""
        resources = [str(r) for r in doc.value.get("resources") or []]
        impacted = known_vms.by_vm_id(
            state.impact, also=resources, version=state.version, reach=state.reach
        )
        entry = state.events.get(doc.key)
        tried = tuple(entry.get("tried", ())) if entry else ()
        unknown_for = timedelta(seconds=self.rules.settings.unknown_names_for)
        view = fs.event_view(
            fs.event_document(doc),
            known_vms.vms,
            known_vms.names,
            tried,
            now,
            unknown_for=unknown_for,
        )
        view = with_grants(view, entry)
        groups = known_vms.groups(self.rules.kinds)
        alive_within = self.rules.alive_within
        pauses = self.people.pauses(now) if self.people else ()
        if self.people is not None:
            view = replace(view, person=self.people.decision_for(view.event_id, view.resources))
        extra = known_vms.reach
        reach = {**state.reach, **extra} if extra else state.reach
        fleet = FleetView(
            known_vms.vms,
            impacted,
            alive_within,
            groups,
            reach,
            pauses=pauses,
            unhealthy=known_vms.unhealthy,
            last_resort=self.last_resort,
            patch_runs=known_vms.patch_runs,
        )
        vouched = self.marks.vouched(FleetView(known_vms.vms, {}, alive_within))
        return Situation(doc, view, fleet, entry, vouched, self.dispatch.failing())

    # --- the pass ---------------------------------------------------------------------------

    def decide(self, event_keys: Sequence[str], held: Mapping[str, Doc | None]) -> None:
        """Decide the events of a batch: on the ledger read now, or where a look is costly
        on the state kept (see `_pass`)."""
        self._pass(event_keys, held, self._look)

    def revisit(self, event_keys: Sequence[str], held: Mapping[str, Doc | None]) -> None:
        """Decide the open events on the ledger the caller has just read (the tick)."""
        self._pass(event_keys, held, lambda: None)

    def _look(self) -> None:
        if not self.costly_looks:
            self.ledger.read()

    def _pass(
        self, event_keys: Sequence[str], held: Mapping[str, Doc | None], look: Callable[[], None]
    ) -> None:
        """Decide the events `event_keys`, reading the ledger with `look` first (see below).

        `held`: copies of event documents the caller has (those the batch just stored, the
        tick's kept ones), the others are read. A copy serves to find out whether the event
        needs anything done (`plan`); only then is it read again (`_settle`): at a Spot
        eviction storm every VM of a placement group reports each event, and each sighting
        read the event twice more for a decision that did nothing (docs/capacity.md).
        """
        known_vms = self.fleet.snapshot()
        known = self._events(event_keys, held)
        # At most once for the whole pass, after the VMs: each event then starts from this
        # state (with this pass's own commits in it), and reads it again only if a commit
        # conflicts. A read per event was a query per open event per pass on Table Storage,
        # and a pass held up every batch (docs/capacity.md). Where a look is costly (see
        # `costly_looks`), a batch's pass decides on the state kept: the re-evaluation pass
        # reads it every reevaluate_interval, and this consumer's writes and the answers it
        # folds keep it. That is safe (a write that adds impact carries the ETags of its
        # groups' locks, and one changed since conflicts and reads again); on an older state
        # an event can only wait, for a slot another consumer freed meanwhile, until the next
        # re-evaluation pass.
        look()
        # The event due soonest gets a free budget slot first, then the longest waiting.
        retry: RetryableError | None = None
        for doc in sorted(known, key=fs.urgency):
            try:
                self._one(doc, known_vms)
            except RetryableError as err:  # a channel or the state: the others are decided first
                retry = retry or err
            except Exception as err:  # one event never stops the others, nor the partition
                self._failed(doc, err)
        if retry is not None:
            # The batch is handed over again (nothing checkpointed), as a failed send or
            # upload always did: what was written is finished then (an unsent approval resent).
            raise retry

    def _events(self, keys: Sequence[str], held: Mapping[str, Doc | None]) -> list[Doc]:
        """The event documents `keys` that hold an event: the copies `held`, the others read."""
        wanted = set(keys)
        found = {key: doc for key, doc in held.items() if doc is not None and key in wanted}
        found.update(self.fleet.events_of([k for k in keys if k not in held]))
        return [d for d in found.values() if d.value.get("event_type") is not None]

    def _one(self, doc: Doc, known_vms: VmSnapshot) -> None:
        planned = self.needs(doc, known_vms)
        if planned is not None:
            self._settle(doc, known_vms, planned)

    def needs(self, doc: Doc, known_vms: VmSnapshot) -> Planned | None:
        """What deciding the event in `doc` (a copy, perhaps older than the stored one) would
        do first, on the pass's ledger state; None if it would write or send nothing.

        Only what this says is needed is done, and then on the event read again: a copy too
        old to show something to do delays it to the next pass that has a newer one (every
        consumer decides what it folds, the tick what it keeps), and never decides anything.
        """
        state = self.ledger.held()
        now = self._now()
        if fs.status(fs.event_document(doc)) == fs.GONE:
            gone = ended(doc, state)
            return None if gone is None else Planned(doc, state, state.version, now, gone, None)
        s = self.situation(state, doc, known_vms, now)
        step = plan(s, self.rules, now)
        return None if step is None else Planned(doc, state, state.version, now, step, s)

    def _settle(self, doc: Doc, known_vms: VmSnapshot, first: Planned) -> None:
        """Decide the event of `doc` for real, `first` being what its copy needed."""
        now = first.now
        # The pass's state first (see `_pass`); after a conflict, what the write contested
        # and what changed it (ledger.py). Where the state kept is older than a look (Table
        # Storage), an event that adds impact first reads its groups' locks and its entry's
        # shard in the same way: on the state kept most approvals conflicted and were decided
        # twice (docs/capacity.md, "Figures behind the code's choices").
        locks = locks_first(first.step) if self.costly_looks else None
        state = self.ledger.held() if locks is None else self.ledger.read_again(doc.key, locks)
        fresh = locks is not None
        settled = self._settled(doc.key, state, known_vms, now, fresh=fresh, planned=first)
        while not settled:
            state = self.ledger.read_again(doc.key)
            settled = self._settled(doc.key, state, known_vms, now, fresh=True)

    def _settled(
        self,
        key: str,
        state: LedgerState,
        known_vms: VmSnapshot,
        now: datetime,
        *,
        fresh: bool,
        planned: Planned | None = None,
    ) -> bool:
        """Decide the event `key` on `state`; False when the ledger changed under us.

        The event is read after the ledger: whoever released it from the ledger had stored
        its end before, so a release seen there means the end is seen here. With an older
        copy, a completed event could be approved again (the release makes room and the
        ETag is fresh). Read unchanged on the state it was `planned` on, its plan stands."""
        doc = self.fleet.event(key)
        if doc is None:
            return True
        acting = Acting(state, doc, known_vms.vms, now, fresh)
        if fs.status(fs.event_document(doc)) == fs.GONE:
            # Wherever its entry is now: the state it was planned on had it.
            return self.act(Ended(key), acting) == DONE
        if planned is not None and planned.situation is not None and planned.holds_for(doc, state):
            # On the document read (the same value): the Steps change it in place as they
            # write it, and the next plan must see that.
            return self._carried(replace(planned.situation, doc=doc), acting, first=planned.step)
        return self._carried(self.situation(state, doc, known_vms, now), acting)

    def _carried(self, s: Situation, on: Acting, *, first: Step | None = None) -> bool:
        """Carry out the Steps `s` plans, on `on`, starting with `first` where it was planned
        already; False when the ledger changed under us."""
        step = first if first is not None else plan(s, self.rules, on.now)
        while step is not None:
            outcome = self.act(step, on)
            if outcome != NEXT:
                return outcome == DONE
            step = plan(s, self.rules, on.now)
        return True

    def settle(
        self, s: Situation, state: LedgerState, known_vms: VmSnapshot, now: datetime
    ) -> None:
        """Decide the event of `s` at once (a person's action, bridge.consumer.people.desk):
        its Steps carried out on `s`, built on `state` with the event read after it (as
        `_settled` reads), and after a conflict on the ledger read again. A failure is said
        as a pass says it; a RetryableError is raised."""
        key = s.doc.key
        try:
            settled = self._carried(s, Acting(state, s.doc, known_vms.vms, now, fresh=False))
            while not settled:
                state = self.ledger.read_again(key)
                settled = self._settled(key, state, known_vms, now, fresh=True)
        except RetryableError:
            raise
        except Exception as err:  # as in `_pass`: said, and tried again at every pass
            self._failed(s.doc, err)

    def _failed(self, doc: Doc, err: Exception) -> None:
        """Deciding the event in `doc` failed for good: an ERROR and a Decision record (said
        once while it lasts); the event is tried again at every pass, the others go on.

        What fails here is a value the input checks let through that breaks a decision, or
        a channel that refuses the VM for good; never a reason to hold the partition back.
        """
        level = logging.ERROR if self._failures.add(f"{doc.key} {err}") else logging.DEBUG
        log.log(
            level,
            "deciding event %s failed: %s; it is deferred, other events go on, and "
            "the next pass tries it again",
            doc.key,
            describe(err, with_type=True),
            exc_info=err if level == logging.ERROR else None,
        )
        try:
            now = self._now()
            said = verdicts.failure(
                fs.event_document(doc),
                err,
                voice=self.rules.voice,
                now=now,
                failing=self.dispatch.failing(),
            )
            if said is not None:
                self.dispatch.say(said)
        except Exception as again:
            log.error(
                "the Decision record saying event %s failed could not be written: %s",
                doc.key,
                describe(again, with_type=True),
            )

    # --- the Steps, carried out --------------------------------------------------------------

    def act(self, step: Step, on: Acting) -> Outcome:  # noqa: PLR0911 - one way per Step
        """Carry out `step` (the ledger, the event document, records and commands)."""
        match step:
            case Ended():
                return self._ended(step)
            case Release():
                return self._release(step, on)
            case Unrelease():
                self.fleet.unmark_released(step.key)
                on.doc.value.pop("released", None)
                return NEXT
            case Shrink() | Grow():
                return self._recount(step, on)
            case NoteStarted():
                self.ledger.note_started(on.state, step.key, step.view, on.vms)
                return DONE
            case Resend():
                return self._resend(step, on)
            case Apply():
                return self._apply(step, on)
            case Grant():
                return self._grant(step, on)

    def _ended(self, step: Ended) -> Outcome:
        self.ledger.release(step.key, "the event completed or was canceled")
        # A late reporter's Started record merged meanwhile found the entry still in the
        # ledger and left it there; read again after the release, so that either we see
        # that record here or its consumer saw the release and recorded it.
        after = self.fleet.event(step.key)
        if after is None or fs.status(fs.event_document(after)) == fs.GONE:
            return DONE
        return AGAIN

    def _release(self, step: Release, on: Acting) -> Outcome:
        if step.said is not None:
            # Marked first: a consumer that sees the ledger without it sees the mark.
            self.fleet.mark_released(step.key, on.now)
        self.ledger.release(step.key, step.why)
        if step.said is not None:
            self.dispatch.say(step.said)
        return AGAIN if step.again else DONE

    def _recount(self, step: Shrink | Grow, on: Acting) -> Outcome:
        entry = on.state.events[step.key]
        entry["vms"] = list(step.vms)
        if isinstance(step, Grow) and step.scopes:
            entry["scopes"] = step.scopes
        try:
            self.ledger.commit(on.state, [step.key], step.locks if isinstance(step, Grow) else ())
        except Conflict:
            return AGAIN
        if isinstance(step, Shrink):
            self.dispatch.say(step.said)
        return NEXT

    def _resend(self, step: Resend, on: Acting) -> Outcome:
        # An unsent approval in the pass's state may since have been sent, refused and
        # replaced by another consumer: resending it then would put a second approval
        # out. It is resent only from a state read for this event.
        if not on.fresh:
            return AGAIN
        command = self.dispatch.resend(step.key, step.entry, on.now)
        if command is not None:
            self.dispatch.send(command, on.now)
            self._sent(step.key, command)
        return DONE

    def _apply(self, step: Apply, on: Acting) -> Outcome:
        """A decision not said yet is said. An approval: its entry is committed (with the
        locks of its VMs' budget groups: a racing approval in one of them conflicts here,
        bridge.consumer.ledger), its Decision record said, its command sent, and the entry
        marked sent."""
        approval = step.approval
        if approval is None:
            self.dispatch.say(step.said, on.doc)
            return DONE
        on.state.events[approval.key] = approval.entry
        try:
            self.ledger.commit(on.state, [approval.key], step.locks or ())
        except Conflict:
            return AGAIN
        self.dispatch.say(step.said, on.doc)
        self.dispatch.send(approval.command, on.now)
        self._sent(approval.key, approval.command, written=on.state)
        return DONE

    def _grant(self, step: Grant, on: Acting) -> Outcome:
        """The slot first (as an approval's, under the same locks), then the Decision record,
        then a Prepare to each VM, then the entry marked prepared: a crash in between sends
        the Prepares again at the next pass (same CommandIds), never takes a second slot."""
        key = fs.event_key(step.view.event_id)
        if step.again and not on.fresh:
            return AGAIN  # as `_resend`: another consumer may have sent them meanwhile
        if step.entry is not None and step.said is not None:
            on.state.events[key] = step.entry
            try:
                self.ledger.commit(on.state, [key], step.locks)
            except Conflict:
                return AGAIN
            self.dispatch.say(step.said, on.doc)
        for command in step.prepares:
            self.dispatch.send(command, on.now)
            self.dispatch.granted(command)
        self.ledger.mark_prepared(key, written=None if step.again else on.state)
        return DONE

    def _sent(self, key: str, command: Command, *, written: LedgerState | None = None) -> None:
        """Mark the entry of `command`, just sent, sent (`written`: the ledger as just stored)."""
        self.ledger.mark_sent(
            key, command.command_id, written=written, confirmed=self.dispatch.shadow
        )
        self.dispatch.sent(command)
