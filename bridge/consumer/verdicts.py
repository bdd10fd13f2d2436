"""What a decision comes to, as values: the Decision record and what saying it leaves on its
event (`Said`), and for an approval the ledger entry and the command to send (`Approval`),
for a grant the entry and the Prepare commands.

Pure: `plan` (bridge.consumer.decide) builds them on what it was given; the decision pass
(bridge.consumer.act) stores the entry, says the record and sends the commands through
bridge.consumer.dispatch, which only carries them out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, cast

from bridge import recordtypes as rt
from bridge.commands import message as commands
from bridge.consumer import documents as fs
from bridge.consumer.decisionrecord import Voice, verdict_record
from bridge.consumer.drains import grant, keep_grants
from bridge.consumer.ledger import LedgerEntry, impact_of
from bridge.consumer.notices import EVERY_TARGET
from bridge.consumer.state import Doc
from bridge.notify.notice import Notice, NoticeKind
from bridge.policy.model import PERSON_RULE, EventView, Verdict, VmView
from bridge.records import iso, parse_time, vm_key
from bridge.redact import describe

# When NotBefore is unknown or past, a command still gets this long to be acted on.
MIN_COMMAND_LIFETIME = timedelta(minutes=2)
ERROR_RULE = "(error)"
RELEASE_RULE = "(released)"


@dataclass(frozen=True)
class Said:
    """A decision about the event `key`, to say: its Decision record, the decision the event
    then stands on (`standing`, said once), the person first asked (`asks`), the notice it
    gives and the warning it logs, if any."""

    key: str
    record: rt.Decision
    standing: fs.StandingDecision
    asks: str | None = None
    notice: Notice | None = None
    warning: str | None = None

    def remember(self, value: dict[str, Any]) -> bool:
        """Change the event document `value` as saying the decision does; True if it changed."""
        # The first ask is when its deadline counts from (EventView.asked_at).
        asks = self.asks is not None and "asked" not in value
        if asks:
            value["asked"] = {"at": self.record["TimeGenerated"], "target": self.asks}
        held = fs.standing(cast(fs.EventDocument, value))
        if held == (self.standing["kind"], self.standing["rule"], self.standing["reason"]):
            return asks
        value["decision"] = dict(self.standing)
        return True


@dataclass(frozen=True)
class Approval:
    """An approval to store in the ledger (`entry`, under `key`), then to send (`command`)."""

    key: str
    entry: LedgerEntry
    command: commands.Command


def said_as(verdict: Verdict) -> rt.DecisionAction | None:
    """The DecisionAction `verdict` is said as; None for Ignore (an event that is no longer
    Scheduled), which is never said: no Decision record is made of it."""
    return None if verdict.kind == "Ignore" else verdict.kind


def _said(verdict: Verdict) -> tuple[str, str, str]:
    """What tells one decision from another (`documents.standing`)."""
    return verdict.kind, verdict.rule, verdict.reason


def new_to_say(event: fs.EventDocument, verdict: Verdict) -> bool:
    """Whether `verdict` is a decision the event does not stand on yet (one is said once);
    never an Ignore."""
    return said_as(verdict) is not None and fs.standing(event) != _said(verdict)


def decided(
    doc: Doc,
    view: EventView,
    verdict: Verdict,
    vms: Mapping[str, VmView],
    *,
    voice: Voice,
    now: datetime,
    failing: Sequence[str] = (),
    command: commands.Command | None = None,
) -> Said:
    """The policy's (or a person's) `verdict` on the event of `doc`, taken on `view` and
    the VMs `vms`, to say; `command`: the approval's, when it is one."""
    event = fs.event_document(doc)
    verdict = with_change(event.get("decision"), view, verdict, vms)
    action = said_as(verdict)
    assert action is not None, "an Ignore is never said (`new_to_say`)"
    target = vms.get(verdict.target) if verdict.target else None
    record = verdict_record(
        event.get("resources") or [],
        view=view,
        verdict=verdict,
        action=action,
        target=target,
        command=command,
        voice=voice,
        now=now,
        failing=failing,
    )
    at = parse_time(record["TimeGenerated"]) or view.first_seen
    asks = verdict.asked if verdict.kind == "Ask" and verdict.asked else None
    return Said(
        fs.event_key(view.event_id),
        record,
        _standing(view, verdict, record, vms),
        asks,
        _notice(view, verdict, event, at),
        _warning(view, verdict),
    )


