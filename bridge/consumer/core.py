"""The consumer core: record batches in, fleet state and approvals out.

Deployment forms (`se-bridge consume`, the Azure Functions app, the demo) are thin
wrappers: they hand batches to `Consumer.process` and call `Consumer.tick` on a timer.

A batch (a sample of the records it holds, one per line here):

    {"RecordType": "Heartbeat", "VmId": "1b1f...", "VmName": "web_0", "Tags": {"tier": "web"}, ...}
    {"RecordType": "Event", "VmId": "1b1f...", "EventId": "C7061BAC-...", "EventType": "Reboot",
     "EventSource": "User", "EventStatus": "Scheduled", "Resources": ["web_0"], ...}
    {"RecordType": "Approval", "VmId": "1b1f...", "CommandId": "3d0c...",
     "ApprovalOutcome": "Approved", ...}

Order of effects, so that a crash anywhere loses no approval and doubles none: the
ledger entry (budget and target) is written first with its ETag; then the Decision
record; then the command; then the entry is marked sent. A crash before "sent" makes
the next pass resend the same command (same CommandId), never a second approval.
Processing is idempotent: batches may be replayed (nothing is checkpointed until
`process` returns) and every merge only moves forward.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from bridge.channels import CommandSender
from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer.dispatch import Dispatch
from bridge.consumer.ledger import ApprovalLedger, Emit, LedgerEntry, LedgerState, ledger_scopes
from bridge.consumer.reading import Position, ReadMarks
from bridge.consumer.state import (
    ChangeFeed,
    Conflict,
    DeferredSync,
    Doc,
    Mutation,
    Store,
    read_many,
    update,
    update_many,
)
from bridge.policy.model import (
    EventView,
    FleetView,
    Policy,
    Scope,
    Verdict,
    VmView,
    budget_use,
    evaluate,
    group_index,
    scope_of,
)
from bridge.records import iso, parse_time, utc_now, vm_key
from bridge.redact import describe
from bridge.retry import RetryableError

log = logging.getLogger(__name__)

SEEN_RECORD_IDS = 100_000
# A record dated further ahead of the consumer's clock than this is taken as of now: clocks
# of healthy VMs (NTP, the Azure host's time sync) stay well within it.
MAX_AHEAD = timedelta(minutes=5)
# The fleet state is swept for VMs gone past consumer.forget_vms_after this often.
SWEEP_EVERY = timedelta(hours=1)
# A store without a change feed is scanned for the VMs other consumers wrote this often.
RESCAN_VMS = timedelta(seconds=30)
# Where a look costs a query (Table Storage), the events are read in full this often, and
# between two such reads only those written since (EventIndex).
RESCAN_EVENTS = timedelta(minutes=5)
D = TypeVar("D", fs.VmDocument, fs.EventDocument)


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
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._warned = _Once(10_000)  # VMs whose clock was said to be ahead
        self._failures = _Once(10_000)  # decision failures said at ERROR
        self._swept: datetime | None = None
        self._started = now()
        # Event Hubs hands batches from several partition threads; one at a time keeps the
        # in-process caches simple (other consumer processes are kept apart by the ETags).
        self._lock = threading.RLock()
        self.sender = sender
        self.ledger = ApprovalLedger(store, settings, (b.group for b in policy.budgets))
        self.dispatch = Dispatch(sender, emit, policy, host_name, mode=settings.mode)
        self.fleet = FleetCache(store, now=now)
        self.events = EventIndex(store, now=now)
        self.marks = ReadMarks(store, now=now, host_name=host_name)
        if isinstance(store, DeferredSync):
            # What a batch merges is replayed from Event Hubs if lost, as long as it is on
            # disk before `process` returns (then the batch may be checkpointed): flushed
            # there. The ledger is never deferred: an approval is on disk before it is sent.
            store.defer_sync((fs.VM, fs.EVENT))

    # --- batches ---------------------------------------------------------------------------

    def process(
        self, records: Sequence[Mapping[str, Any]], position: Position | None = None
    ) -> None:
        """Fold a batch into the fleet state and decide about every event it touched.

        `position`: where the batch was read and how far its partition has been read
        (bridge.consumer.reading); the records may be none, to say only that. None from a
        caller that reads no partition.
        """
        with self._lock:
            self._process(records, position)

    def _process(
        self, records: Sequence[Mapping[str, Any]], position: Position | None = None
    ) -> None:
        fresh, stored = self._fold(records, position)
        if position is not None:
            self.marks.note(position)  # after the fold: the mark vouches for what is stored
        touched = set(stored) | self.ledger.note_approvals(fresh)
        if touched:
            self._decide(sorted(touched), stored, look=not self._costly_looks)
        self._flush()
        self._remember(fresh)

    def fold(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Fold records into the fleet state without deciding anything (`policy explain`)."""
        with self._lock:
            fresh, _ = self._fold(records)
            self._flush()
            self._remember(fresh)

    def _fold(
        self, records: Sequence[Mapping[str, Any]], position: Position | None = None
    ) -> tuple[list[Mapping[str, Any]], dict[str, Doc | None]]:
        """The records not seen before, and the event documents they changed, as stored."""
        now = self._now()
        fresh = [self._on_our_clock(r, now) for r in records if self._first_sight(r)]
        if not fresh:
            return fresh, {}
        heard = iso(now)
        self.fleet.update(_vm_mutations(fresh, heard, position.partition if position else None))
        return fresh, update_many(self.store, fs.EVENT, _event_mutations(fresh, heard))

    @property
    def _costly_looks(self) -> bool:
        """Whether a look at the ledger is a query to a service (Table Storage): it returns
        every shard and lock written in its last 10 s, in a storm all 96 of them, and
        batches come many a second, most with nothing to approve (issue 15)."""
        return isinstance(self.store, ChangeFeed) and self.store.feed_interval > 0

    def _remember(self, fresh: Sequence[Mapping[str, Any]]) -> None:
        for record in fresh:
            self._seen[str(record.get("RecordId"))] = None
        while len(self._seen) > SEEN_RECORD_IDS:
            self._seen.popitem(last=False)

    def budget_use(self) -> dict[str, float]:
        """Per budget, how full its fullest group is now (read only; for the metrics)."""
        with self._lock:
            known = VmSnapshot(self.store, self.fleet)
            impacted = known.by_vm_id(self.ledger.read().impact)
            fleet = FleetView(known.vms, impacted, self._alive_within)
            return budget_use(self.policy.budgets, fleet, self._now())

    def explain(self, event_id: str) -> Explained | None:
        """What the policy decides about `event_id` now, and why, as a pass would see it; once
        the event has started or is over, the decision it stood on. Nothing is written. None
        when the state holds no such event."""
        with self._lock:
            now = self._now()
            doc = self.store.read(fs.EVENT, fs.event_key(event_id))
            if doc is None or doc.value.get("event_type") is None:
                return None
            view, fleet, _ = self._assess(
                self.ledger.read(), doc, VmSnapshot(self.store, self.fleet), now
            )
            if view.status != "Scheduled":
                return Explained(view, taken=fs.event_document(doc).get("decision"))
            return Explained(view, evaluate(self.policy, fleet, view, now))

    def tick(self) -> None:
        """Look again at every open event: deferrals, fallbacks, unsent commands, stale ones."""
        with self._lock:
            self._tick()

    def close(self) -> None:
        self.sender.close()
        self.store.close()

    def _tick(self) -> None:
        now = self._now()
        held = dict(self.ledger.entries())
        stale_after = timedelta(seconds=self.settings.stale_after)
        open_events: dict[str, Doc | None] = {}
        for doc in self.events.scan():
            if fs.is_stale(fs.event_document(doc), now, stale_after):
                self._forget(doc.key, now, stale_after)
                self.events.drop(doc.key)
            elif fs.status(fs.event_document(doc)) != fs.GONE or doc.key in held:
                open_events[doc.key] = doc
        # Every event the ledger counts, even one the kept documents miss (read before it was
        # written): `_decide` reads it.
        keys = sorted(open_events.keys() | held.keys())
        if keys:
            self._decide(keys, open_events, look=False)  # read just now
        self._sweep(now, held)
        self._flush()

    def _sweep(self, now: datetime, held: Mapping[str, LedgerEntry]) -> None:
        """Remove the documents of VMs not heard from for consumer.forget_vms_after (hourly).

        A VM an open event still counts stays. The VMs another consumer removed leave this
        process's cache too: a scan no longer finds them, or (with a change feed, which keeps
        every VM document) the delete finds them gone. With a change feed the sweep reads no
        scan: at 100,000 VMs a scan read every VM document each hour for each consumer, the
        6,250 of each `vm` table partition in a burst of pages, past a partition's 2,000
        entities a second (issue 15).
        """
        if self._swept is not None and now - self._swept < SWEEP_EVERY:
            return
        self._swept = now
        horizon = iso(now - timedelta(seconds=self.settings.forget_vms_after))
        counted = {vm for entry in held.values() for vm in entry["vms"]}
        kept = isinstance(self.store, ChangeFeed)
        present, gone, still = set(), [], []
        for doc in self.fleet.documents() if kept else self.store.scan(fs.VM):
            value = fs.vm_document(doc)
            if (value.get("heard") or value.get("last_seen", "")) >= horizon:
                present.add(doc.key)
            elif doc.key not in counted:
                gone.append(doc)
            else:
                still.append(doc.key)
        # Counted, so not removed here; as kept, perhaps removed by another consumer.
        present.update(read_many(self.store, fs.VM, still) if kept else still)
        for doc in gone:
            try:
                self.store.delete(fs.VM, doc)  # quiet where another consumer removed it
            except Conflict:  # heard from meanwhile: it stays
                present.add(doc.key)
                continue
            log.info("VM %s (%s) has not been heard from since %s: removed from the fleet state",
                     doc.key, doc.value.get("name"), doc.value.get("heard") or
                     doc.value.get("last_seen"))  # fmt: skip
        self.fleet.retain(present)

    def _flush(self) -> None:
        if isinstance(self.store, DeferredSync):
            self.store.flush()

    def _first_sight(self, record: Mapping[str, Any]) -> bool:
        rid = record.get("RecordId")
        return isinstance(rid, str) and rid not in self._seen

    def _on_our_clock(self, record: Mapping[str, Any], now: datetime) -> Mapping[str, Any]:
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
        log.log(level, "record %s of VM %s is dated %s, %s ahead of this consumer's clock: "
                "taken as of now (check the VM's time synchronisation)", record.get("RecordId"),
                who, record.get("TimeGenerated"), stamped - now)  # fmt: skip
        return {**record, "TimeGenerated": iso(now)}

    # --- decisions -------------------------------------------------------------------------

    def _decide(
        self, event_keys: Sequence[str], held: Mapping[str, Doc | None], *, look: bool
    ) -> None:
        """Decide the events `event_keys`; `look`: read the ledger first (see below).

        `held`: copies of event documents the caller has (those the batch just stored, the
        tick's kept ones), the others are read. A copy serves to find out whether the event
        needs anything done; only then is it read again (`_decide_one`). At a Spot eviction
        storm every VM of a placement group reports each event (issue 15), and each sighting
        read the event twice more for a decision that did nothing; the tick read every open
        event twice every 5 s (14,819 at the 100,000-VM freeze wave).
        """
        known_vms = VmSnapshot(self.store, self.fleet)
        wanted = set(event_keys)
        found = {key: doc for key, doc in held.items() if doc is not None and key in wanted}
        found.update(read_many(self.store, fs.EVENT, [k for k in event_keys if k not in held]))
        known = [d for d in found.values() if d.value.get("event_type") is not None]
        # At most once for the whole pass, after the VMs: each event then starts from this
        # state (with this pass's own commits in it), and reads it again only if a commit
        # conflicts. A read per event was a query per open event per pass on Table Storage,
        # and a pass held up every batch: at the 100,000-VM freeze wave two consumers fell
        # 60 s behind. Where a look is costly (see `_costly_looks`), a batch's pass decides
        # on the state kept: the re-evaluation pass reads it every reevaluate_interval, and
        # this consumer's writes and the answers it folds keep it. That is safe (a write that
        # adds impact carries the ETags of its groups' locks, and one changed since conflicts
        # and reads again); on an older state an event can only wait, for a slot another
        # consumer freed meanwhile, until the next re-evaluation pass.
        if look:
            self.ledger.read()
        # The event due soonest gets a free budget slot first, then the longest waiting.
        retry: RetryableError | None = None
        for doc in sorted(known, key=fs.urgency):
            try:
                act = self._needs_action(doc, known_vms)
                if act is not None:
                    self._decide_one(doc, known_vms, act)
            except RetryableError as err:  # a channel or the state: the others are decided first
                retry = retry or err
            except Exception as err:  # one event never stops the others, nor the partition
                self._failed(doc, err)
        if retry is not None:
            # The batch is handed over again (nothing checkpointed), as a failed send or
            # upload always did: what was written is finished then (an unsent approval resent).
            raise retry

    def _failed(self, doc: Doc, err: Exception) -> None:
        """Deciding the event in `doc` failed for good: an ERROR and a Decision record (said
        once while it lasts); the event is tried again at every pass, the others go on.

        What fails here is a value the input checks let through that breaks a decision, or
        a channel that refuses the VM for good; never a reason to hold the partition back.
        """
        level = logging.ERROR if self._failures.add(f"{doc.key} {err}") else logging.DEBUG
        log.log(level, "deciding event %s failed: %s; it is deferred, other events go on, and "
                "the next pass tries it again", doc.key, describe(err, with_type=True),
                exc_info=err if level == logging.ERROR else None)  # fmt: skip
        try:
            self.dispatch.failed(self.store, fs.event_document(doc), err, self._now())
        except Exception as again:
            log.error("the Decision record saying event %s failed could not be written: %s",
                      doc.key, describe(again, with_type=True))  # fmt: skip

    def _needs_action(self, doc: Doc, known_vms: VmSnapshot) -> _WouldAct | None:
        """What deciding the event in `doc` (a copy, perhaps older than the stored one) would
        do, from the pass's ledger state (`_decided` run dry); None if it would write or send
        nothing.

        Only what this says is needed is done, and then on the event read again: a copy too
        old to show something to do delays it to the next pass that has a newer one (every
        consumer decides what it folds, the tick what it keeps), and never decides anything.
        """
        ledger = self.ledger.read(refresh=False)
        if fs.status(fs.event_document(doc)) == fs.GONE:
            return _WouldAct() if doc.key in ledger.events else None
        try:
            self._decided(ledger, doc, known_vms, self._now(), fresh=False, dry=True)
        except _WouldAct as act:
            return act
        return None

    def _decide_one(self, doc: Doc, known_vms: VmSnapshot, act: _WouldAct) -> None:
        now = self._now()
        # The pass's state first (see `_decide`); after a conflict, what the write contested
        # and what changed it (ledger.py). Where the state kept is older than a look (Table
        # Storage), an event that adds impact first reads its groups' locks and its entry's
        # shard in the same way: in the 100,000-VM Spot eviction storm with two consumers
        # most approvals made on the state kept conflicted (0.84 an approval), each decided
        # twice (tests/benchmarks/ledger_storm.py).
        locks = act.locks if self._costly_looks else None
        refresh = locks is not None
        while True:
            if refresh:
                ledger = self.ledger.read_again(doc.key, locks or ())
            else:
                ledger = self.ledger.read(refresh=False)
            refreshed, refresh, locks = refresh, True, None
            # The event is read after the ledger: whoever released it from the ledger had
            # stored its end before, so a release seen there means the end is seen here. With
            # an older copy, a completed event could be approved again (the release makes
            # room and the ETag is fresh).
            fresh = self.store.read(fs.EVENT, doc.key)
            if fresh is None:
                return
            doc = fresh
            if fs.status(fs.event_document(doc)) == fs.GONE:
                self.ledger.release(doc.key, "the event completed or was canceled")
                # A late reporter's Started record merged meanwhile found the entry still in
                # the ledger and left it there; read again after the release, so that either
                # we see that record here or its consumer saw the release and recorded it.
                after = self.store.read(fs.EVENT, doc.key)
                if after is None or fs.status(fs.event_document(after)) == fs.GONE:
                    return
                continue
            if self._decided(ledger, doc, known_vms, now, fresh=refreshed):
                return

    def _assess(
        self, ledger: LedgerState, doc: Doc, known_vms: VmSnapshot, now: datetime
    ) -> tuple[EventView, FleetView, LedgerEntry | None]:
        """The event as the policy sees it, the fleet with what impacts it, and its entry."""
        resources = [str(r) for r in doc.value.get("resources") or []]
        impacted = known_vms.by_vm_id(
            ledger.impact, also=resources, version=ledger.version, reach=ledger.reach
        )
        entry = ledger.events.get(doc.key)
        tried = tuple(entry.get("tried", ())) if entry else ()
        unknown_for = timedelta(seconds=self.settings.unknown_names_for)
        view = fs.event_view(fs.event_document(doc), known_vms.vms, known_vms.names, tried, now,
                             unknown_for=unknown_for)  # fmt: skip
        groups = known_vms.groups(budget.group for budget in self.policy.budgets)
        fleet = FleetView(known_vms.vms, impacted, self._alive_within, groups, ledger.reach)
        return view, fleet, entry

    def _decided(  # noqa: PLR0911 - each return is a way a decision ends
        self,
        ledger: LedgerState,
        doc: Doc,
        known_vms: VmSnapshot,
        now: datetime,
        *,
        fresh: bool,
        dry: bool = False,
    ) -> bool:
        """One decision on a live event; False when the ledger changed under us, or must be
        read again (`fresh`: read for this event, not the pass's state). `dry`: change
        nothing, and raise _WouldAct where something would be written or sent."""
        view, fleet, entry = self._assess(ledger, doc, known_vms, now)
        vms = known_vms.vms
        value = fs.event_document(doc)
        if self._over(doc, view, entry, dry):
            return True
        reports = value.get("reporters", {}).values()
        if (
            entry is not None
            or view.status == "Started"
            or any(r["status"] == fs.GONE for r in reports)
        ):
            gone = self._all_gone(value, view, entry, vms, now)
            if gone is not None:
                _acting(dry)
                self._release(doc, view, gone, now)
                return True
        if entry is not None and not (
            self._recount(ledger, doc.key, view, entry, now, dry)
            and self._counted_as_now(ledger, doc.key, view, entry, vms, dry)
        ):
            return False
        if view.status == "Started":
            if doc.key not in ledger.events:
                if dry:
                    raise _WouldAct(self.ledger.locks(view.counted, vms))
                self.ledger.note_started(ledger, doc.key, view, vms)
            return True
        if entry is not None and not self.ledger.needs_decision(entry, now, view.reporters):
            if entry.get("sent"):
                return True
            # An unsent approval in the pass's state may since have been sent, refused and
            # replaced by another consumer: resending it then would put a second approval
            # out. It is resent only from a state read for this event (False: read again).
            _acting(dry)
            if fresh:
                self.dispatch.resend_if_unsent(self.ledger, doc.key, entry, now)
            return fresh
        verdict = evaluate(self.policy, fleet, view, now)
        if not self.dispatch.would_act(doc, verdict):
            return True
        if dry and verdict.kind == "Approve":
            raise _WouldAct(self.ledger.locks(view.counted, vms))
        _acting(dry)
        return self.dispatch.apply(
            self.ledger,
            state=ledger,
            event_doc=doc,
            view=view,
            verdict=verdict,
            vms=vms,
            now=now,
        )

    def _over(self, doc: Doc, view: EventView, entry: LedgerEntry | None, dry: bool) -> bool:
        """Whether the event counts no more: released (its VMs are gone, see `_all_gone`)
        until one of them speaks again, or ended for every VM that can see it (VMs of other
        scopes that still claim it are not heard, fs.Names.witnesses)."""
        if doc.value.get("released") and not self._unreleased(doc, dry):
            return True
        if view.status != fs.GONE:
            return False
        if entry is not None:
            _acting(dry)
            self.ledger.release(doc.key, "the VMs that can see the event reported it gone")
        return True

    def _counted_as_now(  # noqa: PLR0917 - one entry in full
        self,
        ledger: LedgerState,
        key: str,
        view: EventView,
        entry: LedgerEntry,
        vms: Mapping[str, VmView],
        dry: bool,
    ) -> bool:
        """The entry counts the event's Resources as they are now: an approved event that grew
        counts its new VMs from this pass on, before any other event is approved past them;
        its names no VM is known by, in the scopes of the VMs that can see it now (those of a
        reporter whose identity was not known yet when it was counted are known now).
        False when the ledger changed under us."""
        counted = set(view.counted)
        grown = counted - set(entry["vms"])
        scopes = ledger_scopes(view) or entry.get("scopes")
        if not grown and scopes == entry.get("scopes"):
            return True
        _acting(dry)
        locks = self.ledger.locks(grown, vms)
        entry["vms"] = sorted(counted | set(entry["vms"]))
        if scopes:
            entry["scopes"] = scopes
        try:
            self.ledger.commit(ledger, [key], locks)
        except Conflict:
            return False
        return True

    def _recount(  # noqa: PLR0917 - one entry in full
        self,
        ledger: LedgerState,
        key: str,
        view: EventView,
        entry: LedgerEntry,
        now: datetime,
        dry: bool,
    ) -> bool:
        """The entry stops counting what no VM that can see the event stands by; False when
        the ledger changed under us (or the entry was dropped: read again).

        - A Started entry of an event that no VM that can see it says started: the claim of
          a VM of another scope, read before the event's own reporters (fs.Names.witnesses).
        - The names of the event that no VM of its reporters' scopes has, once
          consumer.unknown_names_for has passed since it was first seen (`view.lapsed`),
          with a Decision record that says so: a VM that keeps repeating a record naming a
          VM that does not exist holds no slot for ever.
        """
        if entry["origin"] == "started" and view.status == "Scheduled":
            _acting(dry)
            self.ledger.release(key, "no VM that can see the event says it started")
            return False
        lapsed = [name for name in view.lapsed if name in entry["vms"]]
        if not lapsed:
            return True
        _acting(dry)
        entry["vms"] = [vm for vm in entry["vms"] if vm not in lapsed]
        try:
            self.ledger.commit(ledger, [key])
        except Conflict:
            return False
        why = (
            f"{', '.join(lapsed)}: no VM of that name in the scope of the VMs that can see the "
            f"event has reported since it was first seen at {iso(view.first_seen)}; after "
            f"{self.settings.unknown_names_for:g} s the name no longer counts"
        )
        self.dispatch.released(self.store, view, why, now)
        return True

    @property
    def _alive_within(self) -> timedelta:
        return timedelta(seconds=self.settings.alive_within)

    def _all_gone(
        self,
        value: fs.EventDocument,
        view: EventView,
        entry: LedgerEntry | None,
        vms: Mapping[str, VmView],
        now: datetime,
    ) -> str | None:
        """Why the event no longer counts though not every VM said it ended; else None.

        The rule (docs/policy.md#when-a-slot-is-released), once this process has listened
        for a whole alive_within (after a restart every VM looks silent until its records
        are folded in again), and only while no VM still reporting the event has been heard
        from within consumer.alive_within:

        - for each VM still reporting it, a VM of the same scope reported the event gone after
          its last word: the platform took it out of the set's document, and those VMs are
          deleted (a VM sees only its own scope's document: one of another scope that says
          the event is gone knows nothing of it);
        - or the event is due (NotBefore, or when first seen without one, plus its duration)
          and no VM it names that has not said it is gone was heard from within alive_within:
          a VM deleted by a Terminate or Preempt never reports the end of its event.

        A VM that is only rebooting is heard again within minutes.
        """
        if now < self._started + self._alive_within:
            return None
        # Silent only as far as the partitions carrying the VMs were read (reading.py).
        fleet = self.marks.vouched(FleetView(vms, {}, self._alive_within))
        reports = value.get("reporters", {})
        if any(fleet.alive(v, now) for v in view.reporters):
            return None
        ended = {v: r["at"] for v, r in reports.items() if r["status"] == fs.GONE}
        said = _gone_after(reports, ended, view.reporters, vms)
        if said is not None:
            return (
                f"VM {said} reported the event gone and the VMs of its scope "
                f"that still reported it have not been heard from for "
                f"{self.settings.alive_within:g} s: they are taken as deleted"
            )
        due = (view.not_before or view.first_seen) + timedelta(seconds=max(view.duration or 0, 0))
        if now < due + self._alive_within:
            return None
        watchers = {*view.affected, *view.possible}
        watchers |= {v for v in (entry["vms"] if entry else ()) if v in vms}
        if any(fleet.alive(v, now) for v in watchers - ended.keys()):
            return None
        return (
            f"no VM of the event has been heard from for {self.settings.alive_within:g} s "
            f"since it was due at {iso(due)}: its VMs are taken as deleted and the event as over"
        )

    def _release(self, doc: Doc, view: EventView, why: str, now: datetime) -> None:
        """Mark the event released (first: a consumer that sees the ledger without it sees the
        mark), drop its ledger entry, and say why in a Decision record."""

        def mark(value: dict[str, Any]) -> bool:
            value["released"] = iso(now)
            return True

        update(self.store, fs.EVENT, doc.key, mark)
        self.ledger.release(doc.key, why)
        self.dispatch.released(self.store, view, why, now)

    def _unreleased(self, doc: Doc, dry: bool) -> bool:
        """A record changed the released event after its release: a VM of it is back; the
        mark is taken off (True). False when none did."""
        value = fs.event_document(doc)
        if value.get("heard", "") <= value.get("released", ""):
            return False
        _acting(dry)

        def unmark(value: dict[str, Any]) -> bool:
            return value.pop("released", None) is not None

        update(self.store, fs.EVENT, doc.key, unmark)
        doc.value.pop("released", None)
        return True

    def _forget(self, key: str, now: datetime, stale_after: timedelta) -> None:
        # Read again: the tick's copy may be older than a report that keeps the event alive
        # (EventIndex), and releasing a live event's entry would leave its VMs uncounted.
        doc = self.store.read(fs.EVENT, key)
        if doc is None or not fs.is_stale(fs.event_document(doc), now, stale_after):
            return
        self.ledger.release(doc.key, "no VM has reported on the event for too long")
        try:
            self.store.delete(fs.EVENT, doc)
        except Exception:  # a concurrent update keeps it alive; the next tick looks again
            log.debug("event %s changed while being forgotten", doc.key)


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


