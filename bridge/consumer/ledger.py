"""The approval ledger (budgets, one approval per event) and sending the approvals.

The ledger is one document, `ledger/approvals`, holding every event that impacts VMs
now: approved by us and not yet completed, or Started by the platform. A sample:

    {"events": {"c7061bac-...": {
        "event_id": "C7061BAC-...", "origin": "approved", "vms": ["1b1f...", "9c2e..."],
        "target": "1b1f...", "attempt": 1, "tried": ["1b1f..."], "rule": "user-initiated",
        "command_id": "3d0c...", "command": "{...}", "issued_at": "2026-11-21T10:00:01.250Z",
        "sent": true, "confirmed": false, "refused": false}}}

Every change is a write with the ETag read, so two consumers racing for the last budget
slot or the same event cannot both win: the loser re-reads and decides again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypedDict, cast

from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer.state import Conflict, Doc, Store, update
from bridge.policy.model import EventView
from bridge.records import parse_time

log = logging.getLogger(__name__)

# Where the consumer's records (Decisions) go: the service's spool, the Functions app's outlet.
Emit = Callable[[list[dict[str, Any]]], None]


class _ImpactEntry(TypedDict):
    event_id: str
    origin: str  # "approved" (by us) or "started" (by the platform, approved or not)
    vms: list[str]  # VmIds, and names not yet resolved to one: what the budgets count


class LedgerEntry(_ImpactEntry, total=False):
    """One event in the ledger (the module's sample): a "started" entry has only the three
    keys above; an "approved" one also the command and how it fared."""

    target: str  # the VmId the command went to
    attempt: int
    tried: list[str]  # VmIds asked so far, in order
    rule: str
    command_id: str
    command: str  # the command's JSON, until it is marked sent
    decision: dict[str, Any]  # its Decision record, until it is marked sent
    issued_at: str
    sent: bool
    confirmed: bool
    refused: bool


def ledger_events(value: dict[str, Any]) -> dict[str, LedgerEntry]:
    """The entries of the ledger document `value`, by event key (created when missing)."""
    return cast(dict[str, LedgerEntry], value.setdefault("events", {}))


class ApprovalLedger:
    def __init__(self, store: Store, settings: ConsumerSettings) -> None:
        self.store = store
        self.settings = settings

    def read(self) -> Doc:
        doc = self.store.read(fs.LEDGER, fs.LEDGER_KEY) or Doc(fs.LEDGER_KEY)
        ledger_events(doc.value)
        return doc

    @staticmethod
    def impacted(doc: Doc) -> dict[str, frozenset[str]]:
        return {key: frozenset(e["vms"]) for key, e in ledger_events(doc.value).items()}

    def entries(self) -> dict[str, LedgerEntry]:
        return ledger_events(self.read().value)

    def needs_decision(self, entry: LedgerEntry, now: datetime) -> bool:
        """An approval we sent that was refused, or went unconfirmed for too long."""
        if entry.get("origin") != "approved" or entry.get("confirmed") or not entry.get("sent"):
            return False
        issued = parse_time(entry.get("issued_at")) or now
        timed_out = now - issued >= timedelta(seconds=self.settings.approval_timeout)
        return bool(entry.get("refused")) or timed_out

    def note_approvals(self, records: Sequence[Mapping[str, Any]]) -> set[str]:
        """Fold Approval records into the ledger; the events whose approval they answer."""
        # Keyed by (CommandId, VmId): only the VM the command went to can answer it, so a VM
        # cannot mark another VM's command refused or done by sending records in its name.
        outcomes = {
            (str(r.get("CommandId")), str(r.get("VmId")).lower()): str(r.get("ApprovalOutcome"))
            for r in records
            if r.get("RecordType") == "Approval" and r.get("CommandId")
        }
        if not outcomes:
            return set()
        touched: set[str] = set()

        def fold(value: dict[str, Any]) -> bool:
            touched.clear()
            for key, entry in ledger_events(value).items():
                answer = (str(entry.get("command_id")), str(entry.get("target")).lower())
                outcome = outcomes.get(answer)
                if outcome is not None and not entry.get("confirmed"):
                    entry["confirmed" if outcome == "Approved" else "refused"] = True
                    touched.add(key)
            return bool(touched)

        update(self.store, fs.LEDGER, fs.LEDGER_KEY, fold)
        return set(touched)

    def note_started(self, doc: Doc, key: str, view: EventView) -> None:
        """A Started event impacts its VMs whether or not we approved it."""
        if key in ledger_events(doc.value):
            return
        vms = sorted({*view.affected, *view.unresolved, *view.possible})
        started: LedgerEntry = {"event_id": view.event_id, "origin": "started", "vms": vms}
        ledger_events(doc.value)[key] = started
        try:
            self.store.write(fs.LEDGER, doc)
        except Conflict:
            # Not left to a later pass: until it is in the ledger, the approvals decided in
            # between (this pass's next events, other consumers) would not count its VMs.
            def add(value: dict[str, Any]) -> bool:
                return ledger_events(value).setdefault(key, started) is started

            update(self.store, fs.LEDGER, fs.LEDGER_KEY, add)

    def release(self, key: str, why: str) -> None:
        def drop(value: dict[str, Any]) -> bool:
            return ledger_events(value).pop(key, None) is not None

        if update(self.store, fs.LEDGER, fs.LEDGER_KEY, drop) is not None:
            log.info("event %s no longer counts against budgets: %s", key, why)

    def mark_sent(
        self, key: str, command_id: str, *, written: Doc | None = None, confirmed: bool = False
    ) -> None:
        """Mark the entry's command sent; `written`: the ledger as this process just stored it.

        From `written` the change is made without reading the ledger again (the ledger
        is the largest document, read and decoded on every decision); if another
        consumer wrote the ledger since, the write conflicts and the newest one is read.
        """

        def sent(value: dict[str, Any]) -> bool:
            entry = ledger_events(value).get(key)
            if entry is None or entry.get("command_id") != command_id or entry.get("sent"):
                return False
            entry["sent"] = True
            if confirmed:  # shadow mode: no agent answers; taken as a cooperative one would
                entry["confirmed"] = True
            # Only a resend needs these; dropped, every decision reads and writes a ledger
            # that stays small however many approvals are open.
            entry.pop("command", None)
            entry.pop("decision", None)
            return True

        if written is not None and written.etag is not None and sent(written.value):
            try:
                self.store.write(fs.LEDGER, written)
            except Conflict:
                pass
            else:
                return
        update(self.store, fs.LEDGER, fs.LEDGER_KEY, sent)