def approval(
    doc: Doc,
    view: EventView,
    verdict: Verdict,
    vms: Mapping[str, VmView],
    entry: LedgerEntry | None,
    *,
    voice: Voice,
    now: datetime,
    failing: Sequence[str] = (),
) -> tuple[Approval, Said]:
    """The approval `verdict` (an Approve with a target) of the event of `doc`, its ledger
    entry being `entry` now (None: not counted), and its Decision record."""
    command = _command(doc, view, verdict, now)
    said = decided(doc, view, verdict, vms, voice=voice, now=now, failing=failing, command=command)
    assert verdict.target is not None
    new: LedgerEntry = {
        **impact_of(view),
        "origin": "approved",
        "target": verdict.target,
        "attempt": len(view.tried) + 1,
        "tried": [*view.tried, verdict.target],
        "rule": verdict.rule,
        "command_id": command.command_id,
        "command": command.to_json(),
        "issued_at": iso(now),
        "sent": False,
        # The Decision travels with the entry, so a retry after a failed emit still says it.
        "decision": said.record,
    }
    keep_grants(entry, new)
    return Approval(said.key, new, command), said


def granted(
    view: EventView, verdict: Verdict, entry: LedgerEntry | None, now: datetime
) -> LedgerEntry:
    """The ledger entry that takes the event's slot for the drains `verdict.grant`, as an
    approval takes it; `entry`: the event's now (None: not counted). A new value."""
    if entry is None:
        new: LedgerEntry = {
            **impact_of(view),
            "origin": "granted",
            "rule": verdict.rule,
            "issued_at": iso(now),
        }
    else:
        new = cast(LedgerEntry, dict(entry))
    grant(new, verdict.grant)
    new["vms"] = sorted({*new["vms"], *view.counted})
    return new


def prepares(
    doc: Doc, view: EventView, verdict: Verdict, now: datetime
) -> tuple[commands.Command, ...]:
    """The Prepare commands that grant the drains of `verdict.grant`, one a VM."""
    return tuple(
        _command(doc, view, replace(verdict, target=vm), now, kind="Prepare")
        for vm in verdict.grant
    )


def failure(
    event: fs.EventDocument,
    err: Exception,
    *,
    voice: Voice,
    now: datetime,
    failing: Sequence[str] = (),
) -> Said | None:
    """That deciding `event` failed (a Defer by rule (error)); None while the event
    stands on it already (said once while it lasts)."""
    reason = _valid_text(
        f"deciding the event failed ({describe(err, with_type=True)}): deferred, and tried "
        "again at every pass; other events are decided meanwhile"
    )
    view = _bare_view(event, now)
    verdict = Verdict("Defer", ERROR_RULE, reason)
    if fs.standing(event) == _said(verdict):
        return None
    resources = [_valid_text(str(r)) for r in event.get("resources") or []]
    return _said_alone(resources, view, verdict, "Defer", voice=voice, now=now, failing=failing)


def released(
    event: fs.EventDocument,
    view: EventView,
    why: str,
    *,
    voice: Voice,
    now: datetime,
    failing: Sequence[str] = (),
) -> Said:
    """That the event's budget slot was released though no VM reported its end (`why`)."""
    verdict = Verdict("Release", RELEASE_RULE, why)
    resources = event.get("resources") or []
    return _said_alone(resources, view, verdict, "Release", voice=voice, now=now, failing=failing)


