"""What the consumer keeps of the store between looks: the VMs (FleetCache), the VMs of one
pass caught up with the ledger (VmSnapshot), the events the tick looks at (EventIndex), and
the names the events give their VMs by (the name index).

Each saves reads that cost a query per document where the store is a service (Table
Storage); the store's `feed_interval` says how often a look is worth making.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from bridge.consumer import documents as fs
from bridge.consumer.state import Doc, Mutation, Store, read_many, update_many
from bridge.policy.budgets import cordoned_impact
from bridge.policy.groups import group_index, pool_disputes
from bridge.policy.model import HEALTH, Scope, VmView, scope_of
from bridge.records import parse_time, utc_now, vm_key

log = logging.getLogger(__name__)

# (the VMs known) -> the patch runs counting now, as pseudo events (FleetView.impacted)
# The patch runs counting now, of the VMs given: their pseudo events and where the names of
# VMs no agent reports may be (bridge.policy.patchruns.counted).
PatchImpact = Callable[
    [Mapping[str, VmView]], tuple[dict[str, frozenset[str]], dict[str, frozenset[Scope]]]
]

# The events are read in full this often, and between two such reads only those written
# since (EventIndex).
RESCAN_EVENTS = timedelta(minutes=5)


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

    The documents are kept from tick to tick: each tick asks the change feed for those
    written since, and every RESCAN_EVENTS reads them all, which also drops those another
    consumer deleted meanwhile (the feed does not report deletions). Only forgetting deletes
    an event, after `stale_after` without a report, and a kept copy is as silent: the tick
    finds it stale too, reads it again and drops it. A scan every tick (5 s) read every event
    of the last `stale_after` (6 h): after the 100,000-VM freeze wave 14,819 documents a
    tick per consumer, past a table partition's 2,000 entities/s on Table Storage (issue 15),
    and on SQLite a fifth of the consumer's CPU decoding them (issue 35).
    """

    def __init__(self, store: Store, *, now: Callable[[], datetime] = utc_now) -> None:
        self.store = store
        self._docs: dict[str, Doc] = {}
        self._mark: int | None = None
        self._full = _Paced(now)
        # How often every document is read again; None: only the first time, for a store no
        # other consumer changes (a replay's: bridge.consumer.replay.Replayer).
        self.rescan: timedelta | None = RESCAN_EVENTS

    def scan(self) -> list[Doc]:
        store = self.store
        full = self._mark is None if self.rescan is None else self._full.due(self.rescan)
        if full:
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
        # The cordoned nodes, as impact (policy.model.cordoned_impact).
        self._cordoned: dict[str, frozenset[str]] = {}
        # The VMs resource health reports down (fs.HealthDocument), read once a snapshot.
        self._health_docs = fleet.health()
        self._patch_impact = fleet.patch_impact
        self._patches: dict[str, frozenset[str]] | None = None  # once a snapshot
        # The patch runs' keys of the impact `by_vm_id` gives (FleetView.patch_runs): made
        # once a snapshot, so that a budget check names the runs without a scan of it.
        self.patch_runs: tuple[str, ...] = ()
        # What they impact (HEALTH + VmId or name), where a name may be, and since when.
        self.health_reach: dict[str, frozenset[Scope]] = {}
        self.unhealthy: dict[str, tuple[str, datetime]] = {}
        # Where the names of the patch runs' VMs no agent reports may be (made with them).
        self.patch_reach: dict[str, frozenset[Scope]] = {}
        self._scan()

    def _scan(self) -> None:
        self.vms = self._fleet.load()
        self._cordoned = self._fleet.cordoned()
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
        # After the entries: a node cordoned by someone else counts whatever they say, and a
        # VM resource health reports down whatever its agent says.
        resolved.update(self._cordoned)
        resolved.update(self._health_impact())
        if self._patch_impact is not None:
            # A patch run's VMs count in every budget from its start (issue 40).
            if self._patches is None:
                self._patches, self.patch_reach = self._patch_impact(self.vms)
                self.patch_runs = tuple(sorted(self._patches))
            resolved.update(self._patches)
        if version is not None:
            self._resolved = (version, self._generation, resolved)
        return resolved

    @property
    def reach(self) -> dict[str, frozenset[Scope]]:
        """Where the names resource health and the patch runs count may be (FleetView.reach,
        beside the ledger's): known once `by_vm_id` has made their impact."""
        if not self.patch_reach:
            return self.health_reach
        return {**self.health_reach, **self.patch_reach}

    def _health_impact(self) -> dict[str, frozenset[str]]:
        """The VMs resource health reports Unavailable or Degraded, as pseudo events: by
        their full resource id, else their name in their scope, else their name (a VM no
        agent reports, counted where its scope can be, as an event's unknown name is)."""
        impact: dict[str, frozenset[str]] = {}
        self.health_reach, self.unhealthy = {}, {}
        for doc in self._health_docs:
            value = doc.value
            since = parse_time(value.get("since"))
            if value.get("state") not in fs.UNHEALTHY or since is None:
                continue
            scope = fs.scope_from(value.get("scope"))
            name = str(value.get("name") or "")
            vm = self.names.by_id.get(str(value.get("resource_id"))) or self.names.index.get(
                (scope, vm_key(name))
            )
            key = HEALTH + (vm or name)
            impact[key] = frozenset((vm or name,))
            self.health_reach[key] = frozenset((scope,))
            self.unhealthy[vm or name] = (str(value["state"]), since)
        return impact

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
                self.vms[vm] = view = fs.vm_view(vm, fs.vm_document(doc))
                self._cordoned.update(cordoned_impact([view]))
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

    Only the VMs written since the last look are read (the store's change feed); that
    includes those written by other consumers (VMs are deleted only by the hourly sweep,
    which drops them here too). Where each look is a query to a service (Table Storage),
    `load` looks at most every `feed_interval` seconds and takes the VMs this process
    writes as written.
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
        # The documents `_vms` was made from, at the version last seen.
        self._docs: dict[str, Doc] = {}
        self._index: NameIndex | None = None
        self._groups: dict[str, dict[str, frozenset[str]]] = {}  # kept while no VM moves
        # The VMs whose nodes someone else cordoned: a few, kept as they change rather than
        # looked for among every VM at each batch, which costs a large fleet's batches
        # (docs/capacity.md#figures-behind-the-codes-choices).
        self._cordoned: set[str] = set()
        # What the heartbeats' node pools and the scale sets disagree on, as last said.
        self._disputes: set[str] = set()
        self.health_counts = False  # the health source is on (Consumer's `health`)
        # Update Manager's patch runs counting now, as pseudo events of the VMs given
        # (bridge.consumer.patchruns.PatchRuns.impact); None while patchruns is off.
        self.patch_impact: PatchImpact | None = None
        self._now = now
        self._health: list[Doc] = []
        self._health_looks = _Paced(now)

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

        Their ETags tell a later load which of the documents written since its mark are
        these versions (skipped) and which are newer (read).
        """
        self._take(doc for doc in docs if doc is not None and doc.etag is not None)

    def load(self) -> dict[str, VmView]:
        every = timedelta(seconds=self.store.feed_interval)
        if self.store.feed_interval and not self._looks.due(every):
            return dict(self._vms)
        docs, mark = self.store.scan_changes(fs.VM, self._mark, self._docs)
        if self._mark is not None and mark < self._mark:  # the file was replaced: start over
            self._vms, self._docs, self._index, self._groups = {}, {}, None, {}
            self._cordoned = set()
            docs, mark = self.store.scan_changes(fs.VM, None)
        self._mark = mark
        self._take(docs)
        return dict(self._vms)

    def _take(self, docs: Iterable[Doc]) -> None:
        for doc in docs:
            view, before = fs.vm_view(doc.key, fs.vm_document(doc)), self._vms.get(doc.key)
            if before is None or _renamed(before, view):
                self._index = None  # the same unless a name, its scope or a stop changed
            if before is None or _moved(before, view):
                self._groups = {}  # a heartbeat moves no VM: the groups stay
            self._vms[doc.key] = view
            self._docs[doc.key] = doc
            if view.cordoned or view.held:
                self._cordoned.add(doc.key)
            else:
                self._cordoned.discard(doc.key)

    def documents(self) -> list[Doc]:
        """Every VM document as last looked at or written (`load` first)."""
        self.load()
        return list(self._docs.values())

    def retain(self, keys: set[str]) -> None:
        """Drop the cached VMs not in `keys` (removed from the store)."""
        for key in [k for k in self._vms if k not in keys]:
            del self._vms[key]
            self._cordoned.discard(key)
            self._docs.pop(key, None)
            self._index = None
            self._groups = {}

    def health(self) -> list[Doc]:
        """The health documents (none while the health source is off): read at most every
        feed_interval where a read costs a query. Few: Azure reports on VMs as they change."""
        if not self.health_counts:
            return []
        every = timedelta(seconds=self.store.feed_interval)
        if not self.store.feed_interval or self._health_looks.due(every):
            self._health = self.store.scan(fs.HEALTH)
        # Azure reports a change of health, not the state again: a VM down for a long repair
        # sends nothing more, and its silent agent does not count it. So a report counts until
        # Available, however old: a VM deleted while down holds its slots until then (safe, if
        # slow; docs/second-source.md).
        return list(self._health)

    def cordoned(self) -> dict[str, frozenset[str]]:
        """The impact of the cordoned nodes among the VMs `load` returned last."""
        return cordoned_impact(self._vms[key] for key in sorted(self._cordoned))

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
        if "node_pool" in missing:
            self._dispute()
        return self._groups

    def _dispute(self) -> None:
        """Say each disagreement between a node's pool and its scale set once, when it
        starts (the groups are made again only when a VM came, went or moved)."""
        said = set(pool_disputes(self._vms.values()))
        for line in sorted(said - self._disputes):
            log.warning(
                "%s. A node's pool label is its own word: a VM is never counted in "
                "a pool beyond its scale set (docs/policy.md#budgets)",
                line,
            )
        self._disputes = said


def _renamed(before: VmView, view: VmView) -> bool:
    """Whether what the name index holds of a VM changed: its name, its scope, a stop."""
    if (before.name, before.subscription_id, before.resource_group, before.scale_set) == (
        view.name,
        view.subscription_id,
        view.resource_group,
        view.scale_set,
    ):  # the fields the scope is made of, as they are: the same scope (every heartbeat)
        return (before.last_seen is None) != (view.last_seen is None)
    return (scope_of(before), before.name, before.last_seen is None) != (
        scope_of(view),
        view.name,
        view.last_seen is None,
    )


def _moved(before: VmView, view: VmView) -> bool:
    """Whether a VM moved between budget groups: what puts it in them differs
    (policy.model.group_key). Its tags compared as dicts: the same as their sorted items,
    without sorting them at every heartbeat."""
    return (
        before.subscription_id,
        before.resource_group,
        before.scale_set,
        before.location,
        before.zone,
        before.fault_domain,
        before.update_domain,
        before.node_pool,
    ) != (
        view.subscription_id,
        view.resource_group,
        view.scale_set,
        view.location,
        view.zone,
        view.fault_domain,
        view.update_domain,
        view.node_pool,
    ) or before.tags != view.tags


NameIndex = tuple[fs.Names, dict[str, list[str]]]


def _name_index(vms: Mapping[str, VmView]) -> NameIndex:
    """Names to VmIds as the event view resolves them, and each name's VmIds (by vm_key)."""
    names = fs.Names.of(vms.values())
    ids: dict[str, list[str]] = {}
    for (_, name), vm_id in names.index.items():
        ids.setdefault(name, []).append(vm_id)
    return names, ids
