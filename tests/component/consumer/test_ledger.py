"""The sharded approval ledger over a real SQLite fleet state: size and contention grow with
a budget group's events, not with the fleet's (issue 15), with the same guarantees."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer.core import Consumer
from bridge.consumer.ledger import (
    ALL_LOCKS,
    LOCK_LOG,
    SHARDS,
    ApprovalLedger,
    LedgerEntry,
    lock_of,
    read_ledger,
    shard_of,
)
from bridge.consumer.state import MAX_VALUE_CHARS, Conflict, Doc
from bridge.consumer.state.sqlite import SqliteStore
from bridge.policy.model import Action, Budget, Match, Policy, Rule, VmView
from tests.support.fleetrecords import FleetRecords
from tests.support.records import Sender

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
APPROVE_ALL = Rule("all", Match(), Action("approve"))


def consumer(store: SqliteStore, fleet: FleetRecords, policy: Policy, sender: Sender) -> Consumer:
    return Consumer(
        store, sender, policy, lambda _: None, ConsumerSettings(), now=lambda: fleet.now
    )


def event_id(n: int) -> str:
    return str(uuid.UUID(int=n + 1)).upper()


@pytest.mark.slow
def test_thousands_of_open_approvals_fit_and_no_document_grows_with_them(tmp_path: Path) -> None:
    # The Spot eviction storm of the load generator: before the shards, the one ledger
    # document passed Table Storage's entity limit at about 1,500 open approvals, and every
    # later approval failed ("fleet state documents hold at most 480000").
    fleet, sender, store = FleetRecords(T0), Sender(), SqliteStore(tmp_path / "fleet.db")
    names = [f"spot_{n}" for n in range(2_000)]
    for name in names:
        fleet.vm(name, scale_set=f"spot-{name[-1]}")
    policy = Policy(rules=(APPROVE_ALL,), budgets=(Budget("all", "scale_set", max_percent=100),))
    storm = consumer(store, fleet, policy, sender)
    storm.process([fleet.heartbeat(name) for name in names])
    storm.process(
        [fleet.event(name, event_id(n), event_type="Preempt") for n, name in enumerate(names)]
    )
    assert len(sender.sent) == len({c.event_id for c in sender.sent}) == 2_000
    docs = store.scan(fs.LEDGER)
    assert len(read_ledger(store).events) == 2_000
    largest = max(len(str(d.value)) for d in docs)
    assert largest < MAX_VALUE_CHARS / 8, largest
    assert sum(d.key.startswith("entries-") for d in docs) == SHARDS
    store.close()


def vm(name: str, scale_set: str) -> VmView:
    return VmView(
        vm_id=name, name=name, resource_group="rg", scale_set=scale_set, subscription_id="sub"
    )


KNOWN = {"a0": vm("a0", "a"), "a1": vm("a1", "a"), "b0": vm("b0", "b")}


def entry(key: str, *vms: str) -> LedgerEntry:
    return {"event_id": key.upper(), "origin": "started", "vms": list(vms)}


def approve(ledger: ApprovalLedger, key: str, *vms: str) -> None:
    """What a decision does: read the ledger, add the entry, write it with its locks."""
    state = ledger.read()
    state.events[key] = entry(key, *vms)
    ledger.commit(state, [key], ledger.locks(vms, KNOWN))


def test_racing_writes_conflict_only_when_they_share_a_budget_group(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    ours, theirs = SqliteStore(path), SqliteStore(path)
    mine = ApprovalLedger(ours, ConsumerSettings(), ["scale_set"])
    other = ApprovalLedger(theirs, ConsumerSettings(), ["scale_set"])
    assert lock_of("scale_set", "sub/rg/a") != lock_of("scale_set", "sub/rg/b")

    state = mine.read()
    approve(other, "e-b", "b0")  # another scale set: no reason to decide again
    state.events["e-a"] = entry("e-a", "a0")
    mine.commit(state, ["e-a"], mine.locks(["a0"], KNOWN))

    state = mine.read()
    approve(other, "e-a1", "a1")  # the same scale set: the slot may be gone
    state.events["e-a0"] = entry("e-a0", "a0")
    with pytest.raises(Conflict):
        mine.commit(state, ["e-a0"], mine.locks(["a0"], KNOWN))
    assert sorted(read_ledger(ours).events) == ["e-a", "e-a1", "e-b"]
    ours.close()
    theirs.close()


def test_a_vm_no_consumer_can_place_takes_every_lock(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "fleet.db")
    ledger = ApprovalLedger(store, ConsumerSettings(), ["scale_set", "zone"])
    assert ledger.locks(["a0", "a1"], KNOWN) == {lock_of("scale_set", "sub/rg/a")}
    assert ledger.locks(["a0", "web_7"], KNOWN) == ALL_LOCKS  # a name no agent reported
    # Without budgets there is no group to lock; the entry's shard still makes two writes
    # of one event meet.
    assert ApprovalLedger(store, ConsumerSettings()).locks(["web_7"], KNOWN) == frozenset()
    state = ledger.read()
    state.events["e1"] = entry("e1", "web_7")
    ledger.commit(state, ["e1"], ALL_LOCKS)
    assert {d.key for d in store.scan(fs.LEDGER)} == ALL_LOCKS | {shard_of("e1")}
    store.close()


def test_an_earlier_releases_single_ledger_is_moved_into_the_shards_and_still_counts(
    tmp_path: Path,
) -> None:
    fleet, sender, store = FleetRecords(T0), Sender(), SqliteStore(tmp_path / "fleet.db")
    for name in ("web_0", "web_1"):
        fleet.vm(name, scale_set="web")
    held = {fs.event_key(event_id(0)): {**entry(event_id(0), fleet.vm_id("web_0"))}}
    store.write(fs.LEDGER, Doc(fs.LEGACY_LEDGER_KEY, {"events": held}))
    policy = Policy(rules=(APPROVE_ALL,), budgets=(Budget("one", "scale_set", max_vms=1),))
    upgraded = consumer(store, fleet, policy, sender)
    upgraded.process([fleet.heartbeat("web_0"), fleet.heartbeat("web_1")])
    upgraded.process([fleet.event("web_1", event_id(1))])
    assert sender.sent == []  # web_0's event, from the old document, holds the one slot
    legacy = store.read(fs.LEDGER, fs.LEGACY_LEDGER_KEY)
    assert legacy is not None
    assert legacy.value == {"events": {}}
    shard = store.read(fs.LEDGER, shard_of(fs.event_key(event_id(0))))
    assert shard is not None
    assert list(shard.value["events"]) == list(held)
    store.close()


def test_releasing_and_marking_touch_only_the_entrys_shard(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    ours, theirs = SqliteStore(path), SqliteStore(path)
    mine = ApprovalLedger(ours, ConsumerSettings(), ["scale_set"])
    approve(mine, "e1", "a0")
    approve(mine, "e2", "b0")
    before: dict[str, Any] = {d.key: d.etag for d in theirs.scan(fs.LEDGER)}
    mine.release("e1", "done")
    after = {d.key: d.etag for d in theirs.scan(fs.LEDGER)}
    assert {k for k in after if after[k] != before[k]} == {shard_of("e1")}
    assert list(read_ledger(theirs).events) == ["e2"]
    ours.close()
    theirs.close()


class WritesFirst(SqliteStore):
    """Runs `first` once, before its next transaction: another consumer's write lands between
    this consumer's read and its write."""

    first: Callable[[], object] | None = None

    def write_all(self, collection: str, docs: Sequence[Doc]) -> list[Doc]:
        if self.first is not None:
            first, self.first = self.first, None
            first()
        return super().write_all(collection, docs)


