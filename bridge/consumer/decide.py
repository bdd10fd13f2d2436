"""What deciding an event would do: `plan` returns a Step (a value) or None for nothing.

`plan` is pure: given the event's document, the VMs, its ledger entry and the time, it names
the first thing to write or send, and nothing happens. The decision pass
(bridge.consumer.act) first plans every event on the state it holds (a copy of the event,
the ledger as kept): an event with nothing to do costs nothing more. Only for an event with
a Step is the event read again, planned again on that, and the Steps carried out until the
plan says nothing is left.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from bridge.commands.message import Command
from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer import verdicts
from bridge.consumer.decisionrecord import Voice
from bridge.consumer.ledger import (
    UNREPORTED_TARGET_TIMEOUT,
    LedgerEntry,
    LedgerState,
    ledger_scopes,
    locks_of,
)
from bridge.consumer.release import Alive, all_gone, unreleased
from bridge.consumer.state import Doc
from bridge.policy.evaluation import evaluate
from bridge.policy.model import EventView, FleetView, Policy, Verdict
from bridge.records import iso, parse_time

# --- the Steps ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ended:
    """The event completed or was canceled: its entry no longer counts."""

    key: str


@dataclass(frozen=True)
class Release:
    """Drop the event's ledger entry: `why`. `said`: released by the slot-release rule
    (bridge.consumer.release) though no VM reported its end: the event is marked released
    first and this Decision record says why. `again`: the entry was wrong; the event is
    then decided again on a state read for it."""

    key: str
    why: str
    said: verdicts.Said | None = None
    again: bool = False


@dataclass(frozen=True)
class Unrelease:
    """A VM of the released event spoke again: the release mark comes off."""

    key: str


@dataclass(frozen=True)
class Shrink:
    """The entry stops counting `lapsed`, names no VM of the event's scopes has (`vms`: what
    it counts then); a Decision record says so (`said`)."""

    key: str
    vms: tuple[str, ...]
    why: str
    said: verdicts.Said


@dataclass(frozen=True)
class Grow:
    """The entry counts the event's VMs as they are now (`vms`, `scopes`), taking `locks`."""

    key: str
    vms: tuple[str, ...]
    scopes: list[list[str | None]]
    locks: frozenset[str]


@dataclass(frozen=True)
class NoteStarted:
    """The event Started: it counts against the budgets whether or not we approved it."""

    key: str
    view: EventView
    locks: frozenset[str]


@dataclass(frozen=True)
class Resend:
    """The entry's approval was written but not sent."""

    key: str
    entry: LedgerEntry


@dataclass(frozen=True)
class Apply:
    """Carry out `verdict`: say it (`said`), a decision not said yet; or an approval
    (`approval`: its ledger entry, taking `locks`, then `said`, then its command sent)."""

    view: EventView
    verdict: Verdict
    locks: frozenset[str] | None
    said: verdicts.Said
    approval: verdicts.Approval | None = None


@dataclass(frozen=True)
class Grant:
    """Grant the drains of `verdict.grant` (a Defer whose budgets let the event through): the
    event's slot is taken as an approval takes it (`entry`, origin "granted", under
    `locks`), then `said`, then a Prepare goes to each of those VMs (`prepares`). `again`:
    the entry was written and its Prepares not sent (a failure in between): only the
    sends (no entry, nothing said)."""

    view: EventView
    verdict: Verdict
    locks: frozenset[str]
    prepares: tuple[Command, ...]
    entry: LedgerEntry | None = None
    said: verdicts.Said | None = None
    again: bool = False


Step = Ended | Release | Unrelease | Shrink | Grow | NoteStarted | Resend | Apply | Grant
# After a Step: the event is decided (DONE), the plan goes on from the same reads (NEXT), or
# the ledger changed under us and the event is read and decided again (AGAIN).
Outcome = Literal["done", "next", "again"]
DONE: Outcome = "done"
NEXT: Outcome = "next"
AGAIN: Outcome = "again"


def locks_first(step: Step) -> frozenset[str] | None:
    """The locks the Step's write adds impact under, where it adds any."""
    if isinstance(step, NoteStarted | Grant):
        return step.locks
    if isinstance(step, Apply) and step.verdict.kind == "Approve":
        return step.locks
    return None