def _gone_after(
    reports: Mapping[str, fs.Reporter],
    ended: Mapping[str, str],
    still: Iterable[str],
    vms: Mapping[str, VmView],
) -> str | None:
    """The VM that last reported the event gone (of `ended`, VM -> when) if, for each VM of
    `still`, a VM of its own scope did after that VM's last word; else None."""

    def scope(vm: str) -> Scope | None:
        return scope_of(vms[vm]) if vm in vms else None

    vouchers: list[str] = []
    for vm in still:
        mine = [v for v in ended if scope(v) == scope(vm) and ended[v] >= reports[vm]["at"]]
        if not mine:
            return None
        vouchers += mine
    return max(vouchers, key=lambda v: ended[v]) if vouchers else None


class _WouldAct(Exception):
    """A dry run of `Consumer._decided` reached something it would write or send; `locks`:
    where that adds impact to the ledger, the locks its write takes (None where it does not)."""

    def __init__(self, locks: frozenset[str] | None = None) -> None:
        super().__init__()
        self.locks = locks


def _acting(dry: bool) -> None:
    if dry:
        raise _WouldAct


class _Paced:
    """When a costly read was last made, on the consumer's clock."""

    def __init__(self, now: Callable[[], datetime]) -> None:
        self._now = now
        self.last: datetime | None = None

    def due(self, every: timedelta) -> bool:
        """Whether `every` has passed since the last one (noting this one if so)."""
        now = self._now()
        if self.last is not None and abs(now - self.last) < every:
            return False
        self.last = now
        return True


