"""The consumer's drain bookkeeping (issue 30): how an event's drains are doing, as the
agents' drain Hook records tell it, and which drains the consumer granted, sent and had
refused, as the event's ledger entry keeps it.

Pure: documents and entries in, changes made in place or values out; the ledger
(bridge.consumer.ledger) and the event documents (bridge.consumer.documents) store them.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any, TypedDict

from bridge.commands.message import command_id
from bridge.policy.model import Blocker, DrainView, EventView
from bridge.records import RecordView, parse_time

log = logging.getLogger(__name__)

# --- an event's drains, as the agents report them --------------------------------------------


class DrainNote(TypedDict, total=False):
    """An event document's drain of one VM, from its latest drain Hook record (HookName
    "drain", HookPhase prepare). A sample:

    {"status": "Blocked", "at": "2026-11-21T10:04:00.000Z", "since": "2026-11-21T10:00:00.000Z",
     "blockers": [{"Namespace": "shop", "Pod": "web-1", "Reason": "EvictionRefused",
                   "PodDisruptionBudget": "web-pdb"}]}

    `since`: the TimeGenerated of the first Blocked record of the run that still lasts;
    `failed`: the drain ended and the node is not ready (GaveUp with hold, Failed).
    """

    status: str
    at: str
    since: str
    blockers: list[dict[str, str | None]]
    failed: bool


_DRAIN_OVER = frozenset({"Drained", "GaveUp", "Failed"})
MAX_BLOCKERS = 20  # as many as the schema lets a record name


def merged_drain(held: DrainNote | None, record: RecordView) -> DrainNote | None:
    """The drain note of one VM after its drain record `record`, `held` the note kept so
    far; None when the record changes nothing (an older one, or one that says no status).
    Draining and Blocked are progress, never a failed prepare step; a Blocked run keeps the
    time it began (how long it has been blocked)."""
    status, seen = _text(record, "DrainStatus"), _text(record, "TimeGenerated")
    if status is None or seen is None:
        return None
    if held is not None and seen < held.get("at", ""):
        return None
    note: DrainNote = {"status": status, "at": seen}
    if status == "Blocked":
        was_blocked = held is not None and held.get("status") == "Blocked"
        note["since"] = str(held.get("since") or seen) if was_blocked and held else seen
    blockers = record.get("DrainBlockers")
    if isinstance(blockers, list):
        note["blockers"] = [_blocker(b) for b in blockers[:MAX_BLOCKERS] if isinstance(b, dict)]
    if status in _DRAIN_OVER and record.get("HookExitCode") != 0:
        note["failed"] = True
    return note


def _text(record: RecordView, key: str) -> str | None:
    found = record.get(key)
    return found if isinstance(found, str) else None


def _blocker(given: Mapping[str, Any]) -> dict[str, str | None]:
    def text(key: str) -> str | None:
        found = given.get(key)
        return found if isinstance(found, str) else None

    return {
        "Namespace": text("Namespace") or "",
        "Pod": text("Pod") or "",
        "Reason": text("Reason") or "",
        "PodDisruptionBudget": text("PodDisruptionBudget"),
    }


def drain_views(notes: Mapping[str, DrainNote] | None) -> dict[str, DrainView]:
    """An event's drains (its document's `drains`) as the policy sees them, by VmId."""
    found = {}
    for vm_id, note in (notes or {}).items():
        at = parse_time(note.get("at"))
        if at is None:
            continue
        blockers = tuple(
            Blocker(
                str(b.get("Namespace") or ""),
                str(b.get("Pod") or ""),
                str(b.get("Reason") or ""),
                b.get("PodDisruptionBudget"),
            )
            for b in note.get("blockers") or ()
        )
        found[vm_id] = DrainView(
            str(note.get("status")),
            at,
            parse_time(note.get("since")),
            blockers,
            note.get("failed") is True,
        )
    return found


# --- the drains granted, as the ledger keeps them ---------------------------------------------


class DrainGrant(TypedDict, total=False):
    """What an event's ledger entry keeps of its drains (bridge.consumer.ledger.LedgerEntry):
    the VMs sent a Prepare, whether those were sent, and the VMs whose agents refused theirs
    (they drain nothing for the event). Kept by the approval that follows."""

    granted: list[str]
    prepared: bool
    no_drain: list[str]


_KEPT = ("granted", "prepared", "no_drain")


def with_grants(view: EventView, entry: DrainGrant | None) -> EventView:
    """`view` with the drains its ledger entry granted, and those its agents refused."""
    if entry is None or not entry.get("granted"):
        return view
    return replace(
        view,
        granted=frozenset(entry.get("granted", ())),
        no_drain=frozenset(entry.get("no_drain", ())),
    )


def grant(entry: DrainGrant, vms: Collection[str]) -> None:
    """Grant the drains of `vms` in `entry` as well, their Prepares not sent yet."""
    entry["granted"] = sorted({*entry.get("granted", ()), *vms})
    entry["prepared"] = False


def keep_grants(granted: DrainGrant | None, entry: DrainGrant) -> None:
    """The slot its drains were granted becomes the approval's (`entry`): the event counts
    once, and what was granted and refused stays known if the approval is refused."""
    for kept in _KEPT:
        if granted is not None and kept in granted:
            entry[kept] = granted[kept]  # type: ignore[literal-required]


def note_prepares_sent(entry: DrainGrant | None) -> bool:
    """Mark the Prepares of the entry's drains sent; False when there was nothing to mark."""
    if entry is None or entry.get("prepared") or not entry.get("granted"):
        return False
    entry["prepared"] = True
    return True


def prepare_answers(event_id: str, entry: DrainGrant) -> dict[tuple[str, str], str]:
    """The (CommandId, VmId) of an Approval record answering each Prepare the entry's drains
    were granted with, to the VmId."""
    return {
        (command_id(event_id, vm, "Prepare"), vm.lower()): vm for vm in entry.get("granted", ())
    }


# The refusals of a Prepare that say the agent drains nothing (docs/contracts.md#command): it
# has no node to drain, or is older than Prepare. Any other (a Replayed resend of a Prepare it
# is acting on, a signature it cannot verify, one too late) leaves the drain waited for.
_NO_DRAIN = ("Prepare", "Malformed")


def drains_nothing(record: RecordView) -> bool:
    """Whether the Approval record `record` refuses a Prepare saying the agent drains nothing."""
    detail = record.get("ApprovalDetail")
    return (
        record.get("ApprovalOutcome") == "Refused"
        and isinstance(detail, str)
        and detail.startswith(_NO_DRAIN)
    )


def note_refusals(event_id: str, entry: DrainGrant, answers: Collection[tuple[str, str]]) -> bool:
    """Note the VMs whose agents answered their Prepare with one of `answers`, refusals that
    say they drain nothing (`drains_nothing`); True when the entry changed."""
    refused = [vm for answer, vm in prepare_answers(event_id, entry).items() if answer in answers]
    added = sorted(set(refused) - set(entry.get("no_drain", ())))
    if added:
        entry["no_drain"] = sorted({*entry.get("no_drain", ()), *added})
        log.warning(
            "the agents of %s refused the drain of event %s (Prepare; see their Approval "
            "records): the event is decided without draining them",
            ", ".join(added),
            event_id,
        )
    return bool(added)