# --- planning -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rules:
    """What `plan` decides by, besides the event: the policy, the settings, the budgets'
    group kinds, and since when this process has listened (the release rule waits for a
    whole alive_within after a restart: every VM looks silent until its records come)."""

    policy: Policy
    settings: ConsumerSettings
    kinds: tuple[str, ...]
    listening_since: datetime
    host_name: str  # the consumer's, in its Decision records

    @property
    def alive_within(self) -> timedelta:
        return timedelta(seconds=self.settings.alive_within)

    @property
    def voice(self) -> Voice:
        return Voice(self.policy.source, self.host_name, self.settings.mode == "shadow")


@dataclass(frozen=True)
class Situation:
    """One live event as a decision sees it: its document, the event as the policy sees it,
    the fleet with what impacts it, its ledger entry (None: not counted), which VMs the
    release rule takes as alive (`vouched`), and the notification targets failing for good
    (what its Decision records say in NotifyFailing)."""

    doc: Doc
    view: EventView
    fleet: FleetView
    entry: LedgerEntry | None
    vouched: Alive
    failing: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return self.doc.key

    @property
    def value(self) -> fs.EventDocument:
        return fs.event_document(self.doc)


class _Settled:
    """A check found the event needs nothing (more): `plan` stops there."""


SETTLED = _Settled()
_Check = Callable[[Situation, Rules, datetime], "Step | _Settled | None"]


def ended(doc: Doc, state: LedgerState) -> Ended | None:
    """For an event that completed or was canceled: drop its entry, if it has one."""
    return Ended(doc.key) if doc.key in state.events else None


def plan(s: Situation, rules: Rules, now: datetime) -> Step | None:
    """The first thing deciding the live event `s` does; None when it writes or sends
    nothing. Each check in turn finds a Step, finds the event settled, or goes on."""
    checks: tuple[_Check, ...] = (_over, _freed, _recount, _counted_as_now, _started, _unsent)
    for check in checks:
        found = check(s, rules, now)
        if isinstance(found, _Settled):
            return None
        if found is not None:
            return found
    return _decision(s, rules, now)


def _over(s: Situation, rules: Rules, now: datetime) -> Step | _Settled | None:
    """Whether the event counts no more: released (its VMs are gone, see `_freed`) until one
    of them speaks again, or ended for every VM that can see it (VMs of other scopes that
    still claim it are not heard, fs.Names.witnesses)."""
    if s.doc.value.get("released"):
        return Unrelease(s.key) if unreleased(s.value) else SETTLED
    if s.view.status != fs.GONE:
        return None
    if s.entry is None:
        return SETTLED
    return Release(s.key, "the VMs that can see the event reported it gone")


def _freed(s: Situation, rules: Rules, now: datetime) -> Step | None:
    """The slot-release rule (bridge.consumer.release.all_gone), for an event that counts or
    may: counted, Started, or reported gone by a VM."""
    reports = s.value.get("reporters", {}).values()
    if not (
        s.entry is not None
        or s.view.status == "Started"
        or any(r["status"] == fs.GONE for r in reports)
    ):
        return None
    if now < rules.listening_since + rules.alive_within:
        return None
    if s.view.azure is not None and s.view.azure not in fs.ENDED:
        return None  # Azure itself says the event is on: silence frees nothing (issue 36)
    why = all_gone(
        s.value,
        s.view,
        s.entry,
        s.fleet.vms,
        fleet=s.vouched,
        now=now,
        alive_within=rules.settings.alive_within,
    )
    if why is None:
        return None
    return Release(s.key, why, said=_released(s, rules, why, now))


def _released(s: Situation, rules: Rules, why: str, now: datetime) -> verdicts.Said:
    return verdicts.released(s.value, s.view, why, voice=rules.voice, now=now, failing=s.failing)


def _recount(s: Situation, rules: Rules, now: datetime) -> Step | None:
    """The entry stops counting what no VM that can see the event stands by.

    - A Started entry of an event that no VM that can see it says started: the claim of
      a VM of another scope, read before the event's own reporters (fs.Names.witnesses).
    - The names of the event that no VM of its reporters' scopes has, once
      consumer.unknown_names_for has passed since it was first seen (`view.lapsed`),
      with a Decision record that says so: a VM that keeps repeating a record naming a
      VM that does not exist holds no slot for ever.
    """
    entry, view = s.entry, s.view
    if entry is None:
        return None
    if entry["origin"] == "started" and view.status == "Scheduled":
        return Release(s.key, "no VM that can see the event says it started", again=True)
    lapsed = [name for name in view.lapsed if name in entry["vms"]]
    if not lapsed:
        return None
    why = (
        f"{', '.join(lapsed)}: no VM of that name in the scope of the VMs that can see the "
        f"event has reported since it was first seen at {iso(view.first_seen)}; after "
        f"{rules.settings.unknown_names_for:g} s the name no longer counts"
    )
    kept = tuple(vm for vm in entry["vms"] if vm not in lapsed)
    return Shrink(s.key, kept, why, _released(s, rules, why, now))