class EventIndex:
    """Every event document, as the tick looks at them all.

    Where a look is cheap (SQLite) every tick scans the collection. Where it is a query to a
    service (Table Storage), the documents are kept from tick to tick: each tick asks the
    change feed for those written since, and every RESCAN_EVENTS reads them all, which also
    drops those another consumer deleted meanwhile (the feed does not report deletions; a
    deleted event kept a little longer is read again before it is decided, and is then
    found gone). A scan every tick (5 s) read every event of the last `stale_after` (6 h):
    after the 100,000-VM freeze wave, 14,819 documents a tick per consumer, past a table
    partition's 2,000 entities/s target with one consumer.
    """

    def __init__(self, store: Store, *, now: Callable[[], datetime] = utc_now) -> None:
        self.store = store
        self._docs: dict[str, Doc] = {}
        self._mark: int | None = None
        self._full = _Paced(now)

    def scan(self) -> list[Doc]:
        store = self.store
        if not isinstance(store, ChangeFeed) or not store.feed_interval:
            return store.scan(fs.EVENT)
        if self._full.due(RESCAN_EVENTS):
            docs, self._mark = store.scan_changes(fs.EVENT, None)
            self._docs = {doc.key: doc for doc in docs}
        else:
            docs, self._mark = store.scan_changes(fs.EVENT, self._mark, self._docs)
            self._docs.update((doc.key, doc) for doc in docs)
        return [self._docs[key] for key in sorted(self._docs)]

    def drop(self, key: str) -> None:
        """An event this process removed from the store."""
        self._docs.pop(key, None)


