"""When an event stops counting against the budgets though no VM reported its end (the
slot-release rule, docs/policy.md#when-a-slot-is-released), and the tick's housekeeping:
events no VM has reported on for too long are forgotten, VMs not heard from are swept (and,
as often, the operator documents spent a week ago), and the events still open are counted for
the metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from bridge.consumer import documents as fs
from bridge.consumer.fleet import Fleet
from bridge.consumer.ledger import ApprovalLedger, LedgerEntry
from bridge.consumer.people.operatorlog import OperatorLog
from bridge.consumer.state import Conflict, Doc
from bridge.policy.model import EventView, Scope, VmView, scope_of
from bridge.records import iso, parse_time

log = logging.getLogger(__name__)

# The fleet state is swept for VMs gone past consumer.forget_vms_after this often.
SWEEP_EVERY = timedelta(hours=1)


@dataclass(frozen=True)
class Pending:
    """The open events as the last tick found them (the metrics' events_pending and
    next_event_start): how many are Scheduled and Started across the fleet, and the earliest
    NotBefore of a Scheduled one."""

    scheduled: int = 0
    started: int = 0
    next_start: datetime | None = None


def pending(docs: Iterable[Doc | None]) -> Pending:
    """`Pending` of the events the tick found open (a Gone event the ledger still counts is
    not pending: no VM reports it)."""
    values = [fs.event_document(doc) for doc in docs if doc is not None]
    statuses = [fs.status(value) for value in values]
    due = [
        when
        for value, status in zip(values, statuses, strict=True)
        if status == "Scheduled" and (when := parse_time(value.get("not_before")))
    ]
    return Pending(statuses.count("Scheduled"), statuses.count("Started"), min(due, default=None))


class Alive(Protocol):
    """Which VMs the release rule takes as alive (bridge.consumer.reading.Vouched)."""

    def alive(self, vm_id: str, now: datetime) -> bool: ...


def all_gone(
    value: fs.EventDocument,
    view: EventView,
    entry: LedgerEntry | None,
    vms: Mapping[str, VmView],
    *,
    fleet: Alive,
    now: datetime,
    alive_within: float,
) -> str | None:
    """Why the event no longer counts though not every VM said it ended; else None.

    The rule (docs/policy.md#when-a-slot-is-released), while no VM still reporting the
    event has been heard from within consumer.alive_within (`fleet`: silent only as far as
    the partitions carrying the VMs were read, bridge.consumer.reading):

    - for each VM still reporting it, a VM of the same scope reported the event gone after
      its last word: the platform took it out of the set's document, and those VMs are
      deleted (a VM sees only its own scope's document: one of another scope that says
      the event is gone knows nothing of it);
    - or the event is due (NotBefore, or when first seen without one, plus its duration)
      and no VM it names that has not said it is gone was heard from within alive_within:
      a VM deleted by a Terminate or Preempt never reports the end of its event.

    A VM that is only rebooting is heard again within minutes. The caller asks only once
    it has listened for a whole alive_within (after a restart every VM looks silent until
    its records are folded in again).
    """
    within = timedelta(seconds=alive_within)
    reports = value.get("reporters", {})
    if any(fleet.alive(v, now) for v in view.reporters):
        return None
    ended = {v: r["at"] for v, r in reports.items() if r["status"] == fs.GONE}
    said = _gone_after(reports, ended, view.reporters, vms)
    if said is not None:
        return (
            f"VM {said} reported the event gone and the VMs of its scope "
            f"that still reported it have not been heard from for "
            f"{alive_within:g} s: they are taken as deleted"
        )
    due = (view.not_before or view.first_seen) + timedelta(seconds=max(view.duration or 0, 0))
    if now < due + within:
        return None
    watchers = {*view.affected, *view.possible}
    watchers |= {v for v in (entry["vms"] if entry else ()) if v in vms}
    if any(fleet.alive(v, now) for v in watchers - ended.keys()):
        return None
    return (
        f"no VM of the event has been heard from for {alive_within:g} s "
        f"since it was due at {iso(due)}: its VMs are taken as deleted and the event as over"
    )


def _gone_after(
    reports: Mapping[str, fs.Reporter],
    ended: Mapping[str, str],
    still: Iterable[str],
    vms: Mapping[str, VmView],
) -> str | None:
    """The VM that last reported the event gone (of `ended`, VM -> when) if, for each VM of
    `still`, a VM of its own scope did after that VM's last word; else None."""

    def scope(vm: str) -> Scope | None:
        return scope_of(vms[vm]) if vm in vms else None

    vouchers: list[str] = []
    for vm in still:
        mine = [v for v in ended if scope(v) == scope(vm) and ended[v] >= reports[vm]["at"]]
        if not mine:
            return None
        vouchers += mine
    return max(vouchers, key=lambda v: ended[v]) if vouchers else None


def unreleased(value: fs.EventDocument) -> bool:
    """A record changed the released event after its release: a VM of it is back."""
    return value.get("heard", "") > value.get("released", "")


class Housekeeping:
    """The tick's forgetting of stale events and the hourly sweep of VMs gone."""

    def __init__(
        self,
        fleet: Fleet,
        ledger: ApprovalLedger,
        forget_vms_after: float,
        operators: OperatorLog | None = None,
    ) -> None:
        self.fleet = fleet
        self.ledger = ledger
        self.operators = operators
        self.forget_vms_after = timedelta(seconds=forget_vms_after)
        self._swept: datetime | None = None

    def open_events(
        self, held: Mapping[str, LedgerEntry], now: datetime, stale_after: timedelta
    ) -> dict[str, Doc | None]:
        """The events still open (or counted by `held`); those no VM has reported on for
        `stale_after` are forgotten on the way."""
        found: dict[str, Doc | None] = {}
        for doc in self.fleet.events.scan():
            if fs.is_stale(fs.event_document(doc), now, stale_after):
                self._forget(doc.key, now, stale_after)
                self.fleet.events.drop(doc.key)
            elif fs.status(fs.event_document(doc)) != fs.GONE or doc.key in held:
                found[doc.key] = doc
        return found

    def _forget(self, key: str, now: datetime, stale_after: timedelta) -> None:
        # Read again: the tick's copy may be older than a report that keeps the event alive
        # (EventIndex), and releasing a live event's entry would leave its VMs uncounted.
        doc = self.fleet.event(key)
        if doc is None or not fs.is_stale(fs.event_document(doc), now, stale_after):
            return
        self.ledger.release(doc.key, "no VM has reported on the event for too long")
        try:
            self.fleet.delete_event(doc)
        except Exception:  # a concurrent update keeps it alive; the next tick looks again
            log.debug("event %s changed while being forgotten", doc.key)

    def sweep_due(self, now: datetime) -> bool:
        return self._swept is None or now - self._swept >= SWEEP_EVERY

    def sweep(self, now: datetime, held: Mapping[str, LedgerEntry]) -> None:
        """Remove the documents of VMs not heard from for consumer.forget_vms_after (hourly).

        A VM an open event still counts stays. The VMs another consumer removed leave this
        process's cache too: the delete finds them gone. The sweep reads no scan, only the
        VMs kept (the change feed keeps every VM document): at 100,000 VMs a scan read every
        VM document each hour for each consumer, the 6,250 of each `vm` table partition in
        a burst of pages, past a partition's 2,000 entities a second (issue 15).
        """
        if not self.sweep_due(now):
            return
        self._swept = now
        horizon = iso(now - self.forget_vms_after)
        counted = {vm for entry in held.values() for vm in entry["vms"]}
        present, gone, still = set(), [], []
        for doc in self.fleet.vms.documents():
            value = fs.vm_document(doc)
            if (value.get("heard") or value.get("last_seen", "")) >= horizon:
                present.add(doc.key)
            elif doc.key not in counted:
                gone.append(doc)
            else:
                still.append(doc.key)
        # Counted, so not removed here; as kept, perhaps removed by another consumer.
        present.update(self.fleet.vms_of(still))
        present.update(doc.key for doc in gone if self._stays(doc))
        self.fleet.vms.retain(present)
        if self.operators is not None:
            self.operators.forget(now, self._is_open)

    def _is_open(self, event_id: str) -> bool:
        doc = self.fleet.event(fs.event_key(event_id))
        return doc is not None and fs.status(fs.event_document(doc)) != fs.GONE

    def _stays(self, doc: Doc) -> bool:
        """Remove a VM gone; True when it was heard from meanwhile (it stays)."""
        try:
            self.fleet.delete_vm(doc)  # quiet where another consumer removed it
        except Conflict:
            return True
        log.info(
            "VM %s (%s) has not been heard from since %s: removed from the fleet state",
            doc.key,
            doc.value.get("name"),
            doc.value.get("heard") or doc.value.get("last_seen"),
        )
        return False
