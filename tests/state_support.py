"""Shared helpers of the fleet state tests: Azurite settings and a contended counter."""

from __future__ import annotations

import time
import uuid

from bridge.config import Config, StorageSettings
from bridge.state import Conflict, Doc, Store


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