class VmSnapshot:
    """The VMs known when a batch is decided, caught up with the ledger on demand.

    The ledger is read after the VMs were scanned. Another consumer may meanwhile have
    stored a VM and then approved an event on it: that VM, missing here, would fall in no
    budget group and the next approval in its group would break the budget. Every VM an
    entry names is therefore looked up once more before it is counted.
    """

    def __init__(self, store: Store, fleet: FleetCache) -> None:
        self.store = store
        self._fleet = fleet
        self.vms: dict[str, VmView] = {}
        self._absent: set[str] = set()  # looked up since the last scan: no VM of that id
        self._rescanned = False
        # Budget groups of VMs caught up with since the scan; None: the fleet cache's hold.
        self._groups: dict[str, dict[str, frozenset[str]]] | None = None
        # The last `by_vm_id` answer, for the ledger version and the VMs it was made from.
        self._generation = 0  # changes whenever `vms` does
        self._resolved: tuple[object, int, dict[str, frozenset[str]]] | None = None
        self._scan()

    def _scan(self) -> None:
        self.vms = self._fleet.load()
        self._absent.clear()
        self.names, self._ids = self._fleet.index()
        self._groups = None
        self._generation += 1

    def _index(self) -> None:
        self.names, self._ids = _name_index(self.vms)
        self._groups = {}
        self._generation += 1

    def groups(self, kinds: Iterable[str]) -> dict[str, dict[str, frozenset[str]]]:
        """The budget groups of the VMs known now (policy.model.group_index). Sorting
        100,000 VMs into groups for every event of a wave made a consumer with thousands of
        open events fall behind (issue 15): the fleet cache keeps them from batch to batch."""
        if self._groups is None:
            return self._fleet.groups(kinds)
        missing = [kind for kind in kinds if kind not in self._groups]
        if missing:
            self._groups.update(group_index(missing, self.vms))
        return self._groups

    def by_vm_id(
        self,
        impacted: Mapping[str, frozenset[str]],
        *,
        also: Sequence[str] = (),
        version: object = None,
        reach: Mapping[str, frozenset[Scope]] | None = None,
    ) -> dict[str, frozenset[str]]:
        """The ledger's impact with VMs it names by VmId once an agent has reported them.

        A ledger entry lists a VM no agent had reported yet by its name; budgets count
        VmIds, so without this the VM drops out of every group when it becomes known. A name
        counts the VMs of that name in the entry's scopes (`reach`, as the ledger's `reach`:
        where the VMs that could see the event are); of an entry without, every known VM of
        that name, which can only be stricter. `also` names VMs to catch up with too: the
        event being decided.
        """
        held = self._resolved
        if version is not None and held is not None and held[:2] == (version, self._generation):
            # The same ledger and VMs as the last event of this pass: only the new names.
            self._catch_up(set(also))
            if self._generation == held[1]:
                return held[2]
        listed = {vm for vms in impacted.values() for vm in vms} | set(also)
        self._catch_up(listed)
        known = self.vms.keys()
        # Most entries name VmIds already known: taken as they are, without a look at each.
        where = reach or {}
        resolved = {
            key: vms
            if known >= vms
            else frozenset(v for vm in vms for v in self._resolve(vm, where.get(key)))
            for key, vms in impacted.items()
        }
        if version is not None:
            self._resolved = (version, self._generation, resolved)
        return resolved

    def _resolve(self, vm: str, scopes: frozenset[Scope] | None) -> list[str]:
        if vm in self.vms:
            return [vm]
        if not scopes:
            return self._ids.get(vm_key(vm), [vm])
        index, key = self.names.index, vm_key(vm)
        return [index[(s, key)] for s in sorted(scopes, key=repr) if (s, key) in index] or [vm]

    def _catch_up(self, listed: set[str]) -> None:
        unknown = {vm for vm in listed if vm not in self.vms and vm_key(vm) not in self._ids}
        found = False
        wanted = sorted(unknown - self._absent)
        stored = read_many(self.store, fs.VM, wanted)
        for vm in wanted:
            doc = stored.get(vm)
            if doc is None:
                self._absent.add(vm)
            else:
                self.vms[vm] = fs.vm_view(vm, fs.vm_document(doc))
                found = True
        if found:
            self._index()
        # A name, not an id: its VM may have been stored under its id since the scan. Once
        # per batch, so an entry naming a VM without an agent does not cost a scan per event.
        if unknown & self._absent and not self._rescanned:
            self._rescanned = True
            self._scan()


