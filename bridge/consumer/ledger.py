"""The approval ledger: what counts against the budgets, and one approval per event.

Commands are sent by bridge.consumer.dispatch; this module only stores what was decided
and how it fared (the decision pass, bridge.consumer.act, is the only one writing it,
besides the answers folded in and the events forgotten).

The ledger holds every event that impacts VMs now: approved by us and not yet completed,
or Started by the platform. Its entries live in SHARDS documents, `ledger/entries-NN`, an
entry in the shard its event key hashes to. A shard's value:

    {"events": {"c7061bac-...": {
        "event_id": "C7061BAC-...", "origin": "approved", "vms": ["1b1f...", "9c2e..."],
        "target": "1b1f...", "attempt": 1, "tried": ["1b1f..."], "rule": "user-initiated",
        "command_id": "3d0c...", "command": "{...}", "issued_at": "2026-11-21T10:00:01.250Z",
        "sent": true, "confirmed": false, "refused": false, "late": false}}}

Beside them, LOCKS small documents `ledger/budget-lock-NN`, each budget group (a budget's
group kind and key, policy.model.group_key) hashing to one:

    {"n": 41, "wrote": [[40, ["entries-07"]], [41, ["entries-19", "entries-30"]]]}

A write that adds impact (an approval, a Started event, an event that grew) stores the
entry's shard and bumps the lock of every group its VMs are in, all in one transaction with
the ETags read (Store.write_all); `wrote` keeps which shards the lock's last LOCK_LOG writes
stored. Two consumers racing for the last slot of a group both bump its lock: one write
conflicts, and the loser reads again and decides again. What it reads again is what its
write contested (the entry's shard, the locks) and the shards the locks' `wrote` name since
the versions it held; the whole ledger only when that history has a gap (more than LOCK_LOG
writes since, or a lock an earlier release wrote, which keeps no history). Where the state
is kept between looks (Table Storage), an approval reads the same way before its write
(`read_again` with its locks, bridge.consumer.act), so that it conflicts only with a write
made in between. Two decisions in
different groups touch different documents and do not wait for each other, and no
document grows with the fleet: a shard holds 1/SHARDS of the open events (the one ledger
document of earlier releases reached Table Storage's entity limit in a Spot eviction storm,
and every approval of the fleet contended for its ETag: docs/capacity.md).

A decision reads every shard and lock (one scan: the locks sort first, so a lock is never
read after an entry that a later write of it added), and counts the impact of every entry
as the single document did. What a state holds therefore meets one rule: for each lock at
the version held, every entry a write up to that version added is held (or released since).
A read after a conflict keeps it: the locks first, then every shard their writes since
stored. On Table Storage a read of the ledger returns every document written in its last
10 s, in a Spot eviction storm all of them, and conflicts come with the approvals;
a read after a conflict returns a few. A VM the ledger names that this consumer cannot place in a
group (a name no agent reported, a VM not known) may be in any group: its write bumps
every lock. Changing SHARDS or LOCKS needs every consumer stopped first.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, TypedDict, cast

from bridge import recordtypes as rt
from bridge.commands.message import LATE, is_late
from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer.drains import (
    DrainGrant,
    drains_nothing,
    note_prepares_sent,
    note_refusals,
    prepare_answers,
)
from bridge.consumer.state import (
    MAX_CONFLICT_RETRIES,
    TRANSACTION_DOCS,
    Conflict,
    Doc,
    Store,
    bucket,
    read_many,
)
from bridge.policy.groups import group_key
from bridge.policy.model import EventView, Scope, VmView
from bridge.records import RecordView
from bridge.retry import RetryableError

log = logging.getLogger(__name__)

# Where the consumer's records (Decisions) go: the service's spool, the Functions app's outlet.
Emit = Callable[[Sequence[rt.Decision]], None]


class _ImpactEntry(TypedDict):
    event_id: str
    # "approved" (by us), "granted" (we granted its drains: approved once they are done) or
    # "started" (by the platform, approved or not)
    origin: str
    vms: list[str]  # VmIds, and names not yet resolved to one: what the budgets count


class LedgerEntry(_ImpactEntry, DrainGrant, total=False):
    """One event in the ledger (the module's sample): a "started" entry has only the three
    keys above (and `scopes`); an "approved" one also the command and how it fared; one
    whose drains were granted (issue 30) what bridge.consumer.drains.DrainGrant keeps."""

    # Where the names of `vms` no VM was known by may be: the scopes, [subscription,
    # resource group, scale set], of the VMs that could see the event (EventView.scopes);
    # absent or empty: anywhere.
    scopes: list[list[str | None]]

    target: str  # the VmId the command went to
    attempt: int
    tried: list[str]  # VmIds asked so far, in order
    rule: str
    command_id: str
    command: str  # the command's JSON, until it is marked sent
    decision: rt.Decision  # its Decision record, until it is marked sent
    issued_at: str
    sent: bool
    confirmed: bool
    refused: bool
    late: bool  # refused as Late: the event Started or ended first; no other VM is asked


SHARDS = 32
LOCKS = 64
# How long a VM asked to carry an approval before it reported the event (the VM the event
# names, alive: bridge.policy.carrier.choose_target) has to answer before a VM that reports the
# event is asked. Its agent sees the event within a poll (1 s), reads its queue at once and
# answers within a few seconds; one that has not is most likely not running, and a Spot
# eviction gives 30 s of notice in all.
UNREPORTED_TARGET_TIMEOUT = timedelta(seconds=10)
# Writes a lock remembers the shards of: a consumer's state is at most a re-evaluation pass
# (5 s) old, and a lock takes well under one write a second in a Spot eviction storm
# (docs/capacity.md); a budget of the whole fleet, one lock taking every write, overruns it:
# then the whole ledger is read.
LOCK_LOG = 32
# A transaction holds the shards it changes and the locks it bumps.
assert SHARDS + LOCKS + 1 <= TRANSACTION_DOCS
_SHARD, _LOCK = "entries-", "budget-lock-"


def ledger_events(value: dict[str, Any]) -> dict[str, LedgerEntry]:
    """The entries of a ledger shard's `value`, by event key (created when missing)."""
    return cast(dict[str, LedgerEntry], value.setdefault("events", {}))


def shard_of(key: str) -> str:
    """The shard document that holds the entry of event `key`."""
    return f"{_SHARD}{bucket(key, SHARDS):02d}"


def lock_of(kind: str, group: str) -> str:
    """The lock document of budget group `group` of kind `kind` (policy.model.group_key)."""
    return f"{_LOCK}{bucket(kind + chr(0) + group, LOCKS):02d}"


ALL_LOCKS = frozenset(f"{_LOCK}{n:02d}" for n in range(LOCKS))


def impact_of(view: EventView) -> LedgerEntry:
    """What an entry of `view` counts: its VMs, and where its names may be."""
    counted = view.counted
    entry: LedgerEntry = {"event_id": view.event_id, "origin": "started", "vms": counted}
    scopes = ledger_scopes(view)
    if scopes:
        entry["scopes"] = scopes
    return entry


def ledger_scopes(view: EventView) -> list[list[str | None]]:
    """An entry's `scopes` for `view`: none when it names no VM by a name (or its reporters'
    scopes are not known: anywhere)."""
    return [list(scope) for scope in view.scopes] if view.unresolved else []


def locks_of(
    kinds: Iterable[str], vms: Iterable[str], known: Mapping[str, VmView]
) -> frozenset[str]:
    """The locks of every budget group of kinds `kinds` the VMs `vms` are in (all of them
    when one of `vms` is not a VM of `known`: it may be in any group)."""
    kinds = tuple(kinds)
    found: set[str] = set()
    for vm_id in vms:
        vm = known.get(vm_id)
        if vm is None:
            return ALL_LOCKS if kinds else frozenset()
        for kind in kinds:
            group = group_key(kind, vm)
            if group is not None:
                found.add(lock_of(kind, group))
    return frozenset(found)


def reach_of(entry: LedgerEntry) -> frozenset[Scope]:
    """`entry`'s scopes as the budgets take them (policy.model.FleetView.reach)."""
    found: set[Scope] = set()
    for scope in entry.get("scopes") or ():
        if isinstance(scope, list) and len(scope) == 3:
            sub, group, scale_set = (s if isinstance(s, str) else None for s in scope)
            found.add((sub, group, scale_set))
    return frozenset(found)


def _answer(entry: LedgerEntry) -> tuple[str, str]:
    """The (CommandId, VmId) an Approval record answering the entry's approval has."""
    return str(entry.get("command_id")), str(entry.get("target")).lower()


def _prepares(entry: LedgerEntry) -> dict[tuple[str, str], str]:
    return prepare_answers(str(entry["event_id"]), entry)


def _answered_by(record: RecordView) -> tuple[str, str]:
    """The (CommandId, VmId) an Approval record answers."""
    return str(record.get("CommandId")), str(record.get("VmId")).lower()


def _count(lock: Doc | None) -> int:
    """How many writes lock `lock` has taken (0 when it does not exist yet)."""
    if lock is None:
        return 0
    count = lock.value.get("n", 0)
    return count if isinstance(count, int) else 0


def _wrote_since(lock: Doc, held: int) -> set[str] | None:
    """The shards the writes of `lock` after its `held`th stored; None when its history
    does not reach back that far (or is not one this module wrote)."""
    count = _count(lock)
    if count < held:
        return None  # fewer writes than the version held: not a history to trust
    kept: dict[int, Any] = {}
    wrote = lock.value.get("wrote", [])
    for item in wrote if isinstance(wrote, list) else ():
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], int):
            kept[item[0]] = item[1]
    shards: set[str] = set()
    for n in range(held + 1, count + 1):
        named = kept.get(n)
        if not isinstance(named, list) or not all(isinstance(s, str) for s in named):
            return None
        shards.update(s for s in named if s.startswith(_SHARD))
    return shards


