"""SqliteStore specifics: processes sharing one file, durability, busy and corrupt files."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from bridge.retry import PermanentError, RetryableError
from bridge.state import Doc
from bridge.state import sqlite as sqlite_store
from bridge.state.sqlite import SqliteStore

ROOT = Path(__file__).resolve().parents[2]

_INCREMENTS = """
import sys
from pathlib import Path
from bridge.state.sqlite import SqliteStore
from tests.state_support import increment

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
