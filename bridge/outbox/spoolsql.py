"""The spool's SQL, its record encoding and the pure helpers of its bound (what to shed).

Kept apart from bridge.outbox.spool so the Spool class reads as its API and transactions.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Generator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from bridge.records import RecordView
from bridge.recordtypes import RECORD_TYPE

log = logging.getLogger("bridge.outbox.spool")

SCHEMA_VERSION = 1
COUNT_HELD = "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM records"
COUNT_HELD_HEARTBEATS = COUNT_HELD + " WHERE record_type = 'Heartbeat'"

SCHEMA = (
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
SHED_CANDIDATES = (
    "SELECT seq, record_type, size FROM records WHERE record_type = 'Heartbeat' ORDER BY seq",
    "SELECT seq, record_type, size FROM records WHERE record_type = 'Hook' ORDER BY seq",
    "SELECT seq, record_type, size FROM records"
    " WHERE record_type NOT IN ('Heartbeat', 'Hook') ORDER BY seq",
)

# Records this sink still has to read: after its progress, not dead-lettered for it.
# Parameters: acked, upto, sink, limit.
READ = (
    "SELECT r.seq, r.record_id, r.record_type, r.body FROM records r"
    " WHERE r.seq > ? AND r.seq <= ? AND NOT EXISTS"
    " (SELECT 1 FROM dead_letters d WHERE d.sink = ? AND d.seq = r.seq) ORDER BY r.seq LIMIT ?"
)
COUNT_UNREAD = (
    "SELECT COUNT(*) FROM (SELECT 1 FROM records r"
    " WHERE r.seq > ? AND r.seq <= ? AND NOT EXISTS"
    " (SELECT 1 FROM dead_letters d WHERE d.sink = ? AND d.seq = r.seq) LIMIT ?)"
)

# A record is handled for a sink once acknowledged or dead-lettered for it; it goes once
# every configured sink (exactly the rows of `progress`) has handled it.
DELETE_HANDLED_SEQ = (
    "DELETE FROM records WHERE seq = ? AND NOT EXISTS (SELECT 1 FROM progress p"
    " WHERE p.acked < records.seq AND NOT EXISTS (SELECT 1 FROM dead_letters d"
    " WHERE d.sink = p.sink AND d.seq = records.seq))"
)
DELETE_HANDLED_DEAD = (
    "DELETE FROM records WHERE seq > ? AND seq <= ? AND seq IN (SELECT seq FROM dead_letters)"
    " AND NOT EXISTS (SELECT 1 FROM progress p WHERE p.acked < records.seq AND NOT EXISTS"
    " (SELECT 1 FROM dead_letters d WHERE d.sink = p.sink AND d.seq = records.seq))"
)
DEAD_LETTER = (
    "INSERT OR REPLACE INTO dead_letters (sink, seq, record_id, record_type, body, reason, at)"
    " SELECT ?, seq, record_id, record_type, body, ?, ? FROM records WHERE seq = ?"
)
DEAD_LETTER_COLUMNS = ("sink", "seq", "record_id", "record_type", "body", "reason", "at")
LIST_DEAD_LETTERS = (
    "SELECT sink, seq, record_id, record_type, body, reason, at FROM dead_letters"
    " WHERE ? IS NULL OR sink = ? ORDER BY rowid"
)


def encode(value: object) -> str:
    """Compact JSON text; TypeError for anything JSON cannot represent faithfully."""
    try:
        # ASCII-only text survives any console code page and any byte-oriented sink.
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except ValueError as err:  # NaN/Infinity or a circular reference
        raise TypeError(f"not JSON-serialisable: {err}") from err


@dataclass(frozen=True)
class Encoded:
    record_id: str
    record_type: str
    body: str

    @property
    def size(self) -> int:
        return len(self.body)  # ASCII-only, so characters are bytes

    @classmethod
    def of(cls, record: RecordView) -> Encoded:
        record_id, record_type = record.get("RecordId"), record.get(RECORD_TYPE)
        if not isinstance(record_id, str) or not isinstance(record_type, str):
            raise TypeError(f"record needs a string RecordId and RecordType: {record!r:.200}")
        return cls(record_id, record_type, encode(dict(record)))


@dataclass
class Room:
    """What making room for a commit did, logged once the commit is durable."""

    held: tuple[int, int]  # records, bytes in the spool before this commit
    incoming: tuple[int, int]
    limit: str = ""
    shed: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    refused: list[Encoded] = field(default_factory=list)  # incoming heartbeats not kept

    def report(self, path: Path, max_records: int, max_bytes: int) -> None:
        for record_type, (count, sinks) in self.shed.items():
            log.log(
                logging.WARNING if record_type == "Heartbeat" else logging.ERROR,
                "spool full (%d records, %d bytes): dropped %d %s records not yet delivered "
                "to sink %s; raise %s or fix the sink",
                *(*self.held, count, record_type, ", ".join(sinks) or "(none)", self.limit),
            )
        if self.incoming[0] > max_records or self.incoming[1] > max_bytes:
            log.warning(
                "spool %s: one commit of %d records (%d bytes) is larger than the whole bound "
                "(%d records, %d bytes); kept it whole",
                *(path, *self.incoming, max_records, max_bytes),
            )


COUNT_DROPPED = (
    "INSERT INTO counters (name, value) VALUES ('dropped', ?)"
    " ON CONFLICT (name) DO UPDATE SET value = value + excluded.value"
)


def pick_victims(conn: sqlite3.Connection, over_n: int, over_b: int) -> list[tuple[int, str]]:
    """Records to shed, cheapest kind first, until `over_n` records and `over_b` bytes are freed."""
    victims: list[tuple[int, str]] = []
    with closing(shed_candidates(conn)) as candidates:
        for seq, record_type, size in candidates:
            if over_n <= 0 and over_b <= 0:
                break
            victims.append((seq, record_type))
            over_n, over_b = over_n - 1, over_b - size
    return victims


def shed_candidates(conn: sqlite3.Connection) -> Generator[tuple[int, str, int], None, None]:
    for sql in SHED_CANDIDATES:
        with closing(conn.execute(sql)) as cursor:
            while rows := cursor.fetchmany(256):
                yield from rows
