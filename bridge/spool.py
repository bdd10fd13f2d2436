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
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from bridge.sinks import SpooledRecord

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 30_000
MAX_SEQ = 2**63 - 1
_T = TypeVar("_T")

_SCHEMA = (
    "CREATE TABLE records (seq INTEGER PRIMARY KEY AUTOINCREMENT, record_id TEXT NOT NULL,"
    " record_type TEXT NOT NULL, body TEXT NOT NULL, size INTEGER NOT NULL)",
    "CREATE INDEX records_by_type ON records (record_type, seq)",
    "CREATE TABLE progress (sink TEXT PRIMARY KEY, acked INTEGER NOT NULL)",
    "CREATE TABLE dead_letters (sink TEXT NOT NULL, seq INTEGER NOT NULL,"
    " record_id TEXT NOT NULL, record_type TEXT NOT NULL, body TEXT NOT NULL,"
    " reason TEXT NOT NULL, at TEXT NOT NULL, PRIMARY KEY (sink, seq))",
    "CREATE INDEX dead_letters_by_seq ON dead_letters (seq)",
    "CREATE TABLE state (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE jobs (n INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL UNIQUE,"
    " payload TEXT NOT NULL)",
    "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)

# Shed the cheapest records first: a lost heartbeat is replaced within minutes, a lost
# Event is not. Within a kind, oldest first.
_SHED_CANDIDATES = (
    "SELECT seq, record_type, size FROM records WHERE record_type = 'Heartbeat' ORDER BY seq",
    "SELECT seq, record_type, size FROM records WHERE record_type = 'Hook' ORDER BY seq",
    "SELECT seq, record_type, size FROM records"
    " WHERE record_type NOT IN ('Heartbeat', 'Hook') ORDER BY seq",
)

# Records this sink still has to read: after its progress, not dead-lettered for it.
# Parameters: acked, upto, sink, limit.
_READ = (
    "SELECT r.seq, r.record_id, r.record_type, r.body FROM records r"
    " WHERE r.seq > ? AND r.seq <= ? AND NOT EXISTS"
    " (SELECT 1 FROM dead_letters d WHERE d.sink = ? AND d.seq = r.seq) ORDER BY r.seq LIMIT ?"
)
_COUNT_UNREAD = (
    "SELECT COUNT(*) FROM (SELECT 1 FROM records r"
    " WHERE r.seq > ? AND r.seq <= ? AND NOT EXISTS"
    " (SELECT 1 FROM dead_letters d WHERE d.sink = ? AND d.seq = r.seq) LIMIT ?)"
)

# A record is handled for a sink once acknowledged or dead-lettered for it; it goes once
# every configured sink (exactly the rows of `progress`) has handled it.
_DELETE_HANDLED_SEQ = (
    "DELETE FROM records WHERE seq = ? AND NOT EXISTS (SELECT 1 FROM progress p"
    " WHERE p.acked < records.seq AND NOT EXISTS (SELECT 1 FROM dead_letters d"
    " WHERE d.sink = p.sink AND d.seq = records.seq))"
)
_DELETE_HANDLED_DEAD = (
    "DELETE FROM records WHERE seq > ? AND seq <= ? AND seq IN (SELECT seq FROM dead_letters)"
    " AND NOT EXISTS (SELECT 1 FROM progress p WHERE p.acked < records.seq AND NOT EXISTS"
    " (SELECT 1 FROM dead_letters d WHERE d.sink = p.sink AND d.seq = records.seq))"
)
_DEAD_LETTER = (
    "INSERT OR REPLACE INTO dead_letters (sink, seq, record_id, record_type, body, reason, at)"
    " SELECT ?, seq, record_id, record_type, body, ?, ? FROM records WHERE seq = ?"
)
_DEAD_LETTER_COLUMNS = ("sink", "seq", "record_id", "record_type", "body", "reason", "at")
_LIST_DEAD_LETTERS = (
    "SELECT sink, seq, record_id, record_type, body, reason, at FROM dead_letters"
    " WHERE ? IS NULL OR sink = ? ORDER BY rowid"
)


class SpoolError(Exception):
    """The spool database cannot be opened or used; the message names the file."""


def encode(value: object) -> str:
    """Compact JSON text; TypeError for anything JSON cannot represent faithfully."""
    try:
        # ASCII-only text survives any console code page and any byte-oriented sink.
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except ValueError as err:  # NaN/Infinity or a circular reference
        raise TypeError(f"not JSON-serialisable: {err}") from err


@dataclass(frozen=True)
class _Encoded:
    record_id: str
    record_type: str
    body: str

    @property
    def size(self) -> int:
        return len(self.body)  # ASCII-only, so characters are bytes

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> _Encoded:
        record_id, record_type = record.get("RecordId"), record.get("RecordType")
        if not isinstance(record_id, str) or not isinstance(record_type, str):
            raise TypeError(f"record needs a string RecordId and RecordType: {record!r:.200}")
        return cls(record_id, record_type, encode(dict(record)))


@dataclass
class _Room:
    """What making room for a commit did, logged once the commit is durable."""

    held: tuple[int, int]  # records, bytes in the spool before this commit
    incoming: tuple[int, int]
    limit: str = ""
    shed: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    refused: list[_Encoded] = field(default_factory=list)  # incoming heartbeats not kept

    def report(self, spool: Spool) -> None:
        for record_type, (count, sinks) in self.shed.items():
            log.log(
                logging.WARNING if record_type == "Heartbeat" else logging.ERROR,
                "spool full (%d records, %d bytes): dropped %d %s records not yet delivered "
                "to sink %s; raise %s or fix the sink",
                *(*self.held, count, record_type, ", ".join(sinks) or "(none)", self.limit),
            )
        if self.incoming[0] > spool.max_records or self.incoming[1] > spool.max_bytes:
            log.warning(
                "spool %s: one commit of %d records (%d bytes) is larger than the whole bound "
                "(%d records, %d bytes); kept it whole",
                *(spool.path, *self.incoming, spool.max_records, spool.max_bytes),
            )


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
        self._durable = self._connect("FULL")
        try:
            self._prepare()
            # A lost ack only causes a duplicate delivery, so acks skip the fsync.
            self._light = self._connect("NORMAL")
        except BaseException:
            self._durable.close()
            raise

    # --- opening -------------------------------------------------------------------------

    def _connect(self, synchronous: str) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise SpoolError(
                f"cannot create the spool directory {self.path.parent}: {err}"
            ) from err
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {synchronous}")
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
        except sqlite3.Error as err:
            raise SpoolError(self._unusable(err)) from err

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        if version != 0 or tables:
            raise SpoolError(
                f"{self.path} is not an se-bridge spool of schema version {SCHEMA_VERSION} "
                f"(user_version {version}); point the state directory elsewhere"
            )
        for statement in _SCHEMA:
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
                return work(conn)

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
        records: Sequence[Mapping[str, Any]],
        *,
        state: Mapping[str, Mapping[str, Any]] | None = None,
        jobs: Sequence[tuple[str, Mapping[str, Any]]] = (),
    ) -> None:
        """Append records, upsert state entries and add jobs in ONE durable transaction."""
        encoded = [_Encoded.of(r) for r in records]
        states = [(key, encode(dict(value))) for key, value in (state or {}).items()]
        job_rows = [(job_id, encode(dict(payload))) for job_id, payload in jobs]

        def work(conn: sqlite3.Connection) -> _Room:
            room = self._append(conn, encoded)
            conn.executemany(
                "INSERT INTO state (key, value) VALUES (?, ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                states,
            )
            conn.executemany("INSERT OR IGNORE INTO jobs (job_id, payload) VALUES (?, ?)", job_rows)
            return room

        self._appended(self._write(work), encoded)

    def finish_job(self, job_id: str, records: Sequence[Mapping[str, Any]]) -> None:
        """Remove a finished job and append the records it produced, in one transaction."""
        encoded = [_Encoded.of(r) for r in records]

        def work(conn: sqlite3.Connection) -> _Room:
            conn.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
            return self._append(conn, encoded)

        self._appended(self._write(work), encoded)

    def _append(self, conn: sqlite3.Connection, encoded: Sequence[_Encoded]) -> _Room:
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

    def _appended(self, room: _Room, encoded: Sequence[_Encoded]) -> None:
        # Reported only after COMMIT, so a rolled-back commit never claims a drop.
        room.report(self)
        if encoded:
            self._notify()

    def _make_room(self, conn: sqlite3.Connection, incoming: Sequence[_Encoded]) -> _Room:
        held = conn.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM records").fetchone()
        room = _Room((int(held[0]), int(held[1])), (len(incoming), sum(e.size for e in incoming)))
        over_n = held[0] + room.incoming[0] - self.max_records
        over_b = held[1] + room.incoming[1] - self.max_bytes
        if over_n > 0 or over_b > 0:
            room.limit = "spool.max_records" if over_n > 0 else "spool.max_bytes"
            over_n, over_b = self._refuse_heartbeats(conn, incoming, room, (over_n, over_b))
            self._shed(conn, _pick_victims(conn, over_n, over_b), room)
        return room

    def _refuse_heartbeats(
        self,
        conn: sqlite3.Connection,
        incoming: Sequence[_Encoded],
        room: _Room,
        over: tuple[int, int],
    ) -> tuple[int, int]:
        """Drop incoming heartbeats rather than shed a held Hook or Event to make room for them."""
        held = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM records WHERE record_type = 'Heartbeat'"
        ).fetchone()
        over_n, over_b = over[0] - int(held[0]), over[1] - int(held[1])
        for e in incoming:
            if (over_n <= 0 and over_b <= 0) or e.record_type != "Heartbeat":
                continue
            room.refused.append(e)
            over_n, over_b = over_n - 1, over_b - e.size
        if room.refused:
            conn.execute(_COUNT_DROPPED, (len(room.refused),))
            room.shed["Heartbeat"] = (len(room.refused), ["(incoming)"])
        return over_n + int(held[0]), over_b + int(held[1])

    def _shed(self, conn: sqlite3.Connection, victims: list[tuple[int, str]], room: _Room) -> None:
        conn.executemany("DELETE FROM records WHERE seq = ?", [(seq,) for seq, _ in victims])
        if victims:
            conn.execute(_COUNT_DROPPED, (len(victims),))
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
            rows = conn.execute(_READ, (self._acked(conn, sink), MAX_SEQ, sink, limit))
            return [SpooledRecord(*row) for row in rows]

        return self._read(work)

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
        at = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")

        def work(conn: sqlite3.Connection) -> int:
            self._acked(conn, sink)
            conn.executemany(_DEAD_LETTER, [(sink, reason, at, seq) for seq in seqs])
            conn.executemany(_DELETE_HANDLED_SEQ, [(seq,) for seq in seqs])
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
        conn.execute(_DELETE_HANDLED_DEAD, (low, upto))

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

    def wake(self) -> None:
        """Make every pending `wait_for_records` return now (delivery uses it to stop)."""
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
        rows = self._read(lambda c: c.execute(_LIST_DEAD_LETTERS, (sink, sink)).fetchall())
        return [dict(zip(_DEAD_LETTER_COLUMNS, row, strict=True)) for row in rows]

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
                c.execute(_COUNT_UNREAD, (self._acked(c, sink), upto, sink, limit)).fetchone()[0]
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


_COUNT_DROPPED = (
    "INSERT INTO counters (name, value) VALUES ('dropped', ?)"
    " ON CONFLICT (name) DO UPDATE SET value = value + excluded.value"
)


def _pick_victims(conn: sqlite3.Connection, over_n: int, over_b: int) -> list[tuple[int, str]]:
    """Records to shed, cheapest kind first, until `over_n` records and `over_b` bytes are freed."""
    victims: list[tuple[int, str]] = []
    with closing(_shed_candidates(conn)) as candidates:
        for seq, record_type, size in candidates:
            if over_n <= 0 and over_b <= 0:
                break
            victims.append((seq, record_type))
            over_n, over_b = over_n - 1, over_b - size
    return victims


def _shed_candidates(conn: sqlite3.Connection) -> Generator[tuple[int, str, int], None, None]:
    for sql in _SHED_CANDIDATES:
        with closing(conn.execute(sql)) as cursor:
            while rows := cursor.fetchmany(256):
                yield from rows
