"""Opening an SQLite file in WAL mode, safely when several processes open a new file at once.

The spool, the fleet state and the local hub all keep their data this way; the hub and the
fleet state are shared by processes that may start together.
"""

from __future__ import annotations

import sqlite3
import struct
import time
from pathlib import Path

RETRY_SECONDS = 0.01
# The WAL-index header at the start of the -shm file (https://www.sqlite.org/walformat.html,
# "the WAL-index header"), in the machine's byte order: mxFrame, the last frame of the WAL
# that holds data, at byte 16; nBackfill, how many of them a checkpoint has copied into the
# database, at byte 96.
_U32 = struct.Struct("=I")
_MX_FRAME, _N_BACKFILL = 16, 96


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


def wal_path(path: Path) -> Path:
    """The write-ahead log SQLite keeps beside the database `path`."""
    return path.with_name(path.name + "-wal")


def fully_checkpointed(path: Path) -> bool:
    """True if every frame of `path`'s WAL is in the database, so the next write transaction
    (of any connection) restarts the WAL at its start: it writes a new WAL header and syncs
    it before its own frames, one sync more than usual. False when unknown (no -shm file).

    Read without SQLite's locks: a torn read can only make the caller restart the WAL when
    it need not, or leave the restart to the next writer, as without this check.
    """
    try:
        with path.with_name(path.name + "-shm").open("rb") as shm:
            head = shm.read(_N_BACKFILL + _U32.size)
    except OSError:
        return False
    if len(head) < _N_BACKFILL + _U32.size:
        return False
    mx_frame: int = _U32.unpack_from(head, _MX_FRAME)[0]
    backfilled: int = _U32.unpack_from(head, _N_BACKFILL)[0]
    return 0 < mx_frame == backfilled
