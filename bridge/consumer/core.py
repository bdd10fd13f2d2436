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
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from bridge.channels import CommandSender
from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer.dispatch import Dispatch
from bridge.consumer.ledger import ApprovalLedger, Emit, ledger_events
from bridge.consumer.state import ChangeFeed, DeferredSync, Doc, Mutation, Store, update_many
from bridge.policy.model import FleetView, Policy, VmView, evaluate
from bridge.records import utc_now, vm_key

log = logging.getLogger(__name__)

SEEN_RECORD_IDS = 100_000
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
        # Event Hubs hands batches from several partition threads; one at a time keeps the
        # in-process caches simple (other consumer processes are kept apart by the ETags).
        self._lock = threading.RLock()
        self.sender = sender
        self.ledger = ApprovalLedger(store, settings)
        self.dispatch = Dispatch(sender, emit, policy, host_name)
        self.fleet = FleetCache(store)
        if isinstance(store, DeferredSync):
            # What a batch merges is replayed from Event Hubs if lost, as long as it is on
            # disk before `process` returns (then the batch may be checkpointed): flushed
            # there. The ledger is never deferred: an approval is on disk before it is sent.
            store.defer_sync((fs.VM, fs.EVENT))

    # --- batches ---------------------------------------------------------------------------

    def process(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Fold a batch into the fleet state and decide about every event it touched."""
        with self._lock:
            self._process(records)

    def _process(self, records: Sequence[Mapping[str, Any]]) -> None:
        fresh = [r for r in records if self._first_sight(r)]
        events = _event_mutations(fresh)
        self.fleet.update(_vm_mutations(fresh))
        update_many(self.store, fs.EVENT, events)
        touched = set(events) | self.ledger.note_approvals(fresh)
        if touched:
            self._decide(sorted(touched))
        self._flush()
        for record in fresh:
            self._seen[str(record.get("RecordId"))] = None
        while len(self._seen) > SEEN_RECORD_IDS:
            self._seen.popitem(last=False)

    def tick(self) -> None:
        """Look again at every open event: deferrals, fallbacks, unsent commands, stale ones."""
        with self._lock:
            self._tick()

    def close(self) -> None:
        self.sender.close()
        self.store.close()

    def _tick(self) -> None:
        now = self._now()
        held = self.ledger.entries()
        open_events = []
        for doc in self.store.scan(fs.EVENT):
            if fs.is_stale(
                fs.event_document(doc), now, timedelta(seconds=self.settings.stale_after)
            ):
                self._forget(doc)
            elif fs.status(fs.event_document(doc)) != fs.GONE or doc.key in held:
                open_events.append(doc.key)
        if open_events:
            self._decide(open_events)
        self._flush()

    def _flush(self) -> None:
        if isinstance(self.store, DeferredSync):
            self.store.flush()

    def _first_sight(self, record: Mapping[str, Any]) -> bool:
        rid = record.get("RecordId")
        return isinstance(rid, str) and rid not in self._seen

    # --- decisions -------------------------------------------------------------------------

    def _decide(self, event_keys: Sequence[str]) -> None:
        known_vms = VmSnapshot(self.store, self.fleet)
        docs = [self.store.read(fs.EVENT, key) for key in event_keys]
        known = [d for d in docs if d is not None and d.value.get("event_type") is not None]
        # The event due soonest gets a free budget slot first, then the longest waiting.
        for doc in sorted(known, key=fs.urgency):
            self._decide_one(doc, known_vms)

    def _decide_one(self, doc: Doc, known_vms: VmSnapshot) -> None:
        now = self._now()
        while True:
            ledger = self.ledger.read()
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
            if self._decided(ledger, doc, known_vms, now):
                return

    def _decided(self, ledger: Doc, doc: Doc, known_vms: VmSnapshot, now: datetime) -> bool:
        """One decision on a live event; False when the ledger changed under us."""
        resources = [str(r) for r in doc.value.get("resources") or []]
        impacted = known_vms.by_vm_id(self.ledger.impacted(ledger), also=resources)
        vms, names = known_vms.vms, known_vms.names
        entry = ledger_events(ledger.value).get(doc.key)
        view = fs.event_view(
            fs.event_document(doc), vms, names, tuple(entry.get("tried", ())) if entry else (), now
        )
        if view.status == "Started":
            self.ledger.note_started(ledger, doc.key, view)
            return True
        if entry is not None and not self.ledger.needs_decision(entry, now):
            self.dispatch.resend_if_unsent(self.ledger, doc.key, entry, now)
            return True
        fleet = FleetView(vms, impacted, self._alive_within)
        verdict = evaluate(self.policy, fleet, view, now)
        return self.dispatch.apply(
            self.ledger,
            ledger_doc=ledger,
            event_doc=doc,
            view=view,
            verdict=verdict,
            vms=vms,
            now=now,
        )

    @property
    def _alive_within(self) -> timedelta:
        return timedelta(seconds=self.settings.alive_within)

    def _forget(self, doc: Doc) -> None:
        self.ledger.release(doc.key, "no VM has reported on the event for too long")
        try:
            self.store.delete(fs.EVENT, doc)
        except Exception:  # a concurrent update keeps it alive; the next tick looks again
            log.debug("event %s changed while being forgotten", doc.key)


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
        self._scan()

    def _scan(self) -> None:
        self.vms = self._fleet.load()
        self._absent.clear()
        self.names, self._ids = self._fleet.index()

    def _index(self) -> None:
        self.names, self._ids = _name_index(self.vms)

    def by_vm_id(
        self, impacted: Mapping[str, frozenset[str]], *, also: Sequence[str] = ()
    ) -> dict[str, frozenset[str]]:
        """The ledger's impact with VMs it names by VmId once an agent has reported them.

        A ledger entry lists a VM no agent had reported yet by its name; budgets count
        VmIds, so without this the VM drops out of every group when it becomes known. The
        ledger keeps no subscription: a name counts every known VM of that name, which can
        only be stricter. `also` names VMs to catch up with too: the event being decided.
        """
        listed = {vm for vms in impacted.values() for vm in vms} | set(also)
        self._catch_up(listed)
        known = self.vms.keys()
        # Most entries name VmIds already known: taken as they are, without a look at each.
        return {
            key: vms if known >= vms else frozenset(v for vm in vms for v in self._resolve(vm))
            for key, vms in impacted.items()
        }

    def _resolve(self, vm: str) -> list[str]:
        return [vm] if vm in self.vms else self._ids.get(vm_key(vm), [vm])

    def _catch_up(self, listed: set[str]) -> None:
        unknown = {vm for vm in listed if vm not in self.vms and vm_key(vm) not in self._ids}
        found = False
        for vm in sorted(unknown - self._absent):
            doc = self.store.read(fs.VM, vm)
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

    With a store that has a change feed (SQLite) only the VMs written since the last look
    are read; that includes those written by other consumers, so `load` returns what a
    scan at that moment returns (VMs are never deleted). Other stores are scanned.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._mark: int | None = None
        self._vms: dict[str, VmView] = {}
        # With a change feed: the documents `_vms` was made from, at the version last seen.
        self._docs: dict[str, Doc] = {}
        self._index: NameIndex | None = None

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
        if isinstance(self.store, ChangeFeed):
            self._take(doc for doc in docs if doc is not None and doc.etag is not None)

    def load(self) -> dict[str, VmView]:
        if not isinstance(self.store, ChangeFeed):
            self._vms = {
                doc.key: fs.vm_view(doc.key, fs.vm_document(doc)) for doc in self.store.scan(fs.VM)
            }
            self._index = None
            return dict(self._vms)
        docs, mark = self.store.scan_changes(fs.VM, self._mark, self._docs)
        if self._mark is not None and mark < self._mark:  # the file was replaced: start over
            self._vms, self._docs, self._index = {}, {}, None
            docs, mark = self.store.scan_changes(fs.VM, None)
        self._mark = mark
        self._take(docs)
        return dict(self._vms)

    def _take(self, docs: Iterable[Doc]) -> None:
        for doc in docs:
            view, before = fs.vm_view(doc.key, fs.vm_document(doc)), self._vms.get(doc.key)
            if before is None or (before.subscription_id, before.name) != (
                view.subscription_id,
                view.name,
            ):
                self._index = None  # the name index is the same unless a name changed
            self._vms[doc.key] = view
            self._docs[doc.key] = doc

    def index(self) -> NameIndex:
        """The name index of the VMs `load` returned last (built again only when it changed)."""
        if self._index is None:
            self._index = _name_index(self._vms)
        return self._index


NameIndex = tuple[fs.Names, dict[str, list[str]]]


def _name_index(vms: Mapping[str, VmView]) -> NameIndex:
    """Names to VmIds as the event view resolves them, and each name's VmIds (by vm_key)."""
    names = fs.Names.of(vms.values())
    ids: dict[str, list[str]] = {}
    for (_, name), vm_id in names.index.items():
        ids.setdefault(name, []).append(vm_id)
    return names, ids


def _vm_mutations(records: Sequence[Mapping[str, Any]]) -> dict[str, Mutation]:
    by_vm: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        if isinstance(record.get("VmId"), str) and record.get("RecordType") != "Decision":
            by_vm.setdefault(record["VmId"], []).append(record)
    return {vm_id: _folder(fs.merge_vm, mine) for vm_id, mine in by_vm.items()}


def _event_mutations(records: Sequence[Mapping[str, Any]]) -> dict[str, Mutation]:
    by_event: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        if record.get("RecordType") in ("Event", "Hook") and isinstance(record.get("EventId"), str):
            by_event.setdefault(fs.event_key(record["EventId"]), []).append(record)
    return {key: _folder(fs.merge_event, mine) for key, mine in by_event.items()}


def _folder(
    merge: Callable[[D, Mapping[str, Any]], bool],
    records: Sequence[Mapping[str, Any]],
) -> Callable[[dict[str, Any]], bool]:
    """A mutation for `bridge.consumer.state.update` that merges every record of `records`."""

    def fold(value: dict[str, Any]) -> bool:
        document = cast(D, value)  # the stored JSON is the document `merge` owns
        changed = False
        for record in records:
            changed = merge(document, record) or changed
        return changed

    return fold
