"""Fleet state stores: small JSON documents with optimistic concurrency.

The consumer keeps everything it knows (VMs, events, the approval ledger) as documents
in named collections. Every write names the version it read (an ETag); a write over
a newer version fails with `Conflict`, and the caller re-reads and re-decides. That is
what lets several consumer instances share one fleet without exceeding a budget or
approving one event twice. Three implementations: SQLite for one machine, Azure Table
Storage for a real fleet, and memory (one process: tests, `policy explain --records`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from bridge.retry import RetryableError


class Conflict(Exception):
    """The document changed (or appeared, or vanished) since it was read."""


@dataclass
class Doc:
    """A document, its key within its collection, and the version it was read at.

    `etag` is None for a document not yet stored: writing it creates it, and fails with
    Conflict if somebody else created it first.
    """

    key: str
    value: dict[str, Any] = field(default_factory=dict)
    etag: str | None = None


class Store(Protocol):
    """Every store does all of this; what differs between them is only how often a look is
    worth making (`feed_interval`)."""

    # Seconds a reader that can do with an older view should let pass between two looks at
    # what changed (`scan_changes`): 0 where a look is cheap (a local file), more where each
    # is a query to a service. A pace, not a capability: every store has the change feed.
    feed_interval: float

    def read(self, collection: str, key: str) -> Doc | None:
        """The document, or None when there is none."""

    def read_many(self, collection: str, keys: Sequence[str]) -> dict[str, Doc]:
        """The stored documents among `keys` (absent keys are left out)."""

    def write(self, collection: str, doc: Doc) -> Doc:
        """Store `doc` if still at `doc.etag`: the stored Doc with its new etag, or Conflict.

        The stored Doc shares `doc.value` (what was written): change neither afterwards.
        """

    def write_many(self, collection: str, docs: Sequence[Doc]) -> tuple[list[Doc], list[str]]:
        """Store every doc still at its etag: (the stored Docs, the keys that conflicted).

        A store may write all or none (Table Storage's entity-group transaction): then
        every key is reported as conflicted and the caller falls back to one at a time.
        """

    def write_all(self, collection: str, docs: Sequence[Doc]) -> list[Doc]:
        """Store every doc if each is still at its etag, or none of them (Conflict).

        At most TRANSACTION_DOCS documents (Table Storage's entity-group transaction);
        ValueError for more. The stored Docs share their values with `docs`.
        """

    def delete(self, collection: str, doc: Doc) -> None:
        """Remove `doc` if it is still at `doc.etag`; Conflict if it changed, nothing if gone."""

    def scan(self, collection: str) -> list[Doc]:
        """Every document of the collection, in key order (read in that order)."""

    def scan_changes(
        self, collection: str, since: int | None, known: Mapping[str, Doc] | None = None
    ) -> tuple[list[Doc], int]:
        """Documents written after mark `since` (all of them for None), and the new mark.

        Some written before the mark may come again (the caller already holds them). Deleted
        documents are not reported: use it on collections that are never deleted.
        A document still at the ETag of the `known` one of its key is left out (the caller
        has that version already).
        """

    def defer_sync(self, collections: Iterable[str]) -> None:
        """Writes to `collections` may return before they are on disk (they survive a crash
        of the process, not of the machine) until `flush` or a synced write. A store whose
        every write is durable when it returns (a service) does nothing."""

    def flush(self) -> None:
        """Make every write made so far durable."""

    def close(self) -> None: ...


# Table Storage counts a string property as UTF-16 (two bytes a character) against its
# 1 MiB entity limit, so about 500 000 characters fit; both stores refuse more, so a
# value that works on SQLite also works on Tables.
MAX_VALUE_CHARS = 480_000
# json.dumps with arguments builds an encoder at every call, a fifth of encoding a VM
# document; one made once says the same (it keeps no state between calls).
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def encode_value(collection: str, doc: Doc) -> str:
    """`doc.value` as compact ASCII JSON; TypeError if not a JSON object, ValueError if too big."""
    if not isinstance(doc.value, dict):
        raise TypeError(f"{collection}/{doc.key}: a document's value must be a dict")
    try:
        text = _ENCODER.encode(doc.value)
    except (TypeError, ValueError) as err:  # ValueError: NaN, Infinity or a circular reference
        raise TypeError(f"{collection}/{doc.key} is not JSON-serialisable: {err}") from err
    if len(text) > MAX_VALUE_CHARS:
        raise ValueError(
            f"{collection}/{doc.key} is {len(text)} characters of JSON; fleet state documents "
            f"hold at most {MAX_VALUE_CHARS} (Table Storage's 1 MiB entity limit)"
        )
    return text


def decode_value(text: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(text)
    return value


def bucket(text: str, count: int) -> int:
    """Which of `count` buckets `text` falls in, the same in every process (not hash(): it
    differs between processes, and every consumer must agree)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % count


# Table Storage's entity-group transaction: at most 100 operations, all in one partition.
TRANSACTION_DOCS = 100

MAX_CONFLICT_RETRIES = 50


def update(
    store: Store, collection: str, key: str, mutate: Callable[[dict[str, Any]], bool]
) -> Doc | None:
    """Read-modify-write `key` until no other writer interferes.

    `mutate` changes the value in place and says whether it changed anything; nothing is
    written when it did not. Returns the stored document (None if it never existed and
    `mutate` left it unchanged).
    """
    for _ in range(MAX_CONFLICT_RETRIES):
        doc = store.read(collection, key) or Doc(key)
        if not mutate(doc.value):
            return doc if doc.etag is not None else None
        try:
            return store.write(collection, doc)
        except Conflict:
            continue
    raise RetryableError(f"{collection}/{key} kept changing under {MAX_CONFLICT_RETRIES} writes")


Mutation = Callable[[dict[str, Any]], bool]


def write_one(store: Store, collection: str, doc: Doc) -> Doc:
    """`Store.write` for a store whose `write_many` writes one document as cheaply."""
    stored, conflicted = store.write_many(collection, [doc])
    if conflicted:
        what = "already exists" if doc.etag is None else "changed or vanished since it was read"
        raise Conflict(f"{collection}/{doc.key} {what}")
    return stored[0]


def read_many(store: Store, collection: str, keys: Sequence[str]) -> dict[str, Doc]:
    """The stored documents among `keys` (no round trip for none)."""
    return store.read_many(collection, keys) if keys else {}


def update_many(
    store: Store,
    collection: str,
    mutations: Mapping[str, Mutation],
    *,
    known: Mapping[str, Doc] | None = None,
) -> dict[str, Doc | None]:
    """`update` for many keys of one collection, in one read and one write where possible.

    A key whose write conflicts (somebody wrote it after our read) goes through `update`,
    which reads it again, so every mutation lands on the newest version exactly as with
    `update`. Returns each key's stored document as `update` would.

    `known`: documents the caller holds, most likely still current, used instead of reading
    them again. They are changed in place (on an exception, the caller must drop them); a
    stale one conflicts and goes through `update` like any other.
    """
    held = {key: known[key] for key in mutations if known and key in known}
    missing = [key for key in mutations if key not in held]
    found = {**read_many(store, collection, missing), **held}
    done: dict[str, Doc | None] = {}
    pending: list[Doc] = []
    for key, mutate in mutations.items():
        doc = found.get(key) or Doc(key)
        if mutate(doc.value):
            pending.append(doc)
        else:
            done[key] = doc if doc.etag is not None else None
    stored, conflicted = store.write_many(collection, pending) if pending else ([], [])
    done.update((doc.key, doc) for doc in stored)
    for key in conflicted:
        done[key] = update(store, collection, key, mutations[key])
    return done
