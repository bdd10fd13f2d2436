"""SqliteStore specifics: processes sharing one file, durability, busy and corrupt files."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from functools import partial
from pathlib import Path

import pytest

from bridge.consumer.state import Doc
from bridge.consumer.state import sqlite as sqlite_store
from bridge.consumer.state.sqlite import SqliteStore
from bridge.retry import PermanentError, RetryableError

ROOT = Path(__file__).resolve().parents[3]

_INCREMENTS = """
import sys
from collections.abc import Callable
from pathlib import Path
from bridge.consumer.state.sqlite import SqliteStore
from tests.support.state import increment

store = SqliteStore(Path(sys.argv[1]))
sys.stdin.readline()  # start together, so the two really contend
print(increment(store, "counters", "c", int(sys.argv[2])), flush=True)
store.close()
"""


def test_two_processes_incrementing_one_counter_lose_no_update(tmp_path: Path) -> None:
    db, times = tmp_path / "fleet.db", 150
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _INCREMENTS, str(db), str(times)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    outputs = [child.communicate(timeout=120)[0] for child in children]
    assert [child.returncode for child in children] == [0, 0]
    assert all(out.strip().isdigit() for out in outputs)  # each reported its Conflicts

    store = SqliteStore(db)
    counter = store.read("counters", "c")
    store.close()
    assert counter is not None
    assert counter.value == {"n": 2 * times}


def test_documents_and_etags_survive_reopening(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "fleet.db"
    store = SqliteStore(db)
    doc = store.write("vms", Doc("vm-1", {"n": 1}))
    store.close()

    reopened = SqliteStore(db)
    try:
        assert reopened.read("vms", "vm-1") == doc
        assert reopened.write("vms", Doc("vm-1", {"n": 2}, doc.etag)).value == {"n": 2}
    finally:
        reopened.close()
    with closing(sqlite3.connect(db)) as conn:  # WAL is the file's: other processes share it
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_file_held_by_another_writer_past_the_busy_timeout_is_retryable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_MS", 50)
    db = tmp_path / "fleet.db"
    store = SqliteStore(db)
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(RetryableError, match="busy"):
            store.write("vms", Doc("vm-1", {"n": 1}))
        holder.execute("ROLLBACK")
        assert store.write("vms", Doc("vm-1", {"n": 1})).value == {"n": 1}
    finally:
        holder.close()
        store.close()


def test_a_file_that_is_not_a_database_is_a_permanent_error_naming_it(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    db.write_bytes(b"this is not SQLite, just some text long enough to look like a header" * 20)
    with pytest.raises(PermanentError, match=str(db)):
        SqliteStore(db)


def test_scan_changes_returns_what_any_connection_wrote_since_the_mark(tmp_path: Path) -> None:
    ours, theirs = SqliteStore(tmp_path / "fleet.db"), SqliteStore(tmp_path / "fleet.db")
    first = ours.write("vm", Doc("a", {"n": 1}))
    ours.write("event", Doc("e", {"n": 1}))
    everything, mark = ours.scan_changes("vm", None)
    assert everything == [first]
    assert ours.scan_changes("vm", mark) == ([], mark)
    theirs.write("vm", Doc("b", {"n": 1}))
    _, conflicted = theirs.write_many("vm", [Doc("a", {"n": 2}, first.etag), Doc("c", {})])
    theirs.write("event", Doc("f", {"n": 1}))  # another collection moves no mark of this one
    changed, later = ours.scan_changes("vm", mark)
    assert conflicted == []
    assert [(d.key, d.value) for d in changed] == [("a", {"n": 2}), ("b", {"n": 1}), ("c", {})]
    assert changed == ours.scan("vm")
    assert ours.scan_changes("vm", later) == ([], later)
    ours.close()
    theirs.close()


def test_a_file_from_before_the_change_feed_is_upgraded_in_place(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    with closing(sqlite3.connect(db)) as old:
        old.execute(
            "CREATE TABLE docs (collection TEXT NOT NULL, key TEXT NOT NULL, etag TEXT NOT NULL,"
            " value TEXT NOT NULL, PRIMARY KEY (collection, key)) WITHOUT ROWID"
        )
        old.execute("INSERT INTO docs VALUES ('vm', 'a', 'e1', '{\"n\": 1}')")
        old.commit()
    store = SqliteStore(db)
    assert store.scan_changes("vm", None) == ([Doc("a", {"n": 1}, "e1")], 0)
    store.write("vm", Doc("a", {"n": 2}, "e1"))
    changed, _ = store.scan_changes("vm", 0)
    assert [d.value for d in changed] == [{"n": 2}]
    store.close()


class Syncs:
    """The synchronous setting of every transaction a store commits."""

    def __init__(self, store: SqliteStore) -> None:
        self.seen: list[tuple[str, int]] = []
        self.store = store
        store._conn.set_trace_callback(self.trace)

    def trace(self, statement: str) -> None:
        if statement == "COMMIT":
            level = self.store._conn.execute("PRAGMA synchronous").fetchone()[0]
            self.seen.append((statement, level))


FULL, NORMAL = 2, 1


def test_deferred_collections_commit_unsynced_until_a_flush(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "fleet.db")
    store.defer_sync(["vm"])
    syncs = Syncs(store)
    store.write_many("vm", [Doc("a", {})])
    store.write("ledger", Doc("approvals", {}))  # FULL: syncs the log, the vm write with it
    store.flush()  # nothing left to sync
    assert [level for _, level in syncs.seen] == [NORMAL, FULL]
    store.write("vm", Doc("b", {}))
    store.flush()
    store.flush()
    assert [level for _, level in syncs.seen] == [NORMAL, FULL, NORMAL, FULL]
    # Outside a deferred transaction the connection is back to FULL (deletes, for one).
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == FULL
    store.close()
    reopened = SqliteStore(tmp_path / "fleet.db")
    assert [d.key for d in reopened.scan("vm")] == ["a", "b"]
    reopened.close()


def test_write_many_names_each_stale_duplicate_or_taken_key_of_one_statement(
    tmp_path: Path,
) -> None:
    """The batch goes to SQLite as one statement per kind; which rows took is still exact."""
    ours, theirs = SqliteStore(tmp_path / "fleet.db"), SqliteStore(tmp_path / "fleet.db")
    old = ours.write("vm", Doc("stale", {"n": 1}))
    theirs.write("vm", Doc("stale", {"n": 2}, old.etag))
    kept = ours.write("vm", Doc("kept", {"n": 1}))
    theirs.write("vm", Doc("taken", {"by": "them"}))
    docs = [
        Doc("new", {"n": 1}),
        Doc("new", {"n": 2}),  # the same key twice: the second is stale once the first is in
        Doc("kept", {"n": 2}, kept.etag),
        Doc("stale", {"n": 3}, old.etag),
        Doc("taken", {"by": "us"}),
    ]
    stored, conflicted = ours.write_many("vm", docs)
    assert conflicted == ["new", "stale", "taken"]
    assert [(d.key, d.value) for d in stored] == [("new", {"n": 1}), ("kept", {"n": 2})]
    assert {d.key: d for d in ours.scan("vm") if d.key in ("new", "kept")} == {
        d.key: d for d in stored
    }
    assert {d.key: d.value for d in ours.scan("vm")} == {
        "kept": {"n": 2}, "new": {"n": 1}, "stale": {"n": 2}, "taken": {"by": "them"}
    }  # fmt: skip
    assert all(len(d.etag or "") == 32 for d in stored)
    assert stored[0].etag != stored[1].etag
    ours.close()
    theirs.close()


def test_scan_changes_leaves_out_the_versions_the_caller_knows(tmp_path: Path) -> None:
    ours, theirs = SqliteStore(tmp_path / "fleet.db"), SqliteStore(tmp_path / "fleet.db")
    a, b = ours.write("vm", Doc("a", {"n": 1})), ours.write("vm", Doc("b", {"n": 1}))
    known = {"a": a, "b": b}
    assert ours.scan_changes("vm", None, known)[0] == []
    _, mark = ours.scan_changes("vm", None)
    newer = theirs.write("vm", Doc("a", {"n": 2}, a.etag))
    ours.write("vm", Doc("b", {"n": 2}, b.etag))
    b_now = ours.read("vm", "b")
    assert b_now is not None
    changed, _ = ours.scan_changes("vm", mark, {**known, "b": b_now})
    assert changed == [newer]  # a: another version than the one known; b: the one known
    ours.close()
    theirs.close()


def _steps_of(
    store: SqliteStore, look: Callable[[], tuple[list[Doc], int]]
) -> tuple[list[Doc], int]:
    """What `look` returned and the SQLite virtual machine steps it cost on the store's
    connection, in thousands (a progress handler): work done, whatever the machine's speed."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    store._conn.set_progress_handler(count, 1000)
    try:
        docs, _ = look()
    finally:
        store._conn.set_progress_handler(None, 0)
    return docs, steps


def test_a_look_for_changes_costs_what_changed_not_the_collection(tmp_path: Path) -> None:
    # The consumer looks for changed VM documents on every decision pass: at 100,000 VMs a
    # look that walked the whole collection (the primary key, to give key order) took half
    # of the consumer's CPU in the freeze wave. Its cost must follow the changes alone.
    costs = []
    for size in (2_000, 20_000):
        store = SqliteStore(tmp_path / f"fleet-{size}.db")
        written, _ = store.write_many("vm", [Doc(f"vm-{i:06}", {"n": i}) for i in range(size)])
        _, mark = store.scan_changes("vm", None)
        again = [Doc(written[i].key, {"n": -i}, written[i].etag) for i in (7, 3, 5)]
        changed = store.write_all("vm", again)
        docs, cost = _steps_of(store, partial(store.scan_changes, "vm", mark))
        costs.append(cost)
        assert [d.key for d in docs] == ["vm-000003", "vm-000005", "vm-000007"]  # key order
        assert sorted(docs, key=lambda d: d.key) == sorted(changed, key=lambda d: d.key)
        store.close()
    small, large = costs
    assert large <= small + 2, f"{small} thousand steps at 2,000 VMs, {large} at 20,000"
