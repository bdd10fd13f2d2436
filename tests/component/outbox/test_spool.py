"""The spool against a real SQLite file: durability, atomicity, progress, bounds, concurrency."""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from bridge.outbox.spool import Spool, SpoolError

OpenSpool = Callable[..., Spool]


def rec(n: int, record_type: str = "Event", **extra: Any) -> dict[str, Any]:
    return {"RecordId": f"r{n}", "RecordType": record_type, "N": n, **extra}


def ids(records: Sequence[Any]) -> list[str]:
    return [r.record_id for r in records]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state" / "spool.db"


@pytest.fixture
def open_spool(db: Path) -> Iterator[OpenSpool]:
    opened: list[Spool] = []

    def open_(sinks: Sequence[str] = ("a",), **kwargs: Any) -> Spool:
        spool = Spool(kwargs.pop("path", db), sinks, **kwargs)
        opened.append(spool)
        return spool

    yield open_
    for spool in opened:
        spool.close()


def reopen(spool: Spool, sinks: Sequence[str] | None = None, **kwargs: Any) -> Spool:
    spool.close()
    return Spool(spool.path, spool.sinks if sinks is None else sinks, **kwargs)


# --- records, state, atomicity -----------------------------------------------------------


def test_records_come_back_in_order_as_compact_json(open_spool: OpenSpool, db: Path) -> None:
    spool = open_spool()
    spool.commit([rec(1), rec(2, Transition="Started")])
    spool.commit([rec(3, "Heartbeat")])

    batch = spool.read_batch("a", 10)

    assert [r.seq for r in batch] == sorted(r.seq for r in batch)
    assert ids(batch) == ["r1", "r2", "r3"]
    assert [r.record_type for r in batch] == ["Event", "Event", "Heartbeat"]
    assert batch[1].body == '{"RecordId":"r2","RecordType":"Event","N":2,"Transition":"Started"}'
    assert db.parent.is_dir()  # created on demand


def test_state_and_records_of_one_commit_survive_reopening_together(
    open_spool: OpenSpool,
) -> None:
    spool = open_spool()
    spool.commit([rec(1)], state={"normaliser": {"incarnation": 7, "events": {"e": "x"}}})
    spool.commit([], state={"other": {"k": [1, 2]}})

    spool = reopen(spool)
    try:
        assert spool.load_state("normaliser") == {"incarnation": 7, "events": {"e": "x"}}
        assert spool.load_state("other") == {"k": [1, 2]}
        assert spool.load_state("missing") is None
        assert ids(spool.read_batch("a", 10)) == ["r1"]
    finally:
        spool.close()


def test_state_is_replaced_not_merged(open_spool: OpenSpool) -> None:
    spool = open_spool()
    spool.commit([], state={"normaliser": {"a": 1, "b": 2}})
    spool.commit([], state={"normaliser": {"a": 3}})
    assert spool.load_state("normaliser") == {"a": 3}


@pytest.mark.parametrize(
    "bad",
    [
        {"records": [rec(1), rec(2, Bad=object())]},
        {"records": [rec(1), rec(2, Bad=math.nan)]},
        {"records": [rec(1), {"RecordType": "Event"}]},
        {"records": [rec(1)], "state": {"normaliser": {"when": object()}}},
        {"records": [rec(1)], "jobs": [("j1", {"f": {1, 2}})]},
    ],
    ids=["object", "nan", "no-record-id", "state", "job"],
)
def test_unserialisable_commit_raises_type_error_and_writes_nothing(
    open_spool: OpenSpool, bad: dict[str, Any]
) -> None:
    spool = open_spool()
    spool.commit([rec(0)], state={"normaliser": {"v": 0}})

    with pytest.raises(TypeError):
        spool.commit(**bad)

    spool = reopen(spool)
    try:
        assert ids(spool.read_batch("a", 10)) == ["r0"]
        assert spool.load_state("normaliser") == {"v": 0}
        assert spool.pending_jobs() == []
    finally:
        spool.close()


_CRASH_LOOP = """
import sys
from pathlib import Path
from bridge.outbox.spool import Spool

spool = Spool(Path(sys.argv[1]), ["a"])
n = 0
while True:
    records = [{"RecordId": f"{n}-{k}", "RecordType": "Event", "N": n} for k in range(3)]
    spool.commit(records, state={"normaliser": {"n": n}})
    print(n, flush=True)
    n += 1
"""


