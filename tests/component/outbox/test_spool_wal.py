"""The spool's WAL on disk: reserved at open, written in place, checkpointed by acks only.

Why it matters: a durable commit's fdatasync costs about half as much when it overwrites
pages the file already has as when it grows the file (benchmark row 2f against 2g), a
checkpoint inside a record commit would add two more syncs to the poll loop, and restarting
the WAL after a checkpoint adds one (the new header's).
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.outbox.spool import RESERVE_KEY, RESERVE_PAGES, RESTART_KEY, Spool, wal_bytes
from bridge.sqlitewal import fully_checkpointed, wal_path


def rec(n: int) -> dict[str, object]:
    return {"RecordId": f"r{n}", "RecordType": "Event", "N": n}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "spool.db"


@pytest.fixture
def spool(db: Path) -> Iterator[Spool]:
    opened = Spool(db, ["a"])
    yield opened
    opened.close()


def wal_size(db: Path) -> int:
    return wal_path(db).stat().st_size


def digest(db: Path) -> str:
    return hashlib.sha256(db.read_bytes()).hexdigest()


def commit_and_ack(spool: Spool, n: int) -> None:
    spool.commit([rec(n)], state={"k": {"n": n}})
    spool.ack("a", spool.last_seq())


def test_commits_write_into_the_reserved_wal_without_growing_it(spool: Spool, db: Path) -> None:
    commit_and_ack(spool, 0)
    sizes = {wal_size(db)}
    for n in range(1, 200):
        commit_and_ack(spool, n)
        sizes.add(wal_size(db))
    assert sizes == {wal_bytes(RESERVE_PAGES)}
    assert spool.load_state("k") == {"n": 199}


def test_record_commits_leave_checkpoints_to_the_acks(spool: Spool, db: Path) -> None:
    commit_and_ack(spool, 0)
    before = digest(db)
    for n in range(1, 300):  # about 1,200 WAL pages: SQLite's default would checkpoint here
        spool.commit([rec(n)], state={"k": {"n": n}})
    assert digest(db) == before, "a record commit checkpointed the WAL into the database"
    assert wal_size(db) > wal_bytes(RESERVE_PAGES)  # every sink down: the WAL grows

    spool.ack("a", spool.last_seq())
    assert digest(db) != before, "the ack did not checkpoint"
    commit_and_ack(spool, 300)
    assert wal_size(db) == wal_bytes(RESERVE_PAGES)  # back to the reserve, not to nothing
    assert spool.depth() == 0


def test_the_reserve_row_never_outlives_opening(db: Path) -> None:
    Spool(db, ["a"]).close()
    with sqlite3.connect(db) as conn:  # as if the agent died between reserving and deleting
        conn.execute("INSERT INTO state (key, value) VALUES (?, zeroblob(100))", (RESERVE_KEY,))
    conn.close()
    reopened = Spool(db, ["a"])
    try:
        assert reopened.load_state(RESERVE_KEY) is None
        assert wal_size(db) >= wal_bytes(RESERVE_PAGES)
        reopened.commit([rec(1)], state={"k": {"n": 1}})
    finally:
        reopened.close()
    again = Spool(db, ["a"])
    assert again.load_state("k") == {"n": 1}
    again.close()


def test_no_record_commit_is_left_to_restart_the_wal(spool: Spool, db: Path) -> None:
    assert not fully_checkpointed(db)  # opening checkpointed the reserve, then restarted
    checkpoints = 0
    for n in range(300):  # about 1,000 WAL pages: a checkpoint every 256
        before = digest(db)
        commit_and_ack(spool, n)
        checkpoints += digest(db) != before
        # Fully checkpointed here would mean the next record commit writes and syncs a new
        # WAL header first: two syncs instead of one.
        assert not fully_checkpointed(db), f"after ack {n}, the WAL awaits a restart"
    assert checkpoints >= 3
    assert spool.load_state(RESTART_KEY) is None
    assert spool.load_state("k") == {"n": 299}
