"""Shared helpers of the fleet state tests: Azurite settings, a contended counter, and a
store that hands every call on (subclasses step in before one)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence

from bridge.config import Config, StorageSettings
from bridge.consumer import documents as fs
from bridge.consumer.ledger import ALL_LOCKS, SHARDS, read_ledger, shard_of
from bridge.consumer.state import Conflict, Doc, Store


def tables_config(connection_string: str) -> Config:
    return Config(storage=StorageSettings(connection_string=connection_string))


def unique_table() -> str:
    """A table name of its own for each test (letters and digits only, as Tables wants)."""
    return f"t{uuid.uuid4().hex[:16]}"


def increment(store: Store, collection: str, key: str, times: int) -> int:
    """Add 1 to the counter `times` times by read-modify-write; how many Conflicts it met."""
    conflicts = 0
    for _ in range(times):
        while True:
            doc = store.read(collection, key) or Doc(key, {"n": 0})
            doc.value["n"] += 1
            time.sleep(0)  # let the other side in between read and write, as a slow decision would
            try:
                store.write(collection, doc)
            except Conflict:
                conflicts += 1
                continue
            break
    return conflicts


class DelegatingStore:
    """A Store that hands every call to `inner`; tests override the call they interleave.

    Its pace is the inner store's (`feed_interval`).
    """

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.feed_interval = inner.feed_interval

    def read(self, collection: str, key: str) -> Doc | None:
        return self.inner.read(collection, key)

    def read_many(self, collection: str, keys: Sequence[str]) -> dict[str, Doc]:
        return self.inner.read_many(collection, keys)

    def write(self, collection: str, doc: Doc) -> Doc:
        return self.inner.write(collection, doc)

    def write_many(self, collection: str, docs: Sequence[Doc]) -> tuple[list[Doc], list[str]]:
        return self.inner.write_many(collection, docs)

    def delete(self, collection: str, doc: Doc) -> None:
        self.inner.delete(collection, doc)

    def scan(self, collection: str) -> list[Doc]:
        return self.inner.scan(collection)

    def scan_changes(
        self, collection: str, since: int | None, known: Mapping[str, Doc] | None = None
    ) -> tuple[list[Doc], int]:
        return self.inner.scan_changes(collection, since, known)

    def defer_sync(self, collections: Iterable[str]) -> None:
        self.inner.defer_sync(collections)

    def flush(self) -> None:
        self.inner.flush()

    def write_all(self, collection: str, docs: Sequence[Doc]) -> list[Doc]:
        return self.inner.write_all(collection, docs)

    def close(self) -> None:
        self.inner.close()


def touch_ledger(store: Store) -> None:
    """Write every ledger shard and lock again, unchanged (creating the missing ones), as
    another consumer's write would: any ledger write read before this one conflicts."""
    docs = read_ledger(store).docs
    keys = sorted({shard_of(str(n)) for n in range(SHARDS * 20)} | ALL_LOCKS)
    assert len({k for k in keys if k.startswith("entries-")}) == SHARDS
    store.write_all(fs.LEDGER, [docs.get(k) or Doc(k, {}) for k in keys])
