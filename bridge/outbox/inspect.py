"""A look into a spool from another process, read only (`se-bridge status`).

The agent keeps its spool open; this opens the same SQLite file with `mode=ro`, so it can
neither write nor take a write lock, and reads what the spool's own queries read.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.outbox import spoolsql as sql
from bridge.outbox.spool import MAX_SEQ, SpoolError, StateKey


@dataclass(frozen=True)
class SinkStatus:
    name: str
    waiting: int  # records this sink has yet to take
    oldest: str | None  # TimeGenerated of the oldest of them
    dead_letters: int


@dataclass(frozen=True)
class SpoolStatus:
    path: Path
    records: int
    bytes: int
    shed: int  # records dropped at the spool's bound since it was created
    sinks: tuple[SinkStatus, ...]
    state: dict[str, dict[str, Any]]  # by StateKey
    jobs: tuple[tuple[str, dict[str, Any]], ...]  # hooks planned and not yet finished


def inspect(path: Path) -> SpoolStatus:
    """The spool at `path` as it is now; SpoolError when it is missing or unreadable."""
    if not path.is_file():
        raise SpoolError(f"there is no spool at {path}: is this the agent's state directory?")
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error as err:
        raise SpoolError(f"cannot open the spool {path} to read: {err}") from err
    try:
        with closing(conn):
            return _read(conn, path)
    except (sqlite3.Error, ValueError) as err:
        raise SpoolError(f"cannot read the spool {path}: {err}") from err


def _read(conn: sqlite3.Connection, path: Path) -> SpoolStatus:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version != sql.SCHEMA_VERSION:
        raise SpoolError(f"the spool {path} has schema {version}, not {sql.SCHEMA_VERSION}")
    records, size = conn.execute(sql.COUNT_HELD).fetchone()
    shed = conn.execute(
        "SELECT COALESCE(SUM(value), 0) FROM counters WHERE name = 'dropped'"
    ).fetchone()[0]
    dead = dict(conn.execute("SELECT sink, COUNT(*) FROM dead_letters GROUP BY sink").fetchall())
    sinks = []
    for name, acked in conn.execute("SELECT sink, acked FROM progress ORDER BY sink").fetchall():
        waiting = conn.execute(sql.COUNT_UNREAD, (acked, MAX_SEQ, name, -1)).fetchone()[0]
        first = conn.execute(sql.READ, (acked, MAX_SEQ, name, 1)).fetchone()
        oldest = json.loads(first[3]).get("TimeGenerated") if first else None
        sinks.append(SinkStatus(name, int(waiting), oldest, int(dead.get(name, 0))))
    internal = (StateKey.WAL_RESERVE, StateKey.WAL_RESTART)
    state = {
        key: json.loads(value)
        for key, value in conn.execute("SELECT key, value FROM state").fetchall()
        if key not in internal
    }
    jobs = tuple(
        (str(job_id), json.loads(payload))
        for job_id, payload in conn.execute("SELECT job_id, payload FROM jobs ORDER BY n")
    )
    return SpoolStatus(path, int(records), int(size), int(shed), tuple(sinks), state, jobs)
