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
only moves forward.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from bridge.channels import CommandSender
from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer.act import Decider
from bridge.consumer.decide import Rules
from bridge.consumer.dispatch import Dispatch
from bridge.consumer.fleet import Fleet
from bridge.consumer.fold import Intake, event_mutations, vm_mutations
from bridge.consumer.ledger import ApprovalLedger, Emit
from bridge.consumer.reading import Position, ReadMarks
from bridge.consumer.release import Housekeeping, Pending, pending
from bridge.consumer.state import Doc, Store
from bridge.policy.model import EventView, FleetView, Policy, Verdict, budget_use, evaluate
from bridge.records import RecordView, iso, utc_now


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
    ) -> None:
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
        self.dispatch = Dispatch(self.fleet, sender, emit, policy, host_name, mode=settings.mode)
        self.marks = ReadMarks(store, now=now, host_name=host_name)
        rules = Rules(policy, settings, kinds, listening_since=now())
        self.decider = Decider(self.fleet, self.ledger, self.dispatch, self.marks, rules, now=now)
        self._housekeeping = Housekeeping(self.fleet, self.ledger, settings.forget_vms_after)
        self.pending = Pending()  # as of the last tick, for the metrics: no read at a scrape
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
            if position is not None:
                self.marks.note(position)  # after the fold: the mark vouches for what is stored
            touched = set(stored) | self.ledger.note_approvals(fresh)
            if touched:
                self.decider.decide(sorted(touched), stored)
            self.fleet.flush()
            self._intake.remember(fresh)

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
        return fresh, self.fleet.fold(
            vm_mutations(fresh, heard, partition), event_mutations(fresh, heard)
        )

    # --- questions -------------------------------------------------------------------------

    def budget_use(self) -> dict[str, float]:
        """Per budget, how full its fullest group is now (read only; for the metrics)."""
        with self._lock:
            known = self.fleet.snapshot()
            impacted = known.by_vm_id(self.ledger.read().impact)
            fleet = FleetView(known.vms, impacted, self._alive_within)
            return budget_use(self.policy.budgets, fleet, self._now())

    def explain(self, event_id: str) -> Explained | None:
        """What the policy decides about `event_id` now, and why, as a pass would see it; once
        the event has started or is over, the decision it stood on. Nothing is written. None
        when the state holds no such event."""
        with self._lock:
            now = self._now()
            doc = self.fleet.event(fs.event_key(event_id))
            if doc is None or doc.value.get("event_type") is None:
                return None
            s = self.decider.situation(self.ledger.read(), doc, self.fleet.snapshot(), now)
            if s.view.status != "Scheduled":
                return Explained(s.view, taken=fs.event_document(doc).get("decision"))
            return Explained(s.view, evaluate(self.policy, s.fleet, s.view, now))

    @property
    def _alive_within(self) -> timedelta:
        return timedelta(seconds=self.settings.alive_within)

    # --- the timer -------------------------------------------------------------------------

    def tick(self) -> None:
        """Look again at every open event: deferrals, fallbacks, unsent commands, stale ones."""
        with self._lock:
            now = self._now()
            held = dict(self.ledger.entries())
            stale_after = timedelta(seconds=self.settings.stale_after)
            open_events = self._housekeeping.open_events(held, now, stale_after)
            self.pending = pending(open_events.values())
            # Every event the ledger counts, even one the kept documents miss (read before it
            # was written): the pass reads it.
            keys = sorted(open_events.keys() | held.keys())
            if keys:
                self.decider.revisit(keys, open_events)  # on the ledger read just now
            self._housekeeping.sweep(now, held)
            self.fleet.flush()

    def close(self) -> None:
        self.sender.close()
        self.store.close()


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