class FleetCache:
    """Every VM document as a scan would find it now, without reading them all each time.

    With a store that has a change feed only the VMs written since the last look are read;
    that includes those written by other consumers (VMs are deleted only by the hourly
    sweep, which drops them here too). Where each look is a query to a service (Table
    Storage), `load` looks at most every `feed_interval` seconds and takes the VMs this
    process writes as written; a store without a feed is scanned at most every RESCAN_VMS.
    A scan or a look for every batch read the whole fleet over HTTP each time (issue 15's
    load generator on Azurite: 55% of a consumer at 10,000 VMs, 16.7 ms of CPU a record; at
    100,000 VMs a scan every 30 s kept Azurite busy and the consumers far behind).
    Between looks the VMs other consumers wrote may be missing or older. That is safe:
    every VM the ledger or the event being decided names is looked up again before it is
    counted (VmSnapshot), and a VM missing from a group makes its budget smaller, never
    larger, and is not asked to approve.
    """

    def __init__(self, store: Store, *, now: Callable[[], datetime] = utc_now) -> None:
        self.store = store
        self._looks = _Paced(now)  # scans or looks, where they cost
        self._mark: int | None = None
        self._vms: dict[str, VmView] = {}
        # With a change feed: the documents `_vms` was made from, at the version last seen.
        self._docs: dict[str, Doc] = {}
        self._index: NameIndex | None = None
        self._groups: dict[str, dict[str, frozenset[str]]] = {}  # kept while no VM moves

    def update(self, mutations: Mapping[str, Mutation]) -> None:
        """Merge into VM documents (`update_many`), starting from the versions held here.

        A held version is most likely current (this process wrote it or saw it last), so it
        is not read again; if another consumer wrote since, its write conflicts and that
        document is read and merged again.
        """
        held = {key: self._docs[key] for key in mutations if key in self._docs}
        try:
            stored = update_many(self.store, fs.VM, mutations, known=held)
        except BaseException:
            for key in held:  # changed in place, perhaps not stored: read again next time
                del self._docs[key]
            raise
        self._note(stored.values())

    def _note(self, docs: Iterable[Doc | None]) -> None:
        """VM documents this process just stored: the next `load` need not read them again.

        Only with a change feed: their ETags tell a later load which of the documents
        written since its mark are these versions (skipped) and which are newer (read).
        """
        if isinstance(self.store, ChangeFeed) or self._looks.last is not None:
            self._take(doc for doc in docs if doc is not None and doc.etag is not None)

    def load(self) -> dict[str, VmView]:
        if not isinstance(self.store, ChangeFeed):
            if not self._looks.due(RESCAN_VMS):
                return dict(self._vms)
            docs = self.store.scan(fs.VM)
            self._docs = {doc.key: doc for doc in docs}
            vms = {doc.key: fs.vm_view(doc.key, fs.vm_document(doc)) for doc in docs}
            if vms.keys() != self._vms.keys() or any(
                _placement(vm) != _placement(self._vms[key]) for key, vm in vms.items()
            ):
                self._groups = {}
            self._vms = vms
            self._index = None
            return dict(self._vms)
        every = timedelta(seconds=self.store.feed_interval)
        if self.store.feed_interval and not self._looks.due(every):
            return dict(self._vms)
        docs, mark = self.store.scan_changes(fs.VM, self._mark, self._docs)
        if self._mark is not None and mark < self._mark:  # the file was replaced: start over
            self._vms, self._docs, self._index, self._groups = {}, {}, None, {}
            docs, mark = self.store.scan_changes(fs.VM, None)
        self._mark = mark
        self._take(docs)
        return dict(self._vms)

    def _take(self, docs: Iterable[Doc]) -> None:
        for doc in docs:
            view, before = fs.vm_view(doc.key, fs.vm_document(doc)), self._vms.get(doc.key)
            if before is None or (scope_of(before), before.name, before.last_seen is None) != (
                scope_of(view),
                view.name,
                view.last_seen is None,
            ):
                self._index = None  # the same unless a name, its scope or a stop changed
            if before is None or _placement(before) != _placement(view):
                self._groups = {}  # a heartbeat moves no VM: the groups stay
            self._vms[doc.key] = view
            self._docs[doc.key] = doc

    def documents(self) -> list[Doc]:
        """Every VM document as last looked at or written (`load` first; with a change feed)."""
        self.load()
        return list(self._docs.values())

    def retain(self, keys: set[str]) -> None:
        """Drop the cached VMs not in `keys` (removed from the store)."""
        for key in [k for k in self._vms if k not in keys]:
            del self._vms[key]
            self._docs.pop(key, None)
            self._index = None
            self._groups = {}

    def index(self) -> NameIndex:
        """The name index of the VMs `load` returned last (built again only when it changed)."""
        if self._index is None:
            self._index = _name_index(self._vms)
        return self._index

    def groups(self, kinds: Iterable[str]) -> dict[str, dict[str, frozenset[str]]]:
        """The budget groups of the VMs `load` returned last (built again only when a VM
        came, went or moved)."""
        missing = [kind for kind in kinds if kind not in self._groups]
        if missing:
            self._groups.update(group_index(missing, self._vms))
        return self._groups


