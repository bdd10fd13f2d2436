"""Fleet state stores: small JSON documents with optimistic concurrency.

The consumer keeps everything it knows (VMs, events, the approval ledger) as documents
in named collections. Every write names the version it read (an ETag); a write over
a newer version fails with `Conflict`, and the caller re-reads and re-decides. That is
what lets several consumer instances share one fleet without exceeding a budget or
approving one event twice. Two implementations: SQLite for one machine, Azure Table
Storage for a real fleet.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bridge import specs
from bridge.retry import RetryableError

if TYPE_CHECKING:
    from bridge.config import Config


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
    def read(self, collection: str, key: str) -> Doc | None:
        """The document, or None when there is none."""

    def write(self, collection: str, doc: Doc) -> Doc:
        """Store `doc` if still at `doc.etag`: the stored Doc with its new etag, or Conflict."""

    def delete(self, collection: str, doc: Doc) -> None:
        """Remove `doc` if it is still at `doc.etag`; Conflict if it changed, nothing if gone."""

    def scan(self, collection: str) -> list[Doc]:
        """Every document of the collection, in key order."""

    def close(self) -> None: ...


def parse_spec(spec: str) -> tuple[str, str]:
    """Split `sqlite:PATH` / `tables` into (kind, argument); ValueError names what is wrong."""
    return specs.split(
        spec, "fleet state", {"sqlite": "/var/lib/se-bridge/fleet.db", "tables": None}
    )


# Table Storage counts a string property as UTF-16 (two bytes a character) against its
# 1 MiB entity limit, so about 500 000 characters fit; both stores refuse more, so a
# value that works on SQLite also works on Tables.
MAX_VALUE_CHARS = 480_000


def encode_value(collection: str, doc: Doc) -> str:
    """`doc.value` as compact ASCII JSON; TypeError if not a JSON object, ValueError if too big."""
    if not isinstance(doc.value, dict):
        raise TypeError(f"{collection}/{doc.key}: a document's value must be a dict")
    try:
        text = json.dumps(doc.value, separators=(",", ":"), allow_nan=False)
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


def build(spec: str, config: Config) -> Store:
    """The store a `consumer.state` SPEC names (`sqlite:PATH` or `tables`)."""
    kind, arg = parse_spec(spec)
    # Imported only when chosen, so a local consumer never loads the Azure SDK.
    if kind == "sqlite":
        from bridge.state.sqlite import SqliteStore  # noqa: PLC0415

        return SqliteStore(Path(arg).expanduser())
    from bridge.state.tables import TableStore  # noqa: PLC0415

    return TableStore(config)


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