def _said_alone(
    resources: Sequence[str],
    view: EventView,
    verdict: Verdict,
    action: rt.DecisionAction,
    *,
    voice: Voice,
    now: datetime,
    failing: Sequence[str],
) -> Said:
    """A decision that targets no VM and sends nothing, said as `action`."""
    record = verdict_record(
        resources,
        view=view,
        verdict=verdict,
        action=action,
        target=None,
        command=None,
        voice=voice,
        now=now,
        failing=failing,
    )
    return Said(fs.event_key(view.event_id), record, _standing(view, verdict, record))


def _standing(
    view: EventView, verdict: Verdict, record: rt.Decision, vms: Mapping[str, VmView] | None = None
) -> fs.StandingDecision:
    """The decision the event stands on once `record` is said. `vms`: the policy decided on
    `view` and these VMs: what it saw is kept, for a later decision that differs to tell
    what changed (`with_change`)."""
    said: fs.StandingDecision = {
        "kind": verdict.kind,
        "rule": verdict.rule,
        "reason": verdict.reason,
        "at": record["TimeGenerated"],
        "explanation": (record["DecisionExplanation"] or "").splitlines(),
    }
    if verdict.target is not None:
        said["target"] = verdict.target
    if verdict.override:
        said["override"] = True
    if vms is not None:
        said["affected"] = list(view.affected)
        said["unresolved"] = list(view.unresolved)
        said["ready"] = sorted(view.ready)
        said["reporters"] = len(view.reporters)
        said["no_hook"] = _without_hook(view, vms)
    return said


def _notice(
    view: EventView, verdict: Verdict, before: fs.EventDocument | None, at: datetime
) -> Notice | None:
    """The notice a decision gives, if any: an ask, its time out, a person's decision."""
    was = (before or {}).get("decision", {}).get("kind")
    asked = (before or {}).get("asked", {}).get("target")
    person = verdict.person
    kind: NoticeKind | None = None
    target = None
    if verdict.kind == "Ask" and was != "Ask":
        kind, target = "asked", verdict.asked
    elif verdict.asked and was == "Ask" and person is None:
        kind, target = "timed_out", verdict.asked
    elif verdict.notify and was is None:  # a Spot rebalance recommendation, told once
        kind, target = "rebalance", verdict.notify
    elif person is not None and verdict.kind in ("Approve", "Hold"):
        kind = (
            "held" if verdict.kind == "Hold" else "override" if verdict.override else ("approved")
        )
        target = asked or EVERY_TARGET
    if kind is None:
        return None
    return Notice(
        kind,
        target or EVERY_TARGET,
        view.event_id,
        view.event_type,
        tuple(view.resources),
        view.not_before,
        verdict.explanation,
        person.by.name if person else None,
        person.reason if person else None,
        None,
        at,
    )


def _warning(view: EventView, verdict: Verdict) -> str | None:
    person = verdict.person
    if not verdict.override or person is None:
        return None
    return (
        f"event {view.event_id} ({view.event_type}) approved by {person.by.who} OVER A "
        f"FULL BUDGET (break-glass): {person.reason}"
    )


def _command(
    doc: Doc,
    view: EventView,
    verdict: Verdict,
    now: datetime,
    *,
    kind: commands.CommandType = "Approve",
) -> commands.Command:
    assert verdict.target is not None
    expires = view.not_before if view.not_before and view.not_before > now else None
    return commands.approve(
        kind=kind,
        vm_id=verdict.target,
        event_id=view.event_id,
        document_incarnation=doc.value.get("incarnation"),
        issued_at=now,
        expires_at=expires or now + MIN_COMMAND_LIFETIME,
        rule=verdict.rule,
        reason=verdict.reason,
        resources=[str(r) for r in view.resources],
    )


def with_change(
    before: fs.StandingDecision | None, view: EventView, verdict: Verdict, vms: Mapping[str, VmView]
) -> Verdict:
    """`verdict` with a first line saying what changed since the decision `before`, when it
    changes its action or rule: a decision taken on the first report of a neighbour (the
    VMs the event names not heard from yet) is then told from one taken on what they said.
    """
    if before is None or (before.get("kind"), before.get("rule")) == (verdict.kind, verdict.rule):
        return verdict
    if "affected" not in before:  # a failure, a release, or a document older than the facts
        what = "the facts it was decided on were not kept"
    else:
        what = "; ".join(_changes(before, view, verdict, vms)) or (
            "nothing the event's VMs said changed: the budgets, the live VMs or the time did"
        )
    line = (
        f"changed from {before.get('kind')} by {before.get('rule')} (decided at "
        f"{before.get('at', 'an earlier pass')}): {what}"
    )
    return replace(verdict, explanation=(line, *verdict.explanation))