_VERSIONS = itertools.count()


@dataclass
class LedgerState:
    """The ledger as one read found it: every entry, and the documents they came from at
    the versions read (a commit writes with those ETags).

    Callers change `events` (and entries in place) only to commit them; `impact` follows
    `events` at each commit: what the budgets count, the VMs of each entry.
    """

    events: dict[str, LedgerEntry] = field(default_factory=dict)
    docs: dict[str, Doc] = field(default_factory=dict)  # shards, locks and a legacy document
    impact: dict[str, frozenset[str]] = field(default_factory=dict)
    reach: dict[str, frozenset[Scope]] = field(default_factory=dict)  # entries with `scopes`
    # Changes whenever `impact` does, and differs between states: it names what was counted.
    version: int = field(default_factory=lambda: next(_VERSIONS))

    def count(self, key: str, entry: LedgerEntry | None) -> None:
        """`impact` and `reach` of event `key` as `entry` (None: removed) says."""
        self.impact.pop(key, None)
        self.reach.pop(key, None)
        if entry is not None:
            self.impact[key] = frozenset(entry["vms"])
            if entry.get("scopes"):
                self.reach[key] = reach_of(entry)

    def take(self, doc: Doc) -> None:
        """Hold `doc` (newly read) instead of the version of it held so far."""
        self.version = next(_VERSIONS)
        old = self.docs.get(doc.key)
        self.docs[doc.key] = doc
        if not (doc.key.startswith(_SHARD) or doc.key == fs.LEGACY_LEDGER_KEY):
            return
        for event in old.value.get("events", {}) if old is not None else ():
            self.events.pop(event, None)
            self.count(event, None)
        # Copies: callers change entries in place before they commit them, and the
        # documents must stay as read (a failed commit changes nothing).
        for event, entry in ledger_events(doc.value).items():
            self.events[event] = cast(LedgerEntry, dict(entry))
            self.count(event, entry)


