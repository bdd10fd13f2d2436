"""What the consumer keeps between reads (VM documents, the ledger it just wrote) stays exact.

Each cache saves a read; each test checks that the read is saved and that a version
another consumer wrote meanwhile is still the one every change lands on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import pytest

from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer.ledger import ApprovalLedger, LedgerState, read_ledger, shard_of
from bridge.consumer.state import Doc, Mutation
from bridge.consumer.state.sqlite import SqliteStore
from bridge.consumer.views import FleetCache
from bridge.records import parse_time
from bridge.retry import RetryableError
from tests.support.fleetrecords import FleetRecords

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
KEY_READS = "SELECT key, etag, value FROM docs WHERE collection = 'vm' AND key IN"
LEDGER_READ = "SELECT key, etag, value FROM docs WHERE collection = 'ledger'"


@contextmanager
def queries(store: SqliteStore) -> Iterator[list[str]]:
    seen: list[str] = []
    store._conn.set_trace_callback(seen.append)
    try:
        yield seen
    finally:
        store._conn.set_trace_callback(None)


def merging(records: dict[str, dict[str, Any]]) -> dict[str, Mutation]:
    """One heartbeat per VmId, as the consumer folds a batch into VM documents."""

    def merge(record: dict[str, Any]) -> Mutation:
        return lambda value: fs.merge_vm(cast(fs.VmDocument, value), record)

    return {vm_id: merge(record) for vm_id, record in records.items()}


class FailingOnce(SqliteStore):
    """A store whose next batch write fails after the values were changed in memory."""

    fail = False

    def write_many(self, collection: str, docs: Sequence[Doc]) -> tuple[list[Doc], list[str]]:
        if self.fail:
            self.fail = False
            raise RetryableError("fleet state busy")
        return super().write_many(collection, docs)


@pytest.fixture
def fleet() -> FleetRecords:
    made = FleetRecords(T0)
    made.vm("web_0", scale_set="web")
    return made


def test_the_vms_written_last_are_not_read_again_yet_a_newer_version_wins(
    tmp_path: Path, fleet: FleetRecords
) -> None:
    ours, theirs = SqliteStore(tmp_path / "fleet.db"), SqliteStore(tmp_path / "fleet.db")
    cache, vm = FleetCache(ours), fleet.vm_id("web_0")
    cache.update(merging({vm: fleet.heartbeat("web_0")}))
    fleet.advance(5)
    with queries(ours) as seen:
        cache.update(merging({vm: fleet.heartbeat("web_0")}))
    assert not [q for q in seen if q.startswith(KEY_READS)]
    older = fleet.heartbeat("web_0")
    fleet.advance(5)
    current = theirs.read("vm", vm)
    assert current is not None
    current.value["last_seen"] = "2099-01-01T00:00:00Z"
    theirs.write("vm", current)
    cache.update(merging({vm: older}))  # held version is stale: conflicts, read, merged again
    assert ours.read("vm", vm).value["last_seen"] == "2099-01-01T00:00:00Z"  # type: ignore[union-attr]
    assert cache.load() == {d.key: fs.vm_view(d.key, fs.vm_document(d)) for d in ours.scan("vm")}
    ours.close()
    theirs.close()


def test_a_failed_write_makes_the_cache_read_those_vms_again(
    tmp_path: Path, fleet: FleetRecords
) -> None:
    store = FailingOnce(tmp_path / "fleet.db")
    cache, vm = FleetCache(store), fleet.vm_id("web_0")
    cache.update(merging({vm: fleet.heartbeat("web_0")}))
    fleet.advance(5)
    store.fail = True
    with pytest.raises(RetryableError):
        cache.update(merging({vm: fleet.heartbeat("web_0")}))  # changed in memory, not stored
    replayed = fleet.heartbeat("web_0")
    with queries(store) as seen:
        cache.update(merging({vm: replayed}))
    assert [q for q in seen if q.startswith(KEY_READS)]
    assert store.read("vm", vm).value["last_seen"] == replayed["TimeGenerated"]  # type: ignore[union-attr]
    assert cache.load()[vm].last_seen == parse_time(replayed["TimeGenerated"])
    store.close()


def unsent(key: str, command_id: str) -> dict[str, Any]:
    return {"event_id": key.upper(), "origin": "approved", "vms": ["vm-0"], "target": "vm-0",
            "command_id": command_id, "command": "{}", "decision": {}, "sent": False}  # fmt: skip


def test_marking_sent_the_ledger_just_written_needs_no_read(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "fleet.db")
    ledger = ApprovalLedger(store, ConsumerSettings())
    written = LedgerState({"e1": unsent("e1", "c1")})  # type: ignore[dict-item]
    ledger.commit(written, ["e1"])
    with queries(store) as seen:
        ledger.mark_sent("e1", "c1", written=written)
    assert not [q for q in seen if q.startswith(LEDGER_READ)]
    expected = {**unsent("e1", "c1"), "sent": True}
    del expected["command"], expected["decision"]  # only a resend needs them
    assert ledger.entries() == {"e1": expected}
    store.close()


def test_marking_sent_over_a_ledger_changed_since_keeps_both_changes(tmp_path: Path) -> None:
    ours, theirs = SqliteStore(tmp_path / "fleet.db"), SqliteStore(tmp_path / "fleet.db")
    ledger = ApprovalLedger(ours, ConsumerSettings())
    written = LedgerState({"e1": unsent("e1", "c1")})  # type: ignore[dict-item]
    ledger.commit(written, ["e1"])
    # Another consumer adds an entry to the same shard after our write.
    e2 = next(f"e{n}" for n in range(2, 10_000) if shard_of(f"e{n}") == shard_of("e1"))
    state = read_ledger(theirs)
    state.events[e2] = unsent(e2, "c2")  # type: ignore[assignment]
    ApprovalLedger(theirs, ConsumerSettings()).commit(state, [e2])
    ledger.mark_sent("e1", "c1", written=written)
    entries = ledger.entries()
    assert sorted(entries) == sorted(["e1", e2])
    assert entries["e1"]["sent"]
    assert not entries[e2]["sent"]
    ours.close()
    theirs.close()


def test_budget_groups_are_kept_across_heartbeats_and_made_again_when_a_vm_moves(
    tmp_path: Path, fleet: FleetRecords
) -> None:
    """Sorting the fleet into groups is the costly part of a budget check at 100,000 VMs
    (issue 15): kept while only heartbeats arrive, never kept past a VM that moved."""
    store = SqliteStore(tmp_path / "fleet.db")
    cache, vm = FleetCache(store), fleet.vm_id("web_0")
    cache.update(merging({vm: fleet.heartbeat("web_0")}))
    cache.load()
    groups = cache.groups(["scale_set"])
    assert {key.rsplit("/", 1)[-1]: ids for key, ids in groups["scale_set"].items()} == {
        "web": frozenset({vm})
    }
    fleet.advance(300)
    cache.update(merging({vm: fleet.heartbeat("web_0")}))
    cache.load()
    assert cache.groups(["scale_set"]) is groups  # a heartbeat moved nothing
    fleet.vm("web_0", scale_set="api")  # the same VM, now reporting another scale set
    fleet.advance(300)
    cache.update(merging({vm: fleet.heartbeat("web_0")}))
    cache.load()
    moved = cache.groups(["scale_set"])
    assert {key.rsplit("/", 1)[-1]: ids for key, ids in moved["scale_set"].items()} == {
        "api": frozenset({vm})
    }
    store.close()


class CostlyFeed(SqliteStore):
    """A change feed whose looks cost a query to a service (as Table Storage's), counted, and
    the scans of every VM document."""

    feed_interval = 15.0

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.vm_looks = 0
        self.vm_scans = 0

    def scan(self, collection: str) -> list[Doc]:
        self.vm_scans += collection == fs.VM
        return super().scan(collection)

    def scan_changes(
        self, collection: str, since: int | None, known: Mapping[str, Doc] | None = None
    ) -> tuple[list[Doc], int]:
        self.vm_looks += collection == fs.VM
        return super().scan_changes(collection, since, known)


def test_the_fleet_is_looked_at_every_so_often_and_our_writes_are_seen(
    tmp_path: Path, fleet: FleetRecords
) -> None:
    # A costly change feed (Table Storage's) is looked at every 15 s. (Every store has a
    # change feed: the scans every 30 s of a store without one are gone, issue 28.)
    every = 15
    ours = CostlyFeed(tmp_path / "fleet.db")
    theirs = SqliteStore(tmp_path / "fleet.db")
    fleet.vm("web_1", scale_set="web")
    cache = FleetCache(ours, now=lambda: fleet.now)
    web_0, web_1 = fleet.vm_id("web_0"), fleet.vm_id("web_1")
    cache.update(merging({web_0: fleet.heartbeat("web_0")}))
    assert set(cache.load()) == {web_0}
    for _ in range(every // 5 - 1):  # batches within the interval: no look; ours are seen
        fleet.advance(5)
        cache.update(merging({web_0: fleet.heartbeat("web_0")}))
        assert cache.load()[web_0].last_seen == fleet.now
    assert ours.vm_looks == 1
    FleetCache(theirs).update(merging({web_1: fleet.heartbeat("web_1")}))  # another consumer
    assert set(cache.load()) == {web_0}
    fleet.advance(6)
    assert set(cache.load()) == {web_0, web_1}
    assert ours.vm_looks == 2
    ours.close()
    theirs.close()