def _placement(vm: VmView) -> tuple[object, ...]:
    """What puts a VM in its budget groups (policy.model.group_key)."""
    return (vm.subscription_id, vm.resource_group, vm.scale_set, vm.location, vm.zone,
            vm.fault_domain, vm.update_domain, tuple(sorted(vm.tags.items())))  # fmt: skip


NameIndex = tuple[fs.Names, dict[str, list[str]]]


def _name_index(vms: Mapping[str, VmView]) -> NameIndex:
    """Names to VmIds as the event view resolves them, and each name's VmIds (by vm_key)."""
    names = fs.Names.of(vms.values())
    ids: dict[str, list[str]] = {}
    for (_, name), vm_id in names.index.items():
        ids.setdefault(name, []).append(vm_id)
    return names, ids


def _vm_mutations(
    records: Sequence[Mapping[str, Any]], heard: str, partition: str | None
) -> dict[str, Mutation]:
    by_vm: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        if isinstance(record.get("VmId"), str) and record.get("RecordType") != "Decision":
            by_vm.setdefault(record["VmId"], []).append(record)

    def merge(value: fs.VmDocument, record: Mapping[str, Any], heard: str) -> bool:
        return fs.merge_vm(value, record, heard, partition)

    return {vm_id: _folder(merge, mine, heard) for vm_id, mine in by_vm.items()}


def _event_mutations(records: Sequence[Mapping[str, Any]], heard: str) -> dict[str, Mutation]:
    by_event: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        if record.get("RecordType") in ("Event", "Hook") and isinstance(record.get("EventId"), str):
            by_event.setdefault(fs.event_key(record["EventId"]), []).append(record)
    return {key: _folder(fs.merge_event, mine, heard) for key, mine in by_event.items()}


def _folder(
    merge: Callable[[D, Mapping[str, Any], str], bool],
    records: Sequence[Mapping[str, Any]],
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
                log.error("record %s (%s of VM %s) could not be folded into the fleet state and "
                          "was set aside: %s", record.get("RecordId"), record.get("RecordType"),
                          record.get("VmId"), describe(err, with_type=True))  # fmt: skip
        return changed

    return fold


class _Once:
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