def read_ledger(store: Store) -> LedgerState:
    """Every entry of the ledger in `store` (also what tests and tools look at)."""
    return _state(store.scan(fs.LEDGER))


def _state(docs: Iterable[Doc]) -> LedgerState:
    state = LedgerState()
    for doc in docs:
        state.take(doc)
    return state


def _busy() -> RetryableError:
    return RetryableError(f"the approval ledger kept changing under {MAX_CONFLICT_RETRIES} writes")


class ApprovalLedger:
    def __init__(self, store: Store, settings: ConsumerSettings, kinds: Iterable[str] = ()) -> None:
        self.store = store
        self.settings = settings
        self.kinds = tuple(sorted(set(kinds)))  # the budgets' group kinds
        # The documents as last read or written, and the change feed's mark: a read
        # decodes only the shards written since, not the whole ledger each decision.
        self._docs: dict[str, Doc] = {}
        self._mark: int | None = None
        # The state last read or committed, kept up to date from the change feed: a pass
        # over thousands of open events (a Spot eviction storm) read and copied every
        # entry for each event, and spent most of its time doing so. None after a failed
        # commit: the caller may have changed it without storing the change.
        self._state: LedgerState | None = None
        # For the metrics: reads of the whole ledger (or of what changed in it: on Table
        # Storage each returns every document written in its last 10 s), and writes that
        # found a document changed since it was read.
        self.reads = 0
        self.conflicts = 0
        # Documents read by key: a release's shard; before an approval and after a conflict,
        # what the write takes and what changed it (`read_again`).
        self.fetched = 0
        # Approvals sent that never reached IMDS, counted as their events leave the ledger,
        # by why: late (the agent said so), refused, unanswered.
        self.missed: Counter[str] = Counter()
        # The shards and locks of the last write that conflicted: what to read again.
        self._contested: set[str] = set()

    def held(self) -> LedgerState:
        """The state last read or committed as it is (read when there is none, or after a
        failed commit): a stale state is safe to decide on, since a commit over a document
        changed since conflicts."""
        return self._state if self._state is not None else self.read()

    def read(self) -> LedgerState:
        """The ledger now."""
        self.reads += 1
        self._contested = set()
        changed, self._mark = self.store.scan_changes(fs.LEDGER, self._mark, self._docs)
        self._docs.update((doc.key, doc) for doc in changed)
        if self._state is None:
            self._state = _state(self._docs.values())
        else:
            for doc in changed:
                self._state.take(doc)
        state = self._state
        legacy = state.docs.get(fs.LEGACY_LEDGER_KEY)
        if legacy is not None and ledger_events(legacy.value):
            state = self._migrate(state, legacy)
        return state

    def _migrate(self, state: LedgerState, legacy: Doc) -> LedgerState:
        """Move the entries of an earlier release's single document into the shards, in one
        transaction (every lock bumped: a consumer deciding meanwhile decides again)."""
        moved = set(ledger_events(legacy.value))
        emptied = Doc(legacy.key, {"events": {}}, legacy.etag)  # what was read stays as read
        try:
            self.commit(state, moved, ALL_LOCKS, also=[emptied])
        except Conflict:
            return read_ledger(self.store)  # another consumer moved them, or is deciding
        log.info("moved %d ledger entries into %d shards", len(moved), SHARDS)
        return state

    def _read_shards(self, keys: Collection[str]) -> LedgerState:
        """The kept state with the shards of entries `keys` read again (the whole ledger
        when none is kept yet). A look at the ledger's changes on Table Storage
        returns every document written in its last 10 s: in a storm all of them, for each
        event that completes (issue 15); a release needs only its entry's shard."""
        state = self._kept()
        if state is None:
            return self.read()
        return self._fetch(state, {shard_of(key) for key in keys})

    def _kept(self) -> LedgerState | None:
        """The state kept, as stored (None before the first read): made again from the documents as
        read or written when a failed commit left it holding changes that are not."""
        if self._mark is None:
            return None
        if self._state is None:
            self._state = _state(self._docs.values())
        return self._state

    def _fetch(self, state: LedgerState, keys: Collection[str]) -> LedgerState:
        """`state` with the documents `keys` read again, in key order (locks first)."""
        found = read_many(self.store, fs.LEDGER, sorted(keys))
        self.fetched += len(keys)
        for doc in found.values():
            self._docs[doc.key] = doc
            state.take(doc)
        return state

    def read_again(self, key: str, locks: Collection[str] = ()) -> LedgerState:
        """The ledger for deciding event `key` again, after a write conflicted or where its
        entry must be as stored now: the kept state with the event's shard, the documents
        the write contested, `locks` and the shards their writes since stored read again; the
        whole ledger where the kept state or a lock's history does not reach (see above)."""
        contested, self._contested = {*self._contested, *locks}, set()
        state = self._kept()
        if state is None:
            return self.read()
        wanted = sorted(k for k in contested if k.startswith(_LOCK))
        held = {lock: _count(state.docs.get(lock)) for lock in wanted}
        state = self._fetch(state, wanted)  # before the shards their writes stored
        shards = {shard_of(key), *(k for k in contested if k.startswith(_SHARD))}
        for lock in wanted:
            now = state.docs.get(lock)
            wrote = set() if now is None else _wrote_since(now, held[lock])
            if wrote is None:
                return self.read()
            shards |= wrote
        return self._fetch(state, shards)

    def entries(self) -> dict[str, LedgerEntry]:
        return self.read().events

    def locks(self, vms: Iterable[str], known: Mapping[str, VmView]) -> frozenset[str]:
        """The locks of every budget group the VMs `vms` are in (`locks_of`)."""
        return locks_of(self.kinds, vms, known)

    def commit(
        self,
        state: LedgerState,
        keys: Collection[str],
        locks: Collection[str] = (),
        *,
        also: Sequence[Doc] = (),
    ) -> None:
        """Store the entries `keys` of `state` as they are now (a key missing from
        `state.events` is removed) and bump `locks`, all or nothing; Conflict if any of
        those documents changed since `state` was read. `state` then holds the new ETags."""
        docs = list(also)
        homes: dict[str, set[str]] = {}
        for key in keys:
            homes.setdefault(shard_of(key), set()).add(key)
        for shard, mine in sorted(homes.items()):
            old = state.docs.get(shard)
            members = mine | set(old.value.get("events", {}) if old is not None else ())
            # Copies: the stored documents stay as stored when a caller next changes an entry.
            events = {k: dict(state.events[k]) for k in sorted(members) if k in state.events}
            docs.append(Doc(shard, {"events": events}, None if old is None else old.etag))
        shards = sorted(homes)
        for lock in sorted(locks):
            old = state.docs.get(lock)
            count = _count(old) + 1
            history = old.value.get("wrote", []) if old is not None else []
            history = [
                *(history if isinstance(history, list) else [])[-LOCK_LOG + 1 :],
                [count, shards],
            ]
            value = {"n": count, "wrote": history}
            docs.append(Doc(lock, value, None if old is None else old.etag))
        try:
            written = self.store.write_all(fs.LEDGER, docs)
        except BaseException as err:
            self._state = None  # it may hold changes of the caller's that are not stored
            if isinstance(err, Conflict):
                self.conflicts += 1
                self._contested = {*homes, *locks}
            raise
        self._contested = set()
        for doc in written:
            state.docs[doc.key] = doc
            if self._mark is not None:
                self._docs[doc.key] = doc
        state.version = next(_VERSIONS)
        for key in keys:
            state.count(key, state.events.get(key))
        if state is not self._state:
            self._state = None  # made from documents it no longer matches

    def _update(
        self,
        mutate: Callable[[dict[str, LedgerEntry]], set[str]],
        keys: Collection[str] | None = None,
    ) -> set[str]:
        """Read-modify-write entries until no other writer interferes; the keys changed.

        `mutate` changes entries in place and returns the keys it changed (or removed). No
        lock is bumped: only writes that free a slot or record an outcome come this way.
        `keys`: the only entries `mutate` looks at, when known: only their shards are read.
        """
        for _ in range(MAX_CONFLICT_RETRIES):
            state = self.read() if keys is None else self._read_shards(keys)
            changed = mutate(state.events)
            if not changed:
                return set()
            try:
                self.commit(state, changed)
            except Conflict:
                continue
            return changed
        raise _busy()

    def note_approvals(self, records: Sequence[RecordView]) -> set[str]:
        """Fold Approval records into the ledger; the events whose approval they answer."""
        # Keyed by (CommandId, VmId): only the VM the command went to can answer it, so a VM
        # cannot mark another VM's command refused or done by sending records in its name.
        approvals = [
            r for r in records if r.get(rt.RECORD_TYPE) == "Approval" and r.get("CommandId")
        ]
        outcomes = {
            _answered_by(r): LATE if is_late(r) else str(r.get("ApprovalOutcome"))
            for r in approvals
        }
        if not outcomes:
            return set()
        no_drain = {_answered_by(r) for r in approvals if drains_nothing(r)}

        def fold(events: dict[str, LedgerEntry]) -> set[str]:
            touched = set()
            for key, entry in events.items():
                if note_refusals(str(entry["event_id"]), entry, no_drain):
                    touched.add(key)
                answer = (str(entry.get("command_id")), str(entry.get("target")).lower())
                outcome = outcomes.get(answer)
                if outcome is None or entry.get("confirmed"):
                    continue
                mark: Literal["confirmed", "late", "refused"] = (
                    "confirmed"
                    if outcome == "Approved"
                    else "late"
                    if outcome == LATE
                    else "refused"
                )
                if not entry.get(mark):
                    entry[mark] = True
                    touched.add(key)
            return touched

        return self._update(fold, self._answered(outcomes.keys()))

    def _answered(self, answers: Collection[tuple[str, str]]) -> list[str] | None:
        """The keys of the kept entries that `answers` (CommandId, VmId) are for; None when
        one is for no entry kept (another consumer's newest, or an old one): then the
        whole ledger is read. An answer comes for every approval; a read of what changed in
        the ledger on Table Storage returns every document written in its last 10 s."""
        if self._mark is None or self._state is None:
            return None
        found = {}
        for key, entry in self._state.events.items():
            for answer in (_answer(entry), *_prepares(entry)):
                if answer in answers:
                    found[answer] = key
        return sorted(found.values()) if len(found) == len(answers) else None

    def mark_prepared(self, key: str, *, written: LedgerState | None = None) -> None:
        """Mark the Prepares of the entry's drains sent (`written`: as `mark_sent`)."""

        def sent(events: dict[str, LedgerEntry]) -> set[str]:
            return {key} if note_prepares_sent(events.get(key)) else set()

        self._settle(sent, key, written)

    def note_started(
        self, state: LedgerState, key: str, view: EventView, known: Mapping[str, VmView]
    ) -> None:
        """A Started event impacts its VMs whether or not we approved it."""
        if key in state.events:
            return
        started = impact_of(view)
        locks = self.locks(started["vms"], known)
        # Not left to a later pass: until it is in the ledger, the approvals decided in
        # between (this pass's next events, other consumers) would not count its VMs.
        for _ in range(MAX_CONFLICT_RETRIES):
            if key in state.events:
                return
            state.events[key] = started
            try:
                self.commit(state, [key], locks)
            except Conflict:
                state = self.read_again(key)
                continue
            return
        raise _busy()

    def release(self, key: str, why: str) -> None:
        dropped: list[LedgerEntry] = []

        def drop(events: dict[str, LedgerEntry]) -> set[str]:
            entry = events.pop(key, None)
            dropped[:] = [] if entry is None else [entry]
            return {key} if entry is not None else set()

        if self._update(drop, [key]):
            log.info("event %s no longer counts against budgets: %s", key, why)
            self._count_missed(dropped[0])

    def _count_missed(self, entry: LedgerEntry) -> None:
        """Count (and say) an approval we sent that never reached IMDS, as its event ends."""
        if entry.get("origin") != "approved" or not entry.get("sent") or entry.get("confirmed"):
            return
        late, refused = entry.get("late"), entry.get("refused")
        reason = "late" if late else "refused" if refused else "unanswered"
        self.missed[reason] += 1
        why = {
            "late": "its agent read the command after the event had Started or ended (Late)",
            "refused": "the last VM asked refused it (see its Approval record)",
            "unanswered": "no answer came: the VM did not read the command before the event "
            "went ahead, or its Approval record is still on the way",
        }[reason]
        log.warning(
            "the approval of event %s (rule %s, attempt %s, command %s to VM %s) never "
            "reached IMDS: %s; the event went ahead without it",
            entry["event_id"],
            entry.get("rule"),
            entry.get("attempt"),
            entry.get("command_id"),
            entry.get("target"),
            why,
        )

    def mark_sent(
        self,
        key: str,
        command_id: str,
        *,
        written: LedgerState | None = None,
        confirmed: bool = False,
    ) -> None:
        """Mark the entry's command sent; `written`: the ledger as this process just stored it.

        From `written` the change is made without reading the ledger again; if another
        consumer wrote the entry's shard since, the write conflicts and the newest is read.
        """

        def sent(events: dict[str, LedgerEntry]) -> set[str]:
            entry = events.get(key)
            if entry is None or entry.get("command_id") != command_id or entry.get("sent"):
                return set()
            entry["sent"] = True
            if confirmed:  # shadow mode: no agent answers; taken as a cooperative one would
                entry["confirmed"] = True
            # Only a resend needs these; dropped, every decision reads and writes shards
            # that stay small however many approvals are open.
            entry.pop("command", None)
            entry.pop("decision", None)
            return {key}

        self._settle(sent, key, written)

    def _settle(
        self,
        mutate: Callable[[dict[str, LedgerEntry]], set[str]],
        key: str,
        written: LedgerState | None,
    ) -> None:
        """`mutate` the entry `key` from `written` without reading the ledger again; if
        another consumer wrote its shard since, the write conflicts and the newest is read."""
        if written is not None and mutate(written.events):
            try:
                self.commit(written, [key])
            except Conflict:
                pass
            else:
                return
        self._update(mutate, [key])