@pytest.mark.parametrize("other", ["moves the old ledger", "approves in a budget group"])
def test_a_move_of_the_old_ledger_that_conflicts_keeps_every_entry_once(
    tmp_path: Path, other: str
) -> None:
    path = tmp_path / "fleet.db"
    held = {f"e{n}": entry(f"e{n}", f"vm-{n}") for n in range(50)}
    plain = SqliteStore(path)
    plain.write(fs.LEDGER, Doc(fs.LEGACY_LEDGER_KEY, {"events": dict(held)}))
    racing = WritesFirst(path)
    if other == "moves the old ledger":
        racing.first = lambda: ApprovalLedger(SqliteStore(path), ConsumerSettings()).read()
    else:  # a lock the move bumps too, the old document untouched
        racing.first = lambda: plain.write_all(fs.LEDGER, [Doc(min(ALL_LOCKS), {"n": 1})])
    late = ApprovalLedger(racing, ConsumerSettings())
    assert late.read().events == held  # its move conflicted: it read the ledger again
    assert late.read().events == held  # and what it holds of the documents is still right
    assert read_ledger(plain).events == held
    legacy = plain.read(fs.LEDGER, fs.LEGACY_LEDGER_KEY)
    assert legacy is not None
    assert legacy.value == {"events": {}}
    plain.close()
    racing.close()


