"""Opening an SQLite file in WAL mode, safely when several processes open a new file at once.

The spool, the fleet state and the local hub all keep their data this way; the hub and the
fleet state are shared by processes that may start together.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

RETRY_SECONDS = 0.01


def connect(path: Path, *, synchronous: str, busy_timeout_ms: int) -> sqlite3.Connection:
    """An autocommit connection to `path` in WAL mode that the process's threads may share
    (under the caller's own lock). Raises sqlite3.Error; the connection is closed then."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        _enter_wal(conn, time.monotonic() + busy_timeout_ms / 1000)
        conn.execute(f"PRAGMA synchronous = {synchronous}")
    except BaseException:
        conn.close()
        raise
    return conn


def _enter_wal(conn: sqlite3.Connection, deadline: float) -> None:
    # Switching a new file to WAL needs an exclusive lock. When two connections both hold
    # the shared lock and both want it, SQLite refuses one at once ("database is locked")
    # rather than deadlock, without waiting out the busy timeout: so that step is retried.
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() >= deadline:
                raise
            time.sleep(RETRY_SECONDS)
        else:
            return
