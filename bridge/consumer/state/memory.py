"""The fleet state in this process's memory: the whole Store contract, nothing on disk.

For what keeps no state between runs (`policy explain --records`, tests of the consumer
that do not test a store). Documents are held as their JSON text, as the other stores hold
them, so a caller changing a value it read or wrote changes nothing stored, and a value
either store refuses is refused here too. `another()` is a second client of the same
state, as a second consumer process holds of a shared file or table.
"""

from __future__ import annotations

import bisect
import itertools
import marshal
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bridge.consumer.state import (
    TRANSACTION_DOCS,
    Conflict,
    Doc,
    decode_value,
    encode_value,
    write_one,
)


@dataclass
class _Row:
    etag: str
    text: str
    rev: int  # the collection's mark when it was written (scan_changes)
    # The value as read back, marshalled on its first read: each later read is a private copy
    # at a fraction of a JSON decode (a replay reads every event at every pass, issue 40).
    frozen: bytes | None = None


@dataclass
class _Shared:
    """What every client of one memory state sees."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    rows: dict[str, dict[str, _Row]] = field(default_factory=dict)
    revs: dict[str, int] = field(default_factory=dict)
    etags: itertools.count[int] = field(default_factory=itertools.count)
    # Per collection, (rev, key) of every write in order: what changed since a mark is found
    # without looking at every row (the fleet's VMs, at every batch of a replay).
    log: dict[str, list[tuple[int, str]]] = field(default_factory=dict)


class MemoryStore:
    feed_interval = 0.0  # a look for changes is a walk over a dict

    def __init__(self, shared: _Shared | None = None) -> None:
        self._shared = shared or _Shared()

    def another(self) -> MemoryStore:
        """A second client of this state."""
        return MemoryStore(self._shared)

    def read(self, collection: str, key: str) -> Doc | None:
        return self.read_many(collection, [key]).get(key)

    def read_many(self, collection: str, keys: Sequence[str]) -> dict[str, Doc]:
        with self._shared.lock:
            rows = self._rows(collection)
            return {key: _doc(key, rows[key]) for key in sorted(set(keys)) if key in rows}

    def write(self, collection: str, doc: Doc) -> Doc:
        return write_one(self, collection, doc)

    def write_many(self, collection: str, docs: Sequence[Doc]) -> tuple[list[Doc], list[str]]:
        texts = [encode_value(collection, doc) for doc in docs]  # refused before anything is
        with self._shared.lock:
            rev = self._bump(collection)
            stored, conflicted = [], []
            for doc, text in zip(docs, texts, strict=True):
                if self._current(collection, doc):
                    stored.append(self._put(collection, doc, text, rev))
                else:
                    conflicted.append(doc.key)
            return stored, conflicted

    def write_all(self, collection: str, docs: Sequence[Doc]) -> list[Doc]:
        if len(docs) > TRANSACTION_DOCS:
            raise ValueError(
                f"{len(docs)} documents in one transaction; at most {TRANSACTION_DOCS}"
            )
        texts = [encode_value(collection, doc) for doc in docs]
        with self._shared.lock:
            late = [doc.key for doc in docs if not self._current(collection, doc)]
            if late or len({doc.key for doc in docs}) < len(docs):
                raise Conflict(
                    f"{collection}/{', '.join(late) or 'a key twice'} changed since read"
                )
            rev = self._bump(collection)
            return [self._put(collection, d, t, rev) for d, t in zip(docs, texts, strict=True)]

    def delete(self, collection: str, doc: Doc) -> None:
        with self._shared.lock:
            rows = self._rows(collection)
            row = rows.get(doc.key)
            if row is None:
                return  # gone is what the caller wanted
            if row.etag != doc.etag:
                raise Conflict(f"{collection}/{doc.key} changed since it was read")
            del rows[doc.key]

    def scan(self, collection: str) -> list[Doc]:
        return self.scan_changes(collection, None)[0]

    def scan_changes(
        self, collection: str, since: int | None, known: Mapping[str, Doc] | None = None
    ) -> tuple[list[Doc], int]:
        seen = known or {}
        with self._shared.lock:
            rows = self._rows(collection)
            if since is None:
                keys: Iterable[str] = rows
            else:
                log = self._shared.log.get(collection, [])
                start = bisect.bisect_right(log, since, key=lambda entry: entry[0])
                keys = {key for _, key in log[start:]}
            wanted = [
                key
                for key in sorted(keys)
                if (row := rows.get(key)) is not None
                and (since is None or row.rev > since)
                and ((held := seen.get(key)) is None or held.etag != row.etag)
            ]
            return [_doc(key, rows[key]) for key in wanted], self._shared.revs.get(collection, 0)

    def defer_sync(self, collections: Iterable[str]) -> None:
        """Nothing to defer: nothing is on disk."""

    def flush(self) -> None:
        """Nothing to make durable."""

    def close(self) -> None:
        """The state stays for the other clients (and this one)."""

    def _rows(self, collection: str) -> dict[str, _Row]:
        return self._shared.rows.setdefault(collection, {})

    def _bump(self, collection: str) -> int:
        self._shared.revs[collection] = self._shared.revs.get(collection, 0) + 1
        return self._shared.revs[collection]

    def _current(self, collection: str, doc: Doc) -> bool:
        row = self._rows(collection).get(doc.key)
        return (row.etag if row else None) == doc.etag

    def _put(self, collection: str, doc: Doc, text: str, rev: int) -> Doc:
        etag = f"m{next(self._shared.etags)}"
        rows = self._rows(collection)
        rows[doc.key] = _Row(etag, text, rev)
        log = self._shared.log.setdefault(collection, [])
        log.append((rev, doc.key))
        if len(log) > 4 * len(rows) + 1024:  # what was written over since: kept once
            log[:] = sorted((row.rev, key) for key, row in rows.items())
        return Doc(doc.key, doc.value, etag)


def _doc(key: str, row: _Row) -> Doc:
    if row.frozen is None:
        value = decode_value(row.text)
        row.frozen = marshal.dumps(value)
        return Doc(key, value, row.etag)
    thawed: dict[str, object] = marshal.loads(row.frozen)  # noqa: S302 - our own bytes
    return Doc(key, thawed, row.etag)