class Counted(WritesFirst):
    """Counts the ledger's looks (reads of all of it, or of what changed) and the ledger
    documents read by key: on Table Storage a look returns every document written in its
    last 10 s, in a Spot eviction storm all 96 (issue 15)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.looks = 0
        self.by_key: list[str] = []

    def scan(self, collection: str) -> list[Doc]:
        self.looks += collection == fs.LEDGER
        return super().scan(collection)

    def scan_changes(
        self, collection: str, since: int | None, known: Mapping[str, Doc] | None = None
    ) -> tuple[list[Doc], int]:
        self.looks += collection == fs.LEDGER
        return super().scan_changes(collection, since, known)

    def read(self, collection: str, key: str) -> Doc | None:
        self.by_key += [key] if collection == fs.LEDGER else []
        return super().read(collection, key)

    def read_many(self, collection: str, keys: Sequence[str]) -> dict[str, Doc]:
        self.by_key += list(keys) if collection == fs.LEDGER else []
        return super().read_many(collection, keys)


SETS = {f"s{n}-{k}": vm(f"s{n}-{k}", f"s{n}") for n in range(20) for k in range(2)}


def storm(path: Path) -> tuple[Counted, ApprovalLedger, SqliteStore, ApprovalLedger]:
    """Our ledger, on a counted store, and another consumer's, which has approved an event
    in each of 20 scale sets (one VM of each)."""
    ours, theirs = Counted(path), SqliteStore(path)
    mine = ApprovalLedger(ours, ConsumerSettings(), ["scale_set"])
    other = ApprovalLedger(theirs, ConsumerSettings(), ["scale_set"])
    for n in range(20):
        approve_in(other, f"e-{n}-1", f"s{n}-1")
    return ours, mine, theirs, other


def approve_in(ledger: ApprovalLedger, key: str, *vms: str) -> None:
    state = ledger.read()
    state.events[key] = entry(key, *vms)
    ledger.commit(state, [key], ledger.locks(vms, SETS))


def test_a_conflict_reads_what_the_write_contested_and_what_changed_it_not_the_ledger(
    tmp_path: Path,
) -> None:
    ours, mine, theirs, other = storm(tmp_path / "fleet.db")
    state = mine.read()
    # Meanwhile the other consumer approves in s0 (ours's group) and in five other sets.
    for key, name in [("e-0-late", "s0-1"), *((f"e-{n}-late", f"s{n}-1") for n in range(5, 10))]:
        approve_in(other, key, name)
    state.events["e-0-0"] = entry("e-0-0", "s0-0")
    with pytest.raises(Conflict):
        mine.commit(state, ["e-0-0"], mine.locks(["s0-0"], SETS))
    looks, ours.by_key = ours.looks, []
    again = mine.read_again("e-0-0")
    assert ours.looks == looks  # no look at the ledger
    lock = lock_of("scale_set", "sub/rg/s0")
    assert sorted(ours.by_key) == sorted({lock, shard_of("e-0-0"), shard_of("e-0-late")})
    # The slot the other consumer took counts; the write that failed is not in the state.
    assert {"e-0-1", "e-0-late"} <= set(again.events)
    assert "e-0-0" not in again.events
    assert again.impact["e-0-late"] == {"s0-1"}
    # Decided again on that state, the write goes through (what it read is as stored).
    again.events["e-0-0"] = entry("e-0-0", "s0-0")
    mine.commit(again, ["e-0-0"], mine.locks(["s0-0"], SETS))
    assert len(read_ledger(theirs).events) == 27
    assert mine.fetched == 3
    ours.close()
    theirs.close()


@pytest.mark.parametrize("gap", ["an earlier release's write", "more writes than a lock keeps"])
def test_where_a_locks_history_does_not_reach_a_conflict_reads_the_ledger(
    tmp_path: Path, gap: str
) -> None:
    ours, mine, theirs, other = storm(tmp_path / "fleet.db")
    state = mine.read()
    lock = lock_of("scale_set", "sub/rg/s0")
    if gap == "an earlier release's write":  # bumped the count, kept no history
        held = theirs.read(fs.LEDGER, lock)
        assert held is not None
        theirs.write(fs.LEDGER, Doc(lock, {"n": held.value["n"] + 1}, held.etag))
    else:
        for k in range(LOCK_LOG + 1):
            approve_in(other, f"e-0-{k + 2}", "s0-1")
        held = theirs.read(fs.LEDGER, lock)
        assert held is not None
        assert len(held.value["wrote"]) == LOCK_LOG  # the lock does not grow with its writes
    state.events["e-0-0"] = entry("e-0-0", "s0-0")
    with pytest.raises(Conflict):
        mine.commit(state, ["e-0-0"], mine.locks(["s0-0"], SETS))
    looks = ours.looks
    again = mine.read_again("e-0-0")
    assert ours.looks == looks + 1
    assert set(again.events) == set(read_ledger(theirs).events)
    ours.close()
    theirs.close()


def test_a_release_that_conflicts_reads_its_shard_again_not_the_ledger(tmp_path: Path) -> None:
    ours, mine, theirs, other = storm(tmp_path / "fleet.db")
    neighbour = next(f"n-{k}" for k in range(1000) if shard_of(f"n-{k}") == shard_of("e-3-1"))
    approve_in(other, neighbour, "s4-1")
    mine.read()
    # Another consumer writes into the shard of e-3-1 (releases its neighbour there) just
    # before ours's release of e-3-1 is written: ours conflicts once.
    ours.first = lambda: other.release(neighbour, "done")
    looks, ours.by_key = ours.looks, []
    mine.release("e-3-1", "done")
    assert ours.looks == looks
    assert ours.by_key == [shard_of("e-3-1")] * 2  # before the write, and after it conflicted
    assert not {"e-3-1", neighbour} & set(read_ledger(theirs).events)
    ours.close()
    theirs.close()
