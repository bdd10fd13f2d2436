"""`sqlite:PATH`: the fleet state in one SQLite file, for a consumer on one machine.

Several processes may share the file (two local consumers), so every write is a
conditional statement: the database, not this process, decides who wins. An ETag is a
random token replaced on every write, so a document deleted and created again never
matches a version read before (a per-document counter would start over and could).
`rev` numbers the write transactions of a collection (counted in `revs`), so a reader can
ask for what changed since it last looked (`scan_changes`).

    docs(collection TEXT, key TEXT, etag TEXT, value TEXT, rev INTEGER)
        PRIMARY KEY (collection, key), INDEX (collection, rev)
    revs(collection TEXT PRIMARY KEY, rev INTEGER)
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from bridge import sqlitewal
from bridge.consumer.state import (
    TRANSACTION_DOCS,
    Conflict,
    Doc,
    decode_value,
    encode_value,
    write_one,
)
from bridge.retry import DeliveryError, PermanentError, RetryableError

T = TypeVar("T")
Rows = list[Any]

BUSY_TIMEOUT_MS = 10_000
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS docs (collection TEXT NOT NULL, key TEXT NOT NULL,"
    " etag TEXT NOT NULL, value TEXT NOT NULL, rev INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY (collection, key)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS revs (collection TEXT PRIMARY KEY, rev INTEGER NOT NULL)",
)
# Files made before `rev` existed get the column; their documents count as written at 0.
ADD_REV = "ALTER TABLE docs ADD COLUMN rev INTEGER NOT NULL DEFAULT 0"
INDEX = "CREATE INDEX IF NOT EXISTS docs_rev ON docs (collection, rev)"
BUMP = (
    "INSERT INTO revs (collection, rev) VALUES (?, 1)"
    " ON CONFLICT (collection) DO UPDATE SET rev = rev + 1"
)
MARK = "SELECT rev FROM revs WHERE collection = ?"
INSERT = (
    "INSERT INTO docs (collection, key, etag, value, rev) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (collection, key) DO NOTHING"
)
UPDATE = (
    "UPDATE docs SET etag = ?, value = ?, rev = ? WHERE collection = ? AND key = ? AND etag = ?"
)
DELETE = "DELETE FROM docs WHERE collection = ? AND key = ? AND etag = ?"
READ = "SELECT etag, value FROM docs WHERE collection = ? AND key = ?"
ETAG = "SELECT etag FROM docs WHERE collection = ? AND key = ?"
SCAN = "SELECT key, etag, value FROM docs WHERE collection = ? ORDER BY key"
# No ORDER BY: asked for key order, SQLite walks the whole collection by its primary key
# (at 100,000 VM documents half of the consumer's CPU in the freeze wave) instead of taking
# the few changed rows from docs_rev; they are sorted after.
CHANGES = "SELECT key, etag, value FROM docs WHERE collection = ? AND rev > ?"
# SQLite's default limit on host parameters is 999 in old builds; two go to the collection.
READ_MANY_CHUNK = 900

# Durability. The file is in WAL mode, where a commit under synchronous=FULL syncs the
# log up to and including itself, and so every commit made before it whatever its own
# setting; a commit under NORMAL survives a crash of the process and is lost only with
# the machine (power, kernel) until the next FULL commit. Writes are FULL, except to the
# collections named in `defer_sync`, which are NORMAL until `flush` (a FULL commit of
# one counter row) or any FULL commit. The consumer defers its VM and event documents,
# never the approval ledger (on disk before a command is sent), and flushes before a
# batch can be checkpointed.
FLUSH = (
    "INSERT INTO revs (collection, rev) VALUES ('', 1)"
    " ON CONFLICT (collection) DO UPDATE SET rev = rev + 1"
)


class SqliteStore:
    """One connection shared by the process's threads under a lock; WAL for other processes."""

    feed_interval = 0.0  # a look for changes is one indexed query of a local file

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn = self._open()
        self._deferred: frozenset[str] = frozenset()
        self._unsynced = False

    def _open(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit: a single statement is its own transaction; batches say BEGIN.
            conn = sqlitewal.connect(self.path, synchronous="FULL", busy_timeout_ms=BUSY_TIMEOUT_MS)
            for statement in SCHEMA:
                conn.execute(statement)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(docs)")}
            if "rev" not in columns:
                conn.execute(ADD_REV)
            conn.execute(INDEX)
        except (OSError, sqlite3.Error) as err:
            if conn is not None:
                conn.close()
            raise self._error(err) from err
        return conn

    def read(self, collection: str, key: str) -> Doc | None:
        row = self._run(lambda c: c.execute(READ, (collection, key)).fetchone())
        return None if row is None else Doc(key, decode_value(row[1]), row[0])

    def read_many(self, collection: str, keys: Sequence[str]) -> dict[str, Doc]:
        found: dict[str, Doc] = {}
        unique = sorted(set(keys))
        for start in range(0, len(unique), READ_MANY_CHUNK):
            chunk = unique[start : start + READ_MANY_CHUNK]
            marks = ", ".join("?" * len(chunk))  # placeholders only: the keys are parameters
            query = f"SELECT key, etag, value FROM docs WHERE collection = ? AND key IN ({marks})"  # noqa: S608
            args = (collection, *chunk)

            def fetch(conn: sqlite3.Connection, q: str = query, a: tuple[str, ...] = args) -> Rows:
                return conn.execute(q, a).fetchall()

            rows = self._run(fetch)
            found.update((key, Doc(key, decode_value(value), etag)) for key, etag, value in rows)
        return found

    def write(self, collection: str, doc: Doc) -> Doc:
        return write_one(self, collection, doc)

    def defer_sync(self, collections: Iterable[str]) -> None:
        self._deferred = frozenset(collections)

    def flush(self) -> None:
        if self._unsynced:
            self._transaction(lambda c: c.execute(FLUSH), sync=True)

    def write_many(self, collection: str, docs: Sequence[Doc]) -> tuple[list[Doc], list[str]]:
        """One transaction: every doc still at its etag is written, the others are named.

        The stored Docs share their value with `docs` (it is what was written).
        """
        etags, written = self._put(collection, docs, all_or_none=False)
        stored = [
            Doc(doc.key, doc.value, etag)
            for doc, etag, ok in zip(docs, etags, written, strict=True)
            if ok
        ]
        return stored, [doc.key for doc, ok in zip(docs, written, strict=True) if not ok]

    def write_all(self, collection: str, docs: Sequence[Doc]) -> list[Doc]:
        if len(docs) > TRANSACTION_DOCS:
            raise ValueError(
                f"{len(docs)} documents in one transaction; at most {TRANSACTION_DOCS}"
            )
        etags, _ = self._put(collection, docs, all_or_none=True)
        return [Doc(doc.key, doc.value, etag) for doc, etag in zip(docs, etags, strict=True)]

    def _put(
        self, collection: str, docs: Sequence[Doc], *, all_or_none: bool
    ) -> tuple[list[str], list[bool]]:
        """One transaction writing every doc still at its etag: their new ETags, and which
        were written. `all_or_none`: Conflict, and nothing written, unless every one is."""
        texts = [encode_value(collection, doc) for doc in docs]  # refused before anything is
        etags = _new_etags(len(docs))

        def work(conn: sqlite3.Connection) -> list[bool]:
            conn.execute(BUMP, (collection,))
            rev = conn.execute(MARK, (collection,)).fetchone()[0]
            written = _put_all(conn, collection, docs, etags=etags, texts=texts, rev=rev)
            if all_or_none and not all(written):  # raised in the transaction: rolled back
                late = [doc.key for doc, ok in zip(docs, written, strict=True) if not ok]
                raise Conflict(f"{collection}/{', '.join(late)} changed since read")
            return written

        return etags, self._transaction(work, sync=collection not in self._deferred)

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

    def scan_changes(
        self, collection: str, since: int | None, known: Mapping[str, Doc] | None = None
    ) -> tuple[list[Doc], int]:
        # The mark is read first: a transaction committed in between is returned now and
        # again next time (harmless), never skipped.
        row = self._run(lambda c: c.execute(MARK, (collection,)).fetchone())
        mark = 0 if row is None else int(row[0])
        if since is None:
            rows = self._run(lambda c: c.execute(SCAN, (collection,)).fetchall())
        else:
            rows = sorted(self._run(lambda c: c.execute(CHANGES, (collection, since)).fetchall()))
        seen = known or {}
        # A document at an ETag the caller knows is the value it already has: not decoded.
        return [
            Doc(key, decode_value(value), etag)
            for key, etag, value in rows
            if (held := seen.get(key)) is None or held.etag != etag
        ], mark

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _transaction(self, work: Callable[[sqlite3.Connection], T], *, sync: bool) -> T:
        def run(conn: sqlite3.Connection) -> T:
            # synchronous applies per connection and may change between transactions only.
            if not sync:
                conn.execute("PRAGMA synchronous = NORMAL")
            try:
                # IMMEDIATE: take the write lock now, so the busy timeout (not a deadlock
                # error) is what a second writer meets.
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = work(conn)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
                self._unsynced = not sync
                return result
            finally:
                if not sync:
                    conn.execute("PRAGMA synchronous = FULL")

        return self._run(run)

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


def _new_etags(count: int) -> list[str]:
    """`count` random 128-bit tokens (as uuid4 would give, from one call to the OS)."""
    raw = os.urandom(16 * count).hex()
    return [raw[i : i + 32] for i in range(0, len(raw), 32)]


def _put_all(
    conn: sqlite3.Connection,
    collection: str,
    docs: Sequence[Doc],
    *,
    etags: Sequence[str],
    texts: Sequence[str],
    rev: int,
) -> list[bool]:
    """Write every doc still at its `doc.etag` (absent for None); which ones were written.

    One statement per kind for the whole batch; only when some row did not match is each
    doc looked up, inside the same transaction: written means it now has its new ETag.
    """
    rows = list(zip(docs, etags, texts, strict=True))
    inserts = [(collection, d.key, e, t, rev) for d, e, t in rows if d.etag is None]
    updates = [(e, t, rev, collection, d.key, d.etag) for d, e, t in rows if d.etag is not None]
    changed = 0
    if inserts:
        changed += conn.executemany(INSERT, inserts).rowcount
    if updates:
        changed += conn.executemany(UPDATE, updates).rowcount
    if changed == len(docs):
        return [True] * len(docs)
    now = [conn.execute(ETAG, (collection, d.key)).fetchone() for d in docs]
    return [row is not None and row[0] == e for row, e in zip(now, etags, strict=True)]