def _changes(
    before: fs.StandingDecision, view: EventView, verdict: Verdict, vms: Mapping[str, VmView]
) -> list[str]:
    def name(vm_id: str) -> str:
        return vms[vm_id].name if vm_id in vms else vm_id

    def names(ids: Iterable[str]) -> str:
        return ", ".join(name(v) for v in ids)

    then = list(before.get("unresolved", ()))
    resolved = [n for n in then if n not in view.unresolved]
    lost = [n for n in view.unresolved if n not in then]
    # A VM the event names now that it did not then, other than a name resolved since.
    since = {vm_key(n) for n in resolved}
    added = [
        v
        for v in view.affected
        if v not in before.get("affected", ()) and vm_key(name(v)) not in since
    ]
    ready = sorted(view.ready - set(before.get("ready", ())))
    reporters = len(view.reporters) - before.get("reporters", 0)
    hookless = set(_without_hook(view, vms))
    hooked = [v for v in before.get("no_hook", ()) if v in view.affected and v not in hookless]
    unhooked = sorted(hookless - set(before.get("no_hook", ())))
    changes = []
    if resolved:
        now = _s(len(resolved), "resolves to a known VM", "resolve to known VMs")
        changes.append(f"{', '.join(resolved)} now {now}")
    if lost:
        changes.append(
            f"{', '.join(lost)} no longer {_s(len(lost), 'resolves', 'resolve')} to one known VM"
        )
    if added:
        changes.append(f"the event now also names {names(added)}")
    drained = [v for v in ready if v in view.drains]
    hooked_ready = [v for v in ready if v not in view.drains]
    if hooked_ready:
        changes.append(f"the prepare hook succeeded on {names(hooked_ready)}")
    if drained:
        changes.append(f"the drain finished on {names(drained)}")
    for vm_ids, when in ((hooked, "no longer"), (unhooked, "now")):
        if vm_ids:
            says = _s(len(vm_ids), "says it has", "say they have")
            changes.append(f"{names(vm_ids)} {when} {says} no prepare hook")
    if reporters > 0:
        changes.append(f"{reporters} more {_s(reporters, 'VM reports', 'VMs report')} the event")
    if verdict.person is not None and before.get("rule") != PERSON_RULE:
        changes.append(f"{verdict.person.by.who} decided: {verdict.person.kind}")
    elif verdict.rule != before.get("rule"):
        changes.append(f"rule {verdict.rule} matches now, {before.get('rule')} did then")
    return changes


def _without_hook(view: EventView, vms: Mapping[str, VmView]) -> list[str]:
    """The VMs of the event whose agents say they have no prepare hook."""
    return [v for v in view.affected if v in vms and vms[v].prepare_hook is False]


def _s(count: int, one: str, more: str) -> str:
    return one if count == 1 else more


def _valid_text(text: str) -> str:
    """`text` as valid Unicode: a lone surrogate (which broke the decision) becomes U+FFFD."""
    return text.encode("utf-8", errors="replace").decode("utf-8")


def _bare_view(event: fs.EventDocument, now: datetime) -> EventView:
    """The event as its document says, without the fleet: enough for a Decision record."""
    duration = event.get("duration")
    return EventView(
        event_id=_valid_text(str(event.get("event_id"))),
        event_type=_valid_text(str(event.get("event_type") or "")),
        event_source=_valid_text(str(event.get("event_source") or "")) or None,
        duration=duration if isinstance(duration, int) else None,
        status=fs.status(event),
        not_before=parse_time(event.get("not_before")),
        first_seen=parse_time(event.get("first_seen")) or now,
        affected=(),
    )
