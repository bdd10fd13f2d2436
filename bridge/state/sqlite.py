"""`sqlite:PATH`: the fleet state in one SQLite file, for a consumer on one machine.

Several processes may share the file (two local consumers), so every write is one
conditional statement: the database, not this process, decides who wins. An ETag is a
random token replaced on every write, so a document deleted and created again never
matches a version read before (a per-document counter would start over and could).

    docs(collection TEXT, key TEXT, etag TEXT, value TEXT)  PRIMARY KEY (collection, key)
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from bridge.retry import DeliveryError, PermanentError, RetryableError
from bridge.state import Conflict, Doc, decode_value, encode_value

T = TypeVar("T")

BUSY_TIMEOUT_MS = 10_000
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS docs (collection TEXT NOT NULL, key TEXT NOT NULL,"
    " etag TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (collection, key)) WITHOUT ROWID"
)
INSERT = "INSERT INTO docs (collection, key, etag, value) VALUES (?, ?, ?, ?)"
UPDATE = "UPDATE docs SET etag = ?, value = ? WHERE collection = ? AND key = ? AND etag = ?"
DELETE = "DELETE FROM docs WHERE collection = ? AND key = ? AND etag = ?"
READ = "SELECT etag, value FROM docs WHERE collection = ? AND key = ?"
SCAN = "SELECT key, etag, value FROM docs WHERE collection = ? ORDER BY key"


class SqliteStore:
    """One connection shared by the process's threads under a lock; WAL for other processes."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn = self._open()

    def _open(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit: each statement is its own transaction, which is all a write needs.
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute(SCHEMA)
        except (OSError, sqlite3.Error) as err:
            if conn is not None:
                conn.close()
            raise self._error(err) from err
        return conn

    def read(self, collection: str, key: str) -> Doc | None:
        row = self._run(lambda c: c.execute(READ, (collection, key)).fetchone())
        return None if row is None else Doc(key, decode_value(row[1]), row[0])

    def write(self, collection: str, doc: Doc) -> Doc:
        text = encode_value(collection, doc)
        etag = uuid.uuid4().hex
        if doc.etag is None:
            try:
                self._run(lambda c: c.execute(INSERT, (collection, doc.key, etag, text)))
            except Conflict:
                raise Conflict(f"{collection}/{doc.key} already exists") from None
        else:
            args = (etag, text, collection, doc.key, doc.etag)
            if self._run(lambda c: c.execute(UPDATE, args).rowcount) == 0:
                raise Conflict(f"{collection}/{doc.key} changed or vanished since it was read")
        return Doc(doc.key, decode_value(text), etag)

    def delete(self, collection: str, doc: Doc) -> None:
        if doc.etag is not None:
            args = (collection, doc.key, doc.etag)
            if self._run(lambda c: c.execute(DELETE, args).rowcount) == 1:
                return
        # Nothing matched: gone is what the caller wanted; anything else is a newer version.
        if self.read(collection, doc.key) is not None:
            raise Conflict(f"{collection}/{doc.key} changed since it was read")

    def scan(self, collection: str) -> list[Doc]:
        rows = self._run(lambda c: c.execute(SCAN, (collection,)).fetchall())
        return [Doc(key, decode_value(value), etag) for key, etag, value in rows]

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            try:
                return work(self._conn)
            except sqlite3.IntegrityError as err:  # only the primary key can be violated
                raise Conflict(str(err)) from err
            except sqlite3.Error as err:
                raise self._error(err) from err

    def _error(self, err: BaseException) -> DeliveryError:
        text = str(err)
        if "locked" in text or "busy" in text:
            # Another process held the file for the whole busy timeout: it will let go.
            return RetryableError(f"fleet state {self.path} is busy: {text}")
        return PermanentError(
            f"fleet state {self.path} is unusable ({text}); check its directory and permissions, "
            "or move a corrupt file aside"
        )
