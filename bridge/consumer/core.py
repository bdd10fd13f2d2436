"""The consumer core: record batches in, fleet state and approvals out.

Deployment forms (`se-bridge consume`, the Azure Functions app, the demo) are thin
wrappers: they hand batches to `Consumer.process` and call `Consumer.tick` on a timer.

A batch (a sample of the records it holds, one per line here):

    {"RecordType": "Heartbeat", "VmId": "1b1f...", "VmName": "web_0", "Tags": {"tier": "web"}, ...}
    {"RecordType": "Event", "VmId": "1b1f...", "EventId": "C7061BAC-...", "EventType": "Reboot",
     "EventSource": "User", "EventStatus": "Scheduled", "Resources": ["web_0"], ...}
    {"RecordType": "Approval", "VmId": "1b1f...", "CommandId": "3d0c...",
     "ApprovalOutcome": "Approved", ...}

This is the front; its parts: records are folded in by bridge.consumer.fold into the
documents of bridge.consumer.fleet, events are decided by bridge.consumer.decide (which
also gives the order of effects that loses no approval and doubles none), slots are
released and the fleet swept by bridge.consumer.release. Processing is idempotent:
batches may be replayed (nothing is checkpointed until `process` returns) and every merge
only moves forward. People act through their desk (bridge.consumer.people.desk), which asks
the consumer through the port at the end of `Consumer`: an event's situation, the open ones,
and to decide at once.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from bridge.channels import CommandSender
from bridge.commands.signing import Signer
from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer.act import DecisionPass
from bridge.consumer.decide import Rules, Situation
from bridge.consumer.dispatch import Dispatch
from bridge.consumer.fleet import Fleet
from bridge.consumer.fold import Intake, Once, event_mutations, vm_mutations
from bridge.consumer.ledger import ApprovalLedger, Emit, LedgerState
from bridge.consumer.notices import NoticeQueue
from bridge.consumer.people.desk import PatchAsk, PeopleDesk
from bridge.consumer.people.operatorlog import OperatorAction, OperatorLog
from bridge.consumer.reading import Position, ReadMarks
from bridge.consumer.release import Housekeeping, Pending, pending
from bridge.consumer.sources.eventgrid import HealthChange
from bridge.consumer.state import Doc, Store, update_many
from bridge.consumer.views import VmSnapshot
from bridge.policy.budgets import budget_use
from bridge.policy.evaluation import evaluate
from bridge.policy.model import EventView, FleetView, Person, Policy, Verdict, VmView
from bridge.records import RecordView, iso, parse_time, utc_now

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from bridge.consumer.patchruns import PatchRuns

log = logging.getLogger(__name__)


NOTIFY_CLOSE_SECONDS = 5.0


class Consumer:
    def __init__(
        self,
        store: Store,
        sender: CommandSender,
        policy: Policy,
        emit: Emit,
        settings: ConsumerSettings,
        *,
        now: Callable[[], datetime] = utc_now,
        host_name: str = "consumer",
        signer: Signer | None = None,
        notifier: NoticeQueue | None = None,
        trusted: Sequence[Ed25519PublicKey] = (),
        sign_again: bool = True,
        health: bool = False,
    ) -> None:
        """`signer`: the command signing key, which also signs what people decide (without
        it nobody can decide: the people desk refuses). `notifier`: where asks and people's
        decisions are told (bridge.notify); None tells nobody. `trusted`: the previous
        signing keys while they rotate (what people decided under them still applies, and is
        signed again with `signer` unless `sign_again` is off: a read-only look). `health`:
        resource health reports count in the budgets (eventgrid.health, issue 36)."""
        self.store = store
        self.policy = policy
        self.settings = settings
        self._now = now
        self._intake = Intake()
        # Event Hubs hands batches from several partition threads; one at a time keeps the
        # in-process caches simple (other consumer processes are kept apart by the ETags).
        self._lock = threading.RLock()
        self.sender = sender
        kinds = tuple(sorted({b.group for b in policy.budgets}))
        self.ledger = ApprovalLedger(store, settings, kinds)
        self.fleet = Fleet(store, now=now)
        self.fleet.vms.health_counts = health
        # Fields the agents and Event Grid disagreed on, once per event (the metrics).
        self.disagreements: Counter[str] = Counter()
        self._disagreed = Once(100_000)
        self.asks_pending = 0  # as of the last tick
        self.operators = OperatorLog(store, signer, trusted=trusted, sign_again=sign_again, now=now)
        self.dispatch = Dispatch(
            self.fleet, sender, emit, policy, host_name, mode=settings.mode, notifier=notifier
        )
        self.marks = ReadMarks(
            store, now=now, host_name=host_name, alive_within=settings.alive_within
        )
        rules = Rules(policy, settings, kinds, listening_since=now(), host_name=host_name)
        self.decider = DecisionPass(
            self.fleet,
            self.ledger,
            self.dispatch,
            self.marks,
            rules,
            now=now,
            people=self.operators,
        )
        self._housekeeping = Housekeeping(
            self.fleet, self.ledger, settings.forget_vms_after, self.operators
        )
        # What people do and are shown (the approval page, its API, the metrics, status).
        self.desk: PeopleDesk[Seen] = PeopleDesk(self, self.operators, policy, self._lock, now=now)
        self.pending = Pending()  # as of the last tick, for the metrics: no read at a scrape
        # Update Manager's patch runs (patchruns.enabled; bridge.consumer.patchruns.install).
        self.patch_runs: PatchRuns | None = None
        # When the last pass that looked found nothing open or counted; None: the next looks.
        self._looked: datetime | None = None
        # What a batch merges is replayed from Event Hubs if lost, as long as it is on disk
        # before `process` returns (then the batch may be checkpointed): flushed there. The
        # ledger is never deferred: an approval is on disk before it is sent.
        store.defer_sync((fs.VM, fs.EVENT))

    # --- batches ---------------------------------------------------------------------------

    def process(self, records: Sequence[RecordView], position: Position | None = None) -> None:
        """Fold a batch into the fleet state and decide about every event it touched.

        `position`: where the batch was read and how far its partition has been read
        (bridge.consumer.reading); the records may be none, to say only that. None from a
        caller that reads no partition.
        """
        with self._lock:
            fresh, stored = self._fold(records, position)
            touched = set(stored) | self.ledger.note_approvals(fresh)
            if touched:
                self._looked = None  # the next pass looks: there is something to look at
                self.operators.refresh(self._now())
                self.decider.decide(sorted(touched), stored)
            self.fleet.flush()
            if position is not None:
                self.marks.note(position)  # after the flush: the mark vouches for what is stored
            self._intake.remember(fresh)

    def note_health(self, changes: Sequence[HealthChange]) -> None:
        """Fold resource health changes in (the second source, issue 36) and decide again
        about the open events: a VM back to Available may free a slot. Ignored while the
        health source is off."""
        if not changes or not self.fleet.vms.health_counts:
            return
        with self._lock:
            by_key: dict[str, list[HealthChange]] = {}
            for change in changes:
                by_key.setdefault(fs.health_key(change.resource.id), []).append(change)

            def folding(mine: list[HealthChange]) -> Callable[[dict[str, Any]], bool]:
                def fold(value: dict[str, Any]) -> bool:
                    document = cast(fs.HealthDocument, value)
                    changed = [
                        fs.merge_health(document, c.resource, c.state, iso(c.at))
                        for c in sorted(mine, key=lambda c: c.at)
                    ]
                    return any(changed)

                return fold

            update_many(self.store, fs.HEALTH, {k: folding(v) for k, v in by_key.items()})
        self.tick()

    def fold(self, records: Sequence[RecordView]) -> None:
        """Fold records into the fleet state without deciding anything (`policy explain`)."""
        with self._lock:
            fresh, _ = self._fold(records)
            self.fleet.flush()
            self._intake.remember(fresh)

    def _fold(
        self, records: Sequence[RecordView], position: Position | None = None
    ) -> tuple[list[RecordView], dict[str, Doc | None]]:
        """The records not seen before, and the event documents they changed, as stored."""
        now = self._now()
        fresh = self._intake.fresh(records, now)
        if not fresh:
            return fresh, {}
        heard, partition = iso(now), position.partition if position else None
        stored = self.fleet.fold(
            vm_mutations(fresh, heard, partition), event_mutations(fresh, heard)
        )
        self._disagreements(stored)
        return fresh, stored

    def _disagreements(self, stored: Mapping[str, Doc | None]) -> None:
        """Count, once per event and field, where the agents and Event Grid tell an event
        differently (the second source's metric; `policy explain` says how)."""
        for key, doc in stored.items():
            if doc is None or "azure" not in doc.value:
                continue
            lines = fs.stored_disagreements(fs.event_document(doc))
            for name in fs.disagreement_fields(lines):
                if self._disagreed.add(f"{key}|{name}"):
                    self.disagreements[name] += 1
                    log.info(
                        "agents and Event Grid disagree about the %s of event %s: "
                        "`se-bridge policy explain --event %s` says how; the budgets "
                        "count the worse",
                        name,
                        doc.value.get("event_id"),
                        doc.value.get("event_id"),
                    )

    # --- questions -------------------------------------------------------------------------

    def budget_use(self) -> dict[str, float]:
        """Per budget, how full its fullest group is now (read only; for the metrics)."""
        with self._lock:
            return budget_use(self.policy.budgets, self.fleet_view(), self._now())

    def fleet_view(self) -> FleetView:
        """The fleet as the budgets see it now: every event, cordon, health report and patch
        run counted (read only)."""
        with self._lock:
            known = self.fleet.snapshot()
            state = self.ledger.read()
            impacted = known.by_vm_id(state.impact, reach=state.reach)
            reach = {**state.reach, **known.reach}
            return FleetView(
                known.vms, impacted, self._alive_within, reach=reach, patch_runs=known.patch_runs
            )

    def explain(self, event_id: str) -> Explained | None:
        """What the policy decides about `event_id` now, and why, as a pass would see it; once
        the event has started or is over, the decision it stood on. Nothing is written. None
        when the state holds no such event."""
        with self._lock:
            now = self._now()
            self.operators.refresh()
            seen = self.situation(event_id, now)
            if seen is None:
                return None
            s = seen.situation
            if s.view.status != "Scheduled":
                return Explained(s.view, taken=fs.event_document(s.doc).get("decision"))
            return Explained(s.view, evaluate(self.policy, s.fleet, s.view, now))

    def answer_patch_run(self, run: str, said: str, by: Person, reason: str) -> tuple[str, str]:
        """The people desk's port to the patch runs (bridge.consumer.patchruns.PatchRuns)."""
        if self.patch_runs is None:
            return "NotOpen", "patch runs are off here (patchruns.enabled)"
        return self.patch_runs.answer(run, said, by, reason)

    def patch_runs_asked(self, now: datetime) -> list[PatchAsk]:
        """The people desk's port: the patch runs a person is asked about now."""
        return [] if self.patch_runs is None else self.patch_runs.asks()

    def current_time(self) -> datetime:
        """The consumer's clock (what patch runs are counted and decided by)."""
        return self._now()

    @property
    def lock(self) -> threading.RLock:
        """The lock every decision is taken under (patch runs take it too)."""
        return self._lock

    @property
    def _alive_within(self) -> timedelta:
        return timedelta(seconds=self.settings.alive_within)

    # --- the timer -------------------------------------------------------------------------

    def tick(self) -> None:
        """Look again at every open event: deferrals, fallbacks, unsent commands, stale ones."""
        with self._lock:
            now = self._now()
            if self.patch_runs is not None:
                self.patch_runs.tick()  # an ask's deadline, a cancel to try again (issue 40)
            self.marks.look()  # the others' read marks, for the release rule of this pass
            if self._quiet(now):
                self.operators.refresh(now)
                return
            held = dict(self.ledger.entries())
            stale_after = timedelta(seconds=self.settings.stale_after)
            open_events = self._housekeeping.open_events(held, now, stale_after)
            self.pending = pending(open_events.values())
            # Every event the ledger counts, even one the kept documents miss (read before it
            # was written): the pass reads it.
            keys = sorted(open_events.keys() | held.keys())
            self.operators.refresh(now)
            self.asks_pending = sum(
                1
                for d in open_events.values()
                if d and d.value.get("decision", {}).get("kind") == "Ask"
            )
            if keys:
                self.decider.revisit(keys, open_events)  # on the ledger read just now
            self._housekeeping.sweep(now, held)
            self.fleet.flush()
            self._looked = None if keys else now

    def _quiet(self, now: datetime) -> bool:
        """Whether this pass may skip its looks at the ledger and the events: where a look
        is a query (Table Storage), the last pass found nothing open and nothing counted,
        no batch since touched an event or the ledger, it looked less than the store's
        feed_interval ago, and the hourly sweep is not due. What another consumer opened
        meanwhile is then seen up to a feed_interval later (it decides what it folds); an
        idle consumer that looked at every pass cost more than the heartbeats
        (docs/capacity.md)."""
        looked, pace = self._looked, self.store.feed_interval
        return (
            pace > 0
            and looked is not None
            and abs(now - looked) < timedelta(seconds=pace)
            and not self._housekeeping.sweep_due(now)
        )

    def close(self) -> None:
        self.sender.close()
        if self.dispatch.notifier is not None:
            # What is queued gets a few seconds to go out; a hanging webhook holds no stop.
            self.dispatch.notifier.close(NOTIFY_CLOSE_SECONDS)
        self.store.close()

    # --- the people desk's port (bridge.consumer.people.desk) ------------------------------

    def situation(self, event_id: str, now: datetime) -> Seen | None:
        """The live event `event_id` as the decision pass sees it now: the ledger read, then
        the event (the order the pass acts on; bridge.consumer.act). None when the state
        holds no such event."""
        with self._lock:
            state = self.ledger.read()
            doc = self.fleet.event(fs.event_key(event_id))
            if doc is None or doc.value.get("event_type") is None:
                return None
            known = self.fleet.snapshot()
            return seen_of(self.decider.situation(state, doc, known, now), state, known)

    def open_situations(self, now: datetime) -> list[Seen]:
        """The Scheduled events as the decision pass sees them now, the soonest first."""
        with self._lock:
            state, known = self.ledger.read(), self.fleet.snapshot()
            found = []
            for doc in sorted(self.fleet.events.scan(), key=fs.urgency):
                if (
                    doc.value.get("event_type") is None
                    or fs.status(fs.event_document(doc)) != "Scheduled"
                ):
                    continue
                s = self.decider.situation(state, doc, known, now)
                if s.view.status == "Scheduled":
                    found.append(seen_of(s, state, known))
            return found

    def decide(self, seen: Seen) -> tuple[str | None, str | None]:
        """Decide the event of `seen` at once, starting from it with what a person decided
        about it since: the kind and reason of the decision it stands on then."""
        with self._lock:
            s = seen.situation
            person = self.operators.decision_for(s.view.event_id, s.view.resources)
            s = replace(s, view=replace(s.view, person=person))
            self.decider.settle(s, seen.state, seen.known, self._now())
            self.fleet.flush()
            doc = self.fleet.event(s.doc.key)
            decision = fs.event_document(doc).get("decision", {}) if doc else {}
            return decision.get("kind"), decision.get("reason")

    def decide_all(self) -> None:
        """Decide every open event again, now."""
        with self._lock:
            self._looked = None
            self.tick()

    def say(self, action: OperatorAction, now: datetime) -> None:
        self.dispatch.operated(action, now)

    def known_vms(self) -> Iterable[VmView]:
        return self.fleet.snapshot().vms.values()


@dataclass(frozen=True)
class Seen:
    """A live event as a person's action finds it (bridge.consumer.people.desk.Situated): what
    the desk reads of it, and the Situation, ledger state and VMs it was built on, so the
    decision pass can start from it."""

    view: EventView
    fleet: FleetView
    asked: datetime | None  # when its ask was said
    situation: Situation
    state: LedgerState
    known: VmSnapshot


def seen_of(s: Situation, state: LedgerState, known: VmSnapshot) -> Seen:
    asked = fs.event_document(s.doc).get("asked")
    return Seen(s.view, s.fleet, parse_time(asked["at"]) if asked else None, s, state, known)


@dataclass(frozen=True)
class Explained:
    """What `Consumer.explain` says of one event: while it is Scheduled, what the policy
    decides now (`verdict`); once it has started or is over there is nothing left to decide
    (evaluating it now would only say so), and `taken` is the decision it stood on, None when
    none was taken (it had started when first read). `replayed`: `taken` is what a consumer
    would have decided on records replayed (`policy explain --records`), not one it took."""

    view: EventView
    verdict: Verdict | None = None
    taken: fs.StandingDecision | None = None
    replayed: bool = False
