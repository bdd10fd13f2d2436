"""The durable local spool: every record lands here before any sink sees it.

One SQLite database in WAL mode holds the records, each sink's progress, dead letters,
the normaliser's state and pending hook jobs. A record stays until every configured sink
has acknowledged or dead-lettered it. The records, state and jobs of one `commit` land in
one transaction, so a kill -9 or a power cut never separates state from the records it
produced.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, TypeVar

from bridge import sqlitewal
from bridge.outbox import spoolsql as sql
from bridge.records import RecordView, iso, utc_now
from bridge.sinks.base import SpooledRecord

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 30_000
MAX_SEQ = 2**63 - 1
# The WAL is checkpointed by the acks' connection at CHECKPOINT_PAGES, never by a record
# commit unless acks have stopped for BACKSTOP_PAGES (every sink down). It is kept at
# RESERVE_PAGES on disk, written once at start: a commit then overwrites WAL pages in place,
# and its fdatasync flushes only data, with no file growth for the filesystem's journal to
# commit first (about half the time of an appending commit on ext4; the probes' figures are in
# docs/capacity.md#figures-behind-the-codes-choices). The first write after a complete
# checkpoint restarts the WAL, syncing its new header before its own frames: the acks'
# connection makes that write itself (RESTART_KEY), so the second sync is not a record
# commit's.
PAGE_SIZE = 4096
CHECKPOINT_PAGES = 256
BACKSTOP_PAGES = 2560
RESERVE_PAGES = 320
_T = TypeVar("_T")


class StateKey:
    """The one registry of the names the spool keeps state under, each with its owner and its
    shape; a key lives here, never as a constant in the module that uses it."""

    NORMALISER: Final = "normaliser"  # bridge.agent.normalise.NormaliserState
    IDENTITY: Final = "identity"  # bridge.records.VmIdentity.to_state()
    APPROVALS: Final = "approvals"  # bridge.agent.approver: {"events": {EventId: CommandId}}
    SEEN_COMMANDS: Final = "commands"  # bridge.agent.approver: {"seen": {CommandId: {...}}}
    HEALTH: Final = "health"  # bridge.agent.loop, at each heartbeat: {"at": ..., "reason": ...}
    DELIVERY: Final = "delivery"  # bridge.outbox.delivery: {"sinks": {name: SinkTrouble}}
    DRAIN: Final = "drain"  # bridge.agent.drains: the node's drain now, for `se-bridge status`
    DRAIN_HOLDS: Final = "drain-holds"  # bridge.agent.drains: {"events": [EventId, ...]}
    ADVISORIES: Final = "advisories"  # bridge.agent.advisory.AdviceState
    WAL_RESERVE: Final = "wal-reserve"  # this module: the blob that keeps the WAL's size
    WAL_RESTART: Final = "wal-restart"  # this module: the acks' write that restarts the WAL


RESERVE_KEY = StateKey.WAL_RESERVE
RESTART_KEY = StateKey.WAL_RESTART


def wal_bytes(pages: int) -> int:
    """The size of a WAL file holding this many frames (a 32-byte header, 24 per frame)."""
    return 32 + pages * (24 + PAGE_SIZE)


class SpoolError(Exception):
    """The spool database cannot be opened or used; the message names the file."""


# What a failed spool operation may raise: a caller that must go on (the poll loop, the
# approver) catches these, reports them, and keeps what it holds.
SPOOL_ERRORS = (sqlite3.Error, SpoolError, OSError)


class Spool:
    """Durable, bounded, thread-safe store between the poll loop, hooks and the sinks."""

    def __init__(
        self,
        path: Path,
        sinks: Sequence[str],
        *,
        max_records: int = 100_000,
        max_bytes: int = 64 * 1024 * 1024,
        max_dead_letters: int = 10_000,
    ) -> None:
        if len(set(sinks)) != len(sinks):
            raise ValueError(f"sink names must be unique: {list(sinks)}")
        self.path = Path(path)
        self.sinks = tuple(sinks)
        self.max_records, self.max_bytes = max_records, max_bytes
        self.max_dead_letters = max_dead_letters
        # One lock serialises both connections: no "database is locked" inside the process,
        # and sinks do their slow I/O outside it.
        self._lock = threading.RLock()
        self._changed = threading.Condition()
        self._generation = 0
        self._closed = False
        self._durable = self._connect("FULL", checkpoint_at=BACKSTOP_PAGES)
        try:
            self._prepare()
            # A lost ack only causes a duplicate delivery, so acks skip the fsync.
            self._light = self._connect("NORMAL", checkpoint_at=CHECKPOINT_PAGES)
        except BaseException:
            self._durable.close()
            raise
        try:
            self._restart_wal_if_checkpointed()  # the reserve was checkpointed at open
        except sqlite3.Error as err:
            self._durable.close()
            self._light.close()
            raise SpoolError(f"cannot write to the spool database {self.path}: {err}") from err

    # --- opening -------------------------------------------------------------------------

    def _connect(self, synchronous: str, *, checkpoint_at: int = 0) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise SpoolError(
                f"cannot create the spool directory {self.path.parent}: {err}"
            ) from err
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlitewal.connect(
                self.path, synchronous=synchronous, busy_timeout_ms=BUSY_TIMEOUT_MS
            )
            conn.execute(f"PRAGMA wal_autocheckpoint = {checkpoint_at}")
            # After a backstop checkpoint the WAL shrinks back to the reserve, not to nothing.
            conn.execute(f"PRAGMA journal_size_limit = {wal_bytes(RESERVE_PAGES)}")
        except sqlite3.Error as err:
            if conn is not None:
                conn.close()
            raise SpoolError(self._unusable(err)) from err
        return conn

    def _unusable(self, err: object) -> str:
        return (
            f"spool database {self.path} is unreadable or corrupt ({err}); move it aside to "
            "start with an empty spool (records not yet delivered from it are then lost)"
        )

    def _prepare(self) -> None:
        conn = self._durable
        try:
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise SpoolError(self._unusable(check))
            with self._transaction(conn):
                self._create_schema(conn)
                self._sync_sinks(conn)
                self._prune(conn, MAX_SEQ)
                # A reserve row a crash left behind (between _reserve_wal's two commits).
                conn.execute("DELETE FROM state WHERE key = ?", (RESERVE_KEY,))
            self._reserve_wal()
        except sqlite3.Error as err:
            raise SpoolError(self._unusable(err)) from err

    def _reserve_wal(self) -> None:
        """Grow the WAL to RESERVE_PAGES with a throw-away row, then checkpoint it all, so the
        next commit restarts the WAL at its start and writes in place from then on."""
        wal = sqlitewal.wal_path(self.path)
        if wal.exists() and wal.stat().st_size >= wal_bytes(RESERVE_PAGES):
            return
        # Its own connection, closed at once: the page cache the row passes through goes too.
        scratch = self._connect("FULL")
        try:
            scratch.execute("PRAGMA secure_delete = OFF")  # zeroes: no need to zero them again
            blob = RESERVE_PAGES * PAGE_SIZE
            with self._transaction(scratch):
                scratch.execute(
                    "INSERT INTO state (key, value) VALUES (?, zeroblob(?))", (RESERVE_KEY, blob)
                )
            with self._transaction(scratch):
                scratch.execute("DELETE FROM state WHERE key = ?", (RESERVE_KEY,))
        finally:
            scratch.close()
        self._durable.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]
        if version == sql.SCHEMA_VERSION:
            return
        if version != 0 or tables:
            raise SpoolError(
                f"{self.path} is not an se-bridge spool of schema version {sql.SCHEMA_VERSION} "
                f"(user_version {version}); point the state directory elsewhere"
            )
        for statement in sql.SCHEMA:
            conn.execute(statement)

    def _sync_sinks(self, conn: sqlite3.Connection) -> None:
        known = {row[0] for row in conn.execute("SELECT sink FROM progress")}
        for gone in sorted(known - set(self.sinks)):
            log.info(
                "spool %s: sink %s is no longer configured; records are no longer held for it",
                self.path,
                gone,
            )
            conn.execute("DELETE FROM progress WHERE sink = ?", (gone,))
        # A new sink starts at the oldest record still held (or the next one to come).
        oldest = conn.execute("SELECT MIN(seq) FROM records").fetchone()[0]
        start = self._last_seq(conn) if oldest is None else oldest - 1
        for sink in self.sinks:
            conn.execute(
                "INSERT OR IGNORE INTO progress (sink, acked) VALUES (?, ?)", (sink, start)
            )

    # --- plumbing ------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, conn: sqlite3.Connection) -> Iterator[None]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            # SQLite already rolled back after some errors (disk full, I/O); do not mask them.
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _write(self, work: Callable[[sqlite3.Connection], _T], *, durable: bool = True) -> _T:
        with self._lock:
            conn = self._open_connection(self._durable if durable else self._light)
            with self._transaction(conn):
                result = work(conn)
            if not durable:
                self._restart_wal_if_checkpointed()
            return result

    def _restart_wal_if_checkpointed(self) -> None:
        """If the WAL is all checkpointed, restart it now with a write that changes nothing."""
        if not sqlitewal.fully_checkpointed(self.path):
            return
        with self._transaction(self._light):
            self._light.execute("INSERT INTO state (key, value) VALUES (?, '')", (RESTART_KEY,))
            self._light.execute("DELETE FROM state WHERE key = ?", (RESTART_KEY,))

    def _read(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        with self._lock:
            return work(self._open_connection(self._light))

    def _open_connection(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        if self._closed:
            raise SpoolError(f"spool {self.path} is closed")
        return conn

    def _notify(self) -> None:
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def _acked(self, conn: sqlite3.Connection, sink: str) -> int:
        row = conn.execute("SELECT acked FROM progress WHERE sink = ?", (sink,)).fetchone()
        if row is None:
            raise ValueError(f"sink {sink!r} is not configured in spool {self.path}")
        return int(row[0])

    @staticmethod
    def _last_seq(conn: sqlite3.Connection) -> int:
        row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'records'").fetchone()
        return 0 if row is None else int(row[0])

    # --- writing -------------------------------------------------------------------------

    def commit(
        self,
        records: Sequence[RecordView],
        *,
        state: Mapping[str, Mapping[str, Any]] | None = None,
        jobs: Sequence[tuple[str, Mapping[str, Any]]] = (),
    ) -> None:
        """Append records, upsert state entries and add jobs in ONE durable transaction."""
        encoded = [sql.Encoded.of(r) for r in records]
        states = [(key, sql.encode(dict(value))) for key, value in (state or {}).items()]
        job_rows = [(job_id, sql.encode(dict(payload))) for job_id, payload in jobs]

        def work(conn: sqlite3.Connection) -> sql.Room:
            room = self._append(conn, encoded)
            conn.executemany(
                "INSERT INTO state (key, value) VALUES (?, ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                states,
            )
            conn.executemany("INSERT OR IGNORE INTO jobs (job_id, payload) VALUES (?, ?)", job_rows)
            return room

        self._appended(self._write(work), encoded)

    def finish_job(
        self,
        job_id: str,
        records: Sequence[RecordView],
        *,
        then: Sequence[tuple[str, Mapping[str, Any]]] = (),
    ) -> None:
        """Remove a finished job and append the records it produced, in one transaction;
        `then`: jobs saved (or saved again, replacing theirs) in it, the ones it lets run."""
        encoded = [sql.Encoded.of(r) for r in records]
        job_rows = [(next_id, sql.encode(dict(payload))) for next_id, payload in then]

        def work(conn: sqlite3.Connection) -> sql.Room:
            conn.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
            conn.executemany(
                "INSERT OR REPLACE INTO jobs (job_id, payload) VALUES (?, ?)", job_rows
            )
            return self._append(conn, encoded)

        self._appended(self._write(work), encoded)

    def _append(self, conn: sqlite3.Connection, encoded: Sequence[sql.Encoded]) -> sql.Room:
        room = self._make_room(conn, encoded)
        conn.executemany(
            "INSERT INTO records (record_id, record_type, body, size) VALUES (?, ?, ?, ?)",
            [
                (e.record_id, e.record_type, e.body, e.size)
                for e in encoded
                if e not in room.refused
            ],
        )
        return room

    def _appended(self, room: sql.Room, encoded: Sequence[sql.Encoded]) -> None:
        # Reported only after COMMIT, so a rolled-back commit never claims a drop.
        room.report(self.path, self.max_records, self.max_bytes)
        if encoded:
            self._notify()

    def _make_room(self, conn: sqlite3.Connection, incoming: Sequence[sql.Encoded]) -> sql.Room:
        held = conn.execute(sql.COUNT_HELD).fetchone()
        room = sql.Room(
            (int(held[0]), int(held[1])), (len(incoming), sum(e.size for e in incoming))
        )
        over_n = held[0] + room.incoming[0] - self.max_records
        over_b = held[1] + room.incoming[1] - self.max_bytes
        if over_n > 0 or over_b > 0:
            room.limit = "spool.max_records" if over_n > 0 else "spool.max_bytes"
            over_n, over_b = self._refuse_heartbeats(conn, incoming, room, (over_n, over_b))
            self._shed(conn, sql.pick_victims(conn, over_n, over_b), room)
        return room

    def _refuse_heartbeats(
        self,
        conn: sqlite3.Connection,
        incoming: Sequence[sql.Encoded],
        room: sql.Room,
        over: tuple[int, int],
    ) -> tuple[int, int]:
        """Drop incoming heartbeats rather than shed a held Hook or Event to make room for them."""
        held = conn.execute(sql.COUNT_HELD_HEARTBEATS).fetchone()
        over_n, over_b = over[0] - int(held[0]), over[1] - int(held[1])
        for e in incoming:
            if (over_n <= 0 and over_b <= 0) or e.record_type != "Heartbeat":
                continue
            room.refused.append(e)
            over_n, over_b = over_n - 1, over_b - e.size
        if room.refused:
            conn.execute(sql.COUNT_DROPPED, (len(room.refused),))
            room.shed["Heartbeat"] = (len(room.refused), ["(incoming)"])
        return over_n + int(held[0]), over_b + int(held[1])

    def _shed(
        self, conn: sqlite3.Connection, victims: list[tuple[int, str]], room: sql.Room
    ) -> None:
        conn.executemany("DELETE FROM records WHERE seq = ?", [(seq,) for seq, _ in victims])
        if victims:
            conn.execute(sql.COUNT_DROPPED, (len(victims),))
        for record_type in dict.fromkeys(t for _, t in victims):
            seqs = [seq for seq, t in victims if t == record_type]
            lagging = conn.execute(
                "SELECT sink FROM progress WHERE acked < ? ORDER BY sink", (max(seqs),)
            )
            count, _ = room.shed.get(record_type, (0, []))
            room.shed[record_type] = (count + len(seqs), [row[0] for row in lagging])

    # --- delivery side -------------------------------------------------------------------

    def read_batch(self, sink: str, limit: int) -> list[SpooledRecord]:
        """The next records after this sink's progress, oldest first, skipping its dead letters."""

        def work(conn: sqlite3.Connection) -> list[SpooledRecord]:
            rows = conn.execute(sql.READ, (self._acked(conn, sink), MAX_SEQ, sink, limit))
            return [SpooledRecord(*row) for row in rows]

        return self._read(work)

    def oldest_waiting(self, sink: str) -> str | None:
        """The body of the oldest record this sink has yet to take; None when it has none."""
        batch = self.read_batch(sink, 1)
        return batch[0].body if batch else None

    def ack(self, sink: str, upto_seq: int) -> None:
        """This sink has every record up to and including `upto_seq`."""

        def work(conn: sqlite3.Connection) -> None:
            self._acked(conn, sink)
            conn.execute(
                "UPDATE progress SET acked = MAX(acked, ?) WHERE sink = ?", (upto_seq, sink)
            )
            self._prune(conn, upto_seq)

        self._write(work, durable=False)

    def dead_letter(self, sink: str, seqs: Sequence[int], reason: str) -> None:
        """Set records aside for this sink with the reason; they count as handled for it."""
        at = iso(utc_now())

        def work(conn: sqlite3.Connection) -> int:
            self._acked(conn, sink)
            conn.executemany(sql.DEAD_LETTER, [(sink, reason, at, seq) for seq in seqs])
            conn.executemany(sql.DELETE_HANDLED_SEQ, [(seq,) for seq in seqs])
            return self._cap_dead_letters(conn)

        discarded = self._write(work)
        if discarded:
            log.error(
                "spool %s: discarded the %d oldest dead letters to keep at most %d; "
                "inspect dead letters sooner or raise spool.max_dead_letters",
                *(self.path, discarded, self.max_dead_letters),
            )

    def _cap_dead_letters(self, conn: sqlite3.Connection) -> int:
        held = conn.execute("SELECT COUNT(*) FROM dead_letters").fetchone()[0]
        excess = int(held) - self.max_dead_letters
        if excess > 0:
            conn.execute(
                "DELETE FROM dead_letters WHERE rowid IN"
                " (SELECT rowid FROM dead_letters ORDER BY rowid LIMIT ?)",
                (excess,),
            )
        return max(excess, 0)

    def _prune(self, conn: sqlite3.Connection, upto: int) -> None:
        low = conn.execute("SELECT MIN(acked) FROM progress").fetchone()[0]
        if low is None:
            return  # no sink configured: keep the records for one configured later
        conn.execute("DELETE FROM records WHERE seq <= ?", (low,))
        conn.execute(sql.DELETE_HANDLED_DEAD, (low, upto))

    def wait_for_records(
        self, sink: str, timeout: float, *, cancel: threading.Event | None = None
    ) -> bool:
        """Block until this sink has something to read, or `timeout`, `close`, `wake` (with
        `cancel` set: `wake` after setting it interrupts the wait without a race)."""
        with self._changed:
            seen = self._generation
        if self._closed or (cancel is not None and cancel.is_set()):
            return False
        if self.backlog(sink, limit=1):
            return True
        with self._changed:
            self._changed.wait_for(
                lambda: self._generation != seen or (cancel is not None and cancel.is_set()),
                timeout,
            )
        return not self._closed and self.backlog(sink, limit=1) > 0

    @property
    def generation(self) -> int:
        """Moves at every append and `wake`: take it before reading, then `wait_for_change`."""
        with self._changed:
            return self._generation

    def wait_for_change(
        self, since: int, timeout: float, *, cancel: threading.Event | None = None
    ) -> None:
        """Block until the generation moved past `since` (a record appended, `wake`), `close`,
        `cancel` is set, or `timeout`. Taking `since` before reading loses no wake-up."""
        with self._changed:
            if self._closed or (cancel is not None and cancel.is_set()):
                return
            self._changed.wait_for(
                lambda: self._generation != since or (cancel is not None and cancel.is_set()),
                timeout,
            )

    def wake(self) -> None:
        """Make every pending `wait_for_records` and `wait_for_change` return now (delivery
        uses it to stop, and to send what waits when flushing)."""
        self._notify()

    # --- reading -------------------------------------------------------------------------

    def load_state(self, key: str) -> dict[str, Any] | None:
        rows = self._read(
            lambda c: c.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchall()
        )
        return dict(json.loads(rows[0][0])) if rows else None

    def pending_jobs(self) -> list[tuple[str, dict[str, Any]]]:
        """Jobs not yet finished, oldest first."""
        rows = self._read(
            lambda c: c.execute("SELECT job_id, payload FROM jobs ORDER BY n").fetchall()
        )
        return [(job_id, dict(json.loads(payload))) for job_id, payload in rows]

    def dead_letters(self, sink: str | None = None) -> list[dict[str, Any]]:
        rows = self._read(lambda c: c.execute(sql.LIST_DEAD_LETTERS, (sink, sink)).fetchall())
        return [dict(zip(sql.DEAD_LETTER_COLUMNS, row, strict=True)) for row in rows]

    def depth(self) -> int:
        """Records not yet handled by every configured sink (handled ones are pruned at once)."""
        return self._count("SELECT COUNT(*) FROM records")

    def dropped(self) -> int:
        """Records shed because the spool was full, since it was created."""
        return self._count("SELECT COALESCE(SUM(value), 0) FROM counters WHERE name = 'dropped'")

    def _count(self, sql: str) -> int:
        return int(self._read(lambda c: c.execute(sql).fetchone()[0]))

    def acked(self, sink: str) -> int:
        """The seq up to which this sink has acknowledged."""
        return self._read(lambda c: self._acked(c, sink))

    def backlog(self, sink: str, *, upto: int = MAX_SEQ, limit: int = -1) -> int:
        """How many records (with seq <= `upto`, counting at most `limit`) this sink has to read."""
        return self._read(
            lambda c: int(
                c.execute(sql.COUNT_UNREAD, (self._acked(c, sink), upto, sink, limit)).fetchone()[0]
            )
        )

    def last_seq(self) -> int:
        """The seq of the newest record ever committed; 0 before the first."""
        return self._read(self._last_seq)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._light.close()
            self._durable.close()
        self._notify()