def _counted_as_now(s: Situation, rules: Rules, now: datetime) -> Step | None:
    """The entry counts the event's Resources as they are now: an approved event that grew
    counts its new VMs from this pass on, before any other event is approved past them;
    its names no VM is known by, in the scopes of the VMs that can see it now (those of a
    reporter whose identity was not known yet when it was counted are known now)."""
    if s.entry is None:
        return None
    counted = set(s.view.counted)
    grown = counted - set(s.entry["vms"])
    scopes = ledger_scopes(s.view) or s.entry.get("scopes")
    if not grown and scopes == s.entry.get("scopes"):
        return None
    vms = tuple(sorted(counted | set(s.entry["vms"])))
    return Grow(s.key, vms, scopes or [], locks_of(rules.kinds, grown, s.fleet.vms))


def _started(s: Situation, rules: Rules, now: datetime) -> Step | _Settled | None:
    if s.view.status != "Started":
        return None
    if s.entry is not None:
        return SETTLED
    return NoteStarted(s.key, s.view, locks_of(rules.kinds, s.view.counted, s.fleet.vms))


def _unsent(s: Situation, rules: Rules, now: datetime) -> Step | _Settled | None:
    """An entry that needs no new decision: settled once sent, else its approval is sent."""
    entry = s.entry
    timeout = rules.settings.approval_timeout
    if entry is not None and entry["origin"] == "granted":
        # The drains were granted: the approval is decided once they are done.
        return None if entry.get("prepared") else _regrant(s, entry, now)
    if entry is None or needs_decision(entry, now, s.view.reporters, timeout):
        return None
    return SETTLED if entry.get("sent") else Resend(s.key, entry)


def _regrant(s: Situation, entry: LedgerEntry, now: datetime) -> Grant:
    """The Prepares of a granted entry written but not sent, to send again."""
    why = f"drain granted by rule {entry.get('rule')}"
    verdict = Verdict("Defer", str(entry.get("rule")), why, grant=tuple(entry.get("granted", ())))
    prepares = verdicts.prepares(s.doc, s.view, verdict, now)
    return Grant(s.view, verdict, frozenset(), prepares, again=True)


def _decision(s: Situation, rules: Rules, now: datetime) -> Step | None:
    """What the policy decides now, as the values the decision pass stores and sends."""
    verdict = evaluate(rules.policy, s.fleet, s.view, now)
    voice, vms, failing = rules.voice, s.fleet.vms, s.failing
    locks = locks_of(rules.kinds, s.view.counted, vms)
    if verdict.grant:
        entry = verdicts.granted(s.view, verdict, s.entry, now)
        said = verdicts.decided(s.doc, s.view, verdict, vms, voice=voice, now=now, failing=failing)
        prepares = verdicts.prepares(s.doc, s.view, verdict, now)
        return Grant(s.view, verdict, locks, prepares, entry, said)
    if verdict.kind == "Approve" and verdict.target is not None:
        approval, said = verdicts.approval(
            s.doc, s.view, verdict, vms, s.entry, voice=voice, now=now, failing=failing
        )
        return Apply(s.view, verdict, locks, said, approval)
    if not verdicts.new_to_say(s.value, verdict):
        return None
    said = verdicts.decided(s.doc, s.view, verdict, vms, voice=voice, now=now, failing=failing)
    return Apply(s.view, verdict, locks if verdict.kind == "Approve" else None, said)


def needs_decision(
    entry: LedgerEntry, now: datetime, reporters: Collection[str], approval_timeout: float
) -> bool:
    """An approval we sent that was refused, or went unconfirmed for too long: for a
    target among `reporters` (the VMs that report the event) `approval_timeout` seconds,
    for one that has not reported it (asked because the event names it) at most
    UNREPORTED_TARGET_TIMEOUT; not one that came too late (Late: the event went ahead,
    no other VM can approve it)."""
    if entry.get("origin") != "approved" or entry.get("confirmed") or not entry.get("sent"):
        return False
    if entry.get("late"):
        return False
    issued = parse_time(entry.get("issued_at")) or now
    timeout = timedelta(seconds=approval_timeout)
    if entry.get("target") not in reporters:
        timeout = min(timeout, UNREPORTED_TARGET_TIMEOUT)
    return bool(entry.get("refused")) or now - issued >= timeout