@pytest.mark.parametrize("kill_delay", [0.0, 0.002, 0.005, 0.013, 0.031])
def test_kill_9_while_committing_never_separates_state_from_records(
    db: Path, kill_delay: float
) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _CRASH_LOOP, str(db)], stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        acknowledged = int(child.stdout.readline())
        while acknowledged < 10:
            acknowledged = int(child.stdout.readline())
        # Delays out of step with the child's loop land the kill at different points of a
        # commit; the assertions below hold wherever it lands.
        time.sleep(kill_delay)
        child.kill()  # SIGKILL on POSIX, TerminateProcess on Windows: no clean-up runs
        child.wait()

    spool = Spool(db, ["a"])
    try:
        state = spool.load_state("normaliser")
        records = spool.read_batch("a", 10_000)
    finally:
        spool.close()
    assert state is not None
    last = state["n"]
    assert last >= acknowledged  # everything the child saw committed is there
    assert ids(records) == [f"{n}-{k}" for n in range(last + 1) for k in range(3)]


class _FailingOnState:
    """Stands in for the spool's connection and fails once the records are inserted."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        if sql.startswith("INSERT INTO state"):
            raise sqlite3.OperationalError("disk I/O error (simulated)")
        return self._conn.executemany(sql, rows)


def test_failure_midway_through_a_commit_leaves_nothing(open_spool: OpenSpool) -> None:
    spool = open_spool()
    spool.commit([rec(0)], state={"normaliser": {"n": 0}})
    real = spool._durable
    spool._durable = _FailingOnState(real)  # type: ignore[assignment]
    with pytest.raises(sqlite3.OperationalError, match="simulated"):
        spool.commit([rec(1), rec(2)], state={"normaliser": {"n": 1}})
    spool._durable = real

    spool = reopen(spool)
    try:
        assert ids(spool.read_batch("a", 10)) == ["r0"]
        assert spool.load_state("normaliser") == {"n": 0}
    finally:
        spool.close()


def test_corrupt_file_is_a_clear_error_naming_the_path(db: Path) -> None:
    db.parent.mkdir(parents=True)
    db.write_bytes(b"this is not a database, it is a text file that got in the way" * 100)
    with pytest.raises(SpoolError, match="unreadable or corrupt") as caught:
        Spool(db, ["a"])
    assert str(db) in str(caught.value)


def test_some_other_sqlite_database_is_refused(db: Path) -> None:
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(SpoolError, match="not an se-bridge spool") as caught:
        Spool(db, ["a"])
    assert str(db) in str(caught.value)


def test_uncreatable_directory_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SpoolError, match="cannot create the spool directory"):
        Spool(blocker / "sub" / "spool.db", ["a"])


def test_closed_spool_refuses_use(open_spool: OpenSpool) -> None:
    spool = open_spool()
    spool.close()
    spool.close()  # idempotent
    with pytest.raises(SpoolError, match="closed"):
        spool.commit([rec(1)])


def test_bad_sink_names_are_refused(open_spool: OpenSpool) -> None:
    with pytest.raises(ValueError, match="unique"):
        open_spool(["a", "a"])
    spool = open_spool(["a"])
    with pytest.raises(ValueError, match="not configured"):
        spool.read_batch("b", 1)


# --- jobs ---------------------------------------------------------------------------------


def test_jobs_are_kept_until_finished_and_duplicates_ignored(open_spool: OpenSpool) -> None:
    spool = open_spool()
    spool.commit([rec(1)], jobs=[("j1", {"cmd": "prepare"}), ("j2", {"cmd": "recover"})])
    spool.commit([], jobs=[("j1", {"cmd": "changed"}), ("j3", {})])
    assert spool.pending_jobs() == [
        ("j1", {"cmd": "prepare"}),
        ("j2", {"cmd": "recover"}),
        ("j3", {}),
    ]

    spool.finish_job("j2", [rec(2, "Hook")])
    spool = reopen(spool)
    try:
        assert [job_id for job_id, _ in spool.pending_jobs()] == ["j1", "j3"]
        assert ids(spool.read_batch("a", 10)) == ["r1", "r2"]
    finally:
        spool.close()


def test_failed_finish_job_keeps_the_job(open_spool: OpenSpool) -> None:
    spool = open_spool()
    spool.commit([], jobs=[("j1", {})])
    with pytest.raises(TypeError):
        spool.finish_job("j1", [rec(1, "Hook", Output=b"bytes")])
    assert spool.pending_jobs() == [("j1", {})]
    assert spool.depth() == 0


# --- progress, acks, dead letters ---------------------------------------------------------


def test_record_is_deleted_only_when_every_sink_has_it(open_spool: OpenSpool) -> None:
    spool = open_spool(["a", "b"])
    spool.commit([rec(1), rec(2), rec(3)])
    seqs = [r.seq for r in spool.read_batch("a", 10)]

    spool.ack("a", seqs[2])
    assert spool.depth() == 3
    assert spool.read_batch("a", 10) == []
    spool.ack("b", seqs[0])
    assert spool.depth() == 2
    assert ids(spool.read_batch("b", 10)) == ["r2", "r3"]
    spool.ack("b", seqs[2])
    assert spool.depth() == 0


def test_ack_never_moves_progress_backwards(open_spool: OpenSpool) -> None:
    spool = open_spool()
    spool.commit([rec(1), rec(2)])
    last = spool.read_batch("a", 10)[-1].seq
    spool.ack("a", last)
    spool.ack("a", last - 1)
    assert spool.acked("a") == last
    assert spool.read_batch("a", 10) == []


def test_progress_survives_reopening(open_spool: OpenSpool) -> None:
    spool = open_spool(["a", "b"])
    spool.commit([rec(n) for n in range(1, 6)])
    spool.ack("a", spool.read_batch("a", 2)[-1].seq)

    spool = reopen(spool)
    try:
        assert ids(spool.read_batch("a", 10)) == ["r3", "r4", "r5"]
        assert ids(spool.read_batch("b", 10)) == ["r1", "r2", "r3", "r4", "r5"]
        assert spool.depth() == 5
    finally:
        spool.close()


def test_read_batch_respects_the_limit(open_spool: OpenSpool) -> None:
    spool = open_spool()
    spool.commit([rec(n) for n in range(10)])
    assert ids(spool.read_batch("a", 3)) == ["r0", "r1", "r2"]


def test_new_sink_starts_at_the_oldest_record_still_held(open_spool: OpenSpool) -> None:
    spool = open_spool(["a"])
    spool.commit([rec(1), rec(2), rec(3)])
    spool.ack("a", spool.read_batch("a", 1)[0].seq)  # r1 is gone, r2 and r3 are held

    spool = reopen(spool, ["a", "b"])
    try:
        assert ids(spool.read_batch("b", 10)) == ["r2", "r3"]
    finally:
        spool.close()


def test_new_sink_on_an_empty_spool_gets_only_new_records(open_spool: OpenSpool) -> None:
    spool = open_spool(["a"])
    spool.commit([rec(1)])
    spool.ack("a", spool.read_batch("a", 1)[0].seq)

    spool = reopen(spool, ["a", "b"])
    try:
        assert spool.read_batch("b", 10) == []
        spool.commit([rec(2)])
        assert ids(spool.read_batch("b", 10)) == ["r2"]
    finally:
        spool.close()


def test_removed_sink_no_longer_holds_records(open_spool: OpenSpool) -> None:
    spool = open_spool(["a", "gone"])
    spool.commit([rec(1), rec(2)])
    spool.ack("a", spool.read_batch("a", 10)[-1].seq)
    assert spool.depth() == 2

    spool = reopen(spool, ["a"])
    try:
        assert spool.depth() == 0
    finally:
        spool.close()


def test_dead_letters_are_kept_listable_and_count_as_handled(open_spool: OpenSpool) -> None:
    spool = open_spool(["a", "b"])
    spool.commit([rec(1), rec(2), rec(3)])
    seqs = [r.seq for r in spool.read_batch("a", 10)]

    spool.dead_letter("a", [seqs[1]], "schema rejected: Zone is not a string")
    assert ids(spool.read_batch("a", 10)) == ["r1", "r3"]  # skipped for a
    assert ids(spool.read_batch("b", 10)) == ["r1", "r2", "r3"]  # not for b

    spool.ack("a", seqs[0])
    spool.ack("b", seqs[1])
    assert spool.depth() == 1  # r1 and r2 are handled by both (r2 as a dead letter for a)

    spool = reopen(spool)
    try:
        [letter] = spool.dead_letters()
        assert letter["sink"] == "a"
        assert letter["seq"] == seqs[1]
        assert letter["record_id"] == "r2"
        assert json.loads(letter["body"])["N"] == 2
        assert letter["reason"] == "schema rejected: Zone is not a string"
        assert letter["at"].endswith("Z")
        assert spool.dead_letters("b") == []
        assert spool.backlog("a") == 1
    finally:
        spool.close()


def test_record_dead_lettered_by_the_last_sink_goes_at_once(open_spool: OpenSpool) -> None:
    spool = open_spool(["a", "b"])
    spool.commit([rec(1), rec(2)])
    seqs = [r.seq for r in spool.read_batch("a", 10)]
    spool.ack("a", seqs[1])
    spool.dead_letter("b", [seqs[0]], "rejected")
    assert ids(spool.read_batch("b", 10)) == ["r2"]
    assert spool.depth() == 1


def test_dead_letters_are_capped_oldest_first(
    open_spool: OpenSpool, caplog: pytest.LogCaptureFixture
) -> None:
    spool = open_spool(["a", "b"], max_dead_letters=2)
    spool.commit([rec(n) for n in range(3)])
    for record in spool.read_batch("a", 10):
        spool.dead_letter("a", [record.seq], f"bad {record.record_id}")
    assert [d["record_id"] for d in spool.dead_letters()] == ["r1", "r2"]
    assert "discarded the 1 oldest dead letters" in caplog.text


# --- bounds ---------------------------------------------------------------------------------


def test_full_spool_sheds_heartbeats_then_hooks_then_oldest_events(
    open_spool: OpenSpool, caplog: pytest.LogCaptureFixture
) -> None:
    spool = open_spool(["a"], max_records=6)
    spool.commit([rec(1), rec(2, "Heartbeat"), rec(3, "Hook"), rec(4), rec(5, "Heartbeat")])
    spool.commit([rec(6, "Hook")])
    assert spool.dropped() == 0

    with caplog.at_level(logging.WARNING, logger="bridge.outbox.spool"):
        spool.commit([rec(7), rec(8)])  # two over: both heartbeats, oldest first
    assert ids(spool.read_batch("a", 10)) == ["r1", "r3", "r4", "r6", "r7", "r8"]
    [warning] = caplog.records
    assert warning.levelno == logging.WARNING
    assert "dropped 2 Heartbeat records not yet delivered to sink a" in warning.getMessage()

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bridge.outbox.spool"):
        spool.commit([rec(9), rec(10), rec(11)])  # three over: both hooks, then r1
    assert ids(spool.read_batch("a", 10)) == ["r4", "r7", "r8", "r9", "r10", "r11"]
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.ERROR]
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("spool full (6 records, ")
    assert messages[0].endswith(
        "): dropped 2 Hook records not yet delivered to sink a; "
        "raise spool.max_records or fix the sink"
    )
    assert "dropped 1 Event records not yet delivered to sink a" in messages[1]
    assert spool.dropped() == 5

    spool = reopen(spool)
    try:
        assert spool.dropped() == 5  # persisted
    finally:
        spool.close()


def test_heartbeat_never_displaces_an_event(
    open_spool: OpenSpool, caplog: pytest.LogCaptureFixture
) -> None:
    spool = open_spool(["a"], max_records=3)
    spool.commit([rec(1), rec(2, "Hook"), rec(3)])

    with caplog.at_level(logging.WARNING, logger="bridge.outbox.spool"):
        spool.commit([rec(4, "Heartbeat")])

    assert ids(spool.read_batch("a", 10)) == ["r1", "r2", "r3"]
    assert spool.dropped() == 1
    [warning] = caplog.records
    assert warning.levelno == logging.WARNING
    assert "dropped 1 Heartbeat records" in warning.getMessage()


def test_event_committed_with_a_heartbeat_sheds_the_heartbeat_first(
    open_spool: OpenSpool,
) -> None:
    spool = open_spool(["a"], max_records=3)
    spool.commit([rec(1), rec(2), rec(3, "Heartbeat")])
    spool.commit([rec(4), rec(5, "Heartbeat")])
    assert ids(spool.read_batch("a", 10)) == ["r1", "r2", "r4"]
    assert spool.dropped() == 2


def test_byte_bound_sheds_too(open_spool: OpenSpool, caplog: pytest.LogCaptureFixture) -> None:
    filler = "x" * 200
    size = len(json.dumps(rec(0, Pad=filler), separators=(",", ":")))
    spool = open_spool(["a", "b"], max_bytes=4 * size + size // 2)
    spool.commit([rec(n, Pad=filler) for n in range(4)])
    spool.ack("a", spool.read_batch("a", 10)[-1].seq)

    spool.commit([rec(4, Pad=filler)])

    assert ids(spool.read_batch("b", 10)) == ["r1", "r2", "r3", "r4"]
    assert spool.dropped() == 1
    assert "not yet delivered to sink b; raise spool.max_bytes" in caplog.text


def test_commit_larger_than_the_bound_is_kept_whole(
    open_spool: OpenSpool, caplog: pytest.LogCaptureFixture
) -> None:
    spool = open_spool(["a"], max_records=2)
    spool.commit([rec(0, "Heartbeat")])
    spool.commit([rec(1), rec(2), rec(3)])
    assert ids(spool.read_batch("a", 10)) == ["r1", "r2", "r3"]
    assert spool.dropped() == 1
    assert "larger than the whole bound" in caplog.text


def test_finish_job_appends_within_the_bound(open_spool: OpenSpool) -> None:
    spool = open_spool(["a"], max_records=2)
    spool.commit([rec(1, "Heartbeat"), rec(2)], jobs=[("j", {})])
    spool.finish_job("j", [rec(3, "Hook")])
    assert ids(spool.read_batch("a", 10)) == ["r2", "r3"]


# --- waiting and concurrency --------------------------------------------------------------


def test_wait_for_records(open_spool: OpenSpool) -> None:
    spool = open_spool(["a"])
    assert spool.wait_for_records("a", 0.01) is False

    def commit_later() -> None:
        spool.commit([rec(1)])

    timer = threading.Timer(0.05, commit_later)
    timer.start()
    assert spool.wait_for_records("a", 30) is True  # returns on the commit, not the timeout
    timer.join()
    assert spool.wait_for_records("a", 30) is True  # already something to read


def test_wake_with_cancel_interrupts_a_wait(open_spool: OpenSpool) -> None:
    spool = open_spool(["a"])
    cancel = threading.Event()
    result: list[bool] = []
    waiter = threading.Thread(
        target=lambda: result.append(spool.wait_for_records("a", 30, cancel=cancel))
    )
    waiter.start()
    cancel.set()
    spool.wake()
    waiter.join(10)
    assert not waiter.is_alive()
    assert result == [False]


def test_concurrent_commits_finishes_and_acks(open_spool: OpenSpool) -> None:
    spool = open_spool(["a", "b"])
    spool.commit([], jobs=[(f"j{n}", {}) for n in range(50)])
    errors: list[BaseException] = []
    seen: dict[str, list[tuple[int, str]]] = {"a": [], "b": []}

    def guard(work: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                work()
            except BaseException as err:
                errors.append(err)

        return run

    def poll() -> None:
        for n in range(100):
            spool.commit([rec(n)], state={"normaliser": {"n": n}})

    def hooks() -> None:
        for n in range(50):
            spool.finish_job(f"j{n}", [rec(1000 + n, "Hook")])

    def deliver(sink: str) -> None:
        while len(seen[sink]) < 150:
            batch = spool.read_batch(sink, 7)
            if not batch:
                spool.wait_for_records(sink, 5)
                continue
            seen[sink] += [(r.seq, r.record_id) for r in batch]
            spool.ack(sink, batch[-1].seq)

    threads = [
        threading.Thread(target=guard(work))
        for work in (poll, hooks, lambda: deliver("a"), lambda: deliver("b"))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    for sink in ("a", "b"):
        seqs = [seq for seq, _ in seen[sink]]
        assert seqs == sorted(seqs)
        assert sorted(rid for _, rid in seen[sink]) == sorted(
            [f"r{n}" for n in range(100)] + [f"r{1000 + n}" for n in range(50)]
        )
    assert spool.depth() == 0
    assert spool.pending_jobs() == []
