"""The VM and event documents: every read and write of them by the consumer's decisions,
its sweep and its dispatch (the approval ledger is bridge.consumer.ledger's alone)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from bridge.consumer import documents as fs
from bridge.consumer.state import Doc, Mutation, Store, read_many, update, update_many
from bridge.consumer.views import EventIndex, FleetCache, VmSnapshot
from bridge.records import iso, utc_now


class Fleet:
    """The fleet state's VM and event documents, with what is kept of them between looks."""

    def __init__(self, store: Store, *, now: Callable[[], datetime] = utc_now) -> None:
        self.store = store
        self.vms = FleetCache(store, now=now)
        self.events = EventIndex(store, now=now)

    def fold(
        self, vms: Mapping[str, Mutation], events: Mapping[str, Mutation]
    ) -> dict[str, Doc | None]:
        """Merge a batch into the VM and event documents; the event documents as stored."""
        self.vms.update(vms)
        return update_many(self.store, fs.EVENT, events)

    def snapshot(self) -> VmSnapshot:
        """The VMs known now, for one pass (or one question)."""
        return VmSnapshot(self.store, self.vms)

    def event(self, key: str) -> Doc | None:
        return self.store.read(fs.EVENT, key)

    def events_of(self, keys: Sequence[str]) -> dict[str, Doc]:
        return read_many(self.store, fs.EVENT, keys)

    def vms_of(self, keys: Sequence[str]) -> dict[str, Doc]:
        return read_many(self.store, fs.VM, keys)

    def mark_released(self, key: str, now: datetime) -> None:
        def mark(value: dict[str, Any]) -> bool:
            value["released"] = iso(now)
            return True

        update(self.store, fs.EVENT, key, mark)

    def unmark_released(self, key: str) -> None:
        def unmark(value: dict[str, Any]) -> bool:
            return value.pop("released", None) is not None

        update(self.store, fs.EVENT, key, unmark)

    def remember(self, key: str, change: Mutation, held: Doc | None = None) -> None:
        """Change the event document `key`; `held`: a copy most likely current, written
        over without reading it again (if it changed since, it is read and changed again)."""
        known = {key: Doc(key, dict(held.value), held.etag)} if held else None
        update_many(self.store, fs.EVENT, {key: change}, known=known)

    def delete_event(self, doc: Doc) -> None:
        self.store.delete(fs.EVENT, doc)

    def delete_vm(self, doc: Doc) -> None:
        """Conflict when the VM was heard from since `doc` was read."""
        self.store.delete(fs.VM, doc)

    def flush(self) -> None:
        """Make what was merged durable (before the batch may be checkpointed)."""
        self.store.flush()
