"""Several connections opening one new SQLite file at the same moment, as processes do."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from bridge import sqlitewal


def _open_together(path: Path, openers: int) -> list[BaseException]:
    failures: list[BaseException] = []
    barrier = threading.Barrier(openers)

    def open_one() -> None:
        barrier.wait()
        try:
            conn = sqlitewal.connect(path, synchronous="FULL", busy_timeout_ms=10_000)
            conn.execute("CREATE TABLE IF NOT EXISTS t (a)")
            conn.close()
        except sqlite3.Error as err:
            failures.append(err)

    threads = [threading.Thread(target=open_one) for _ in range(openers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failures


def test_connections_racing_to_open_a_new_file_all_get_wal(tmp_path: Path) -> None:
    # Plain `PRAGMA journal_mode = WAL` lost about 2% of such races here ("database is locked").
    failures = [f for n in range(100) for f in _open_together(tmp_path / f"{n}.db", 4)]
    assert failures == []
    conn = sqlite3.connect(tmp_path / "0.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_a_file_that_is_not_a_database_is_an_error_at_once(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"not a database" * 100)
    with pytest.raises(sqlite3.DatabaseError, match="not a database"):
        sqlitewal.connect(bad, synchronous="FULL", busy_timeout_ms=10_000)


def test_fully_checkpointed_reads_the_wal_index(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    assert not sqlitewal.fully_checkpointed(path)  # no file, no -shm: unknown
    conn = sqlitewal.connect(path, synchronous="FULL", busy_timeout_ms=1000)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    conn.execute("INSERT INTO t VALUES (1)")
    assert not sqlitewal.fully_checkpointed(path)  # frames not yet in the database
    busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert (busy, frames) == (0, copied)
    assert sqlitewal.fully_checkpointed(path)
    conn.execute("INSERT INTO t VALUES (2)")  # this write restarted the WAL
    assert not sqlitewal.fully_checkpointed(path)
    assert conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1] == 1
    conn.close()
