"""The Decision record: the audit trail of every decision the consumer takes, built in one
place (`_record`, typed by the schema's bridge.recordtypes.Decision) for the policy's, a
person's, a failure's and a release's decision about an event (`verdict_record`) and for a
pause or a resume (`pause_record`). Pure: values in, a record out (docs/contracts.md#decision).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from bridge import recordtypes as rt
from bridge.commands.message import Command
from bridge.consumer import documents as fs
from bridge.policy.model import ARM_CARRIER, PERSON_RULE, EventView, Pause, Person, Verdict, VmView
from bridge.records import Origin, VmIdentity, iso, record_id


@dataclass(frozen=True)
class Voice:
    """What every Decision record of one consumer says of it: the policy's source, the
    consumer's host name, and whether it decides in shadow mode."""

    policy_source: str
    host_name: str
    shadow: bool = False


@dataclass(frozen=True)
class _Subject:
    """What a record is about: an event (`view`, and the Resources its document holds) or,
    with no view, what a pause covers, in parentheses (`(fleet)`, `(KIND:VALUE)`)."""

    event_id: str
    resources: list[str]
    view: EventView | None = None


def verdict_record(
    resources: Sequence[str],
    *,
    view: EventView,
    verdict: Verdict,
    action: rt.DecisionAction,
    target: VmView | None,
    command: Command | None,
    voice: Voice,
    now: datetime,
    failing: Sequence[str] = (),
) -> rt.Decision:
    """The record of one decision about the event `view` (`verdict`, said as `action`);
    `resources`: as the event's document holds them; its common fields describe the target
    VM, if any. `failing`: the notification targets failing for good (NotifyFailing)."""
    person, pause = verdict.person, verdict.pause
    attempt = len(view.tried) + 1 if command is not None else 0
    rid = record_id(
        "Decision",
        fs.event_key(view.event_id),
        action,
        verdict.rule,
        verdict.reason,
        verdict.target,
        attempt,
    )
    return _record(
        voice,
        now,
        failing,
        rid,
        _Subject(view.event_id, list(resources), view),
        action=action,
        rule=verdict.rule,
        reason=verdict.reason,
        explanation=verdict.explanation,
        # ARM's acknowledge is no VM: its Approval record says ARM (ApprovalSource).
        target_id=None if verdict.target == ARM_CARRIER else verdict.target,
        target=target,
        command=command,
        attempt=attempt,
        by=person.by if person else None,
        by_reason=person.reason if person else None,
        override=verdict.override,
        asked=verdict.asked,
        ask_deadline=verdict.ask_deadline,
        pause=pause,
    )


def pause_record(
    pause: Pause, *, resumed: bool, voice: Voice, now: datetime, failing: Sequence[str] = ()
) -> rt.Decision:
    """The record of a pause (or of its resume, `resumed`). Its EventId names what it covers,
    in parentheses: `(fleet)` or `(KIND:VALUE)` (docs/contracts.md#decision)."""
    verb = "resumed" if resumed else "paused"
    until = ""
    if not resumed:
        until = f" until {iso(pause.until)}" if pause.until else " until resumed"
    reason = f"{pause.where} {verb} by {pause.by.name}{until}: {pause.reason}; " + (
        "early approvals go on"
        if resumed
        else "no early approval, by the policy or a person, while it lasts"
    )
    action: rt.DecisionAction = "Resume" if resumed else "Pause"
    rid = record_id(
        "Decision", f"({pause.where})", action, iso(pause.at), pause.by.object_id, reason
    )
    return _record(
        voice,
        now,
        failing,
        rid,
        _Subject(f"({pause.where})", []),
        action=action,
        rule=PERSON_RULE,
        reason=reason,
        by=pause.by,
        by_reason=pause.reason,
        pause=replace(pause, until=None) if resumed else pause,
    )


def _record(
    voice: Voice,
    now: datetime,
    failing: Sequence[str],
    rid: str,
    subject: _Subject,
    *,
    action: rt.DecisionAction,
    rule: str,
    reason: str,
    explanation: Sequence[str] = (),
    target_id: str | None = None,
    target: VmView | None = None,
    command: Command | None = None,
    attempt: int = 0,
    by: Person | None = None,
    by_reason: str | None = None,
    override: bool = False,
    asked: str | None = None,
    ask_deadline: datetime | None = None,
    pause: Pause | None = None,
) -> rt.Decision:
    view = subject.view
    return {
        **Origin(identity_of(target), voice.host_name).common("Decision", rid, now),
        rt.RECORD_TYPE: "Decision",
        "EventId": subject.event_id,
        "EventType": view.event_type if view else None,
        "EventSource": view.event_source if view else None,
        "DurationInSeconds": view.duration if view else None,
        "Resources": subject.resources,
        "NotBefore": iso(view.not_before) if view and view.not_before else None,
        "EventStatus": view.status if view else None,
        "DecisionAction": action,
        "DecisionRule": rule,
        "DecisionReason": reason,
        "TargetVmId": target_id,
        "TargetVmName": target.name if target else None,
        "CommandId": command.command_id if command else None,
        "Attempt": attempt,
        "PolicySource": voice.policy_source,
        "DecisionMode": "shadow" if voice.shadow else "normal",
        "DecisionExplanation": "\n".join(explanation) or None,
        # A person's decision, an ask and a pause say more (docs/people.md).
        "DecidedBy": by.object_id if by else None,
        "DecidedByName": by.name if by else None,
        "OperatorReason": by_reason,
        "BudgetOverride": override,
        "AskedTarget": asked,
        "AskDeadline": iso(ask_deadline) if ask_deadline else None,
        "NotifyFailing": list(failing) or None,
        "PauseScope": pause.where if pause else None,
        "PauseUntil": iso(pause.until) if pause and pause.until else None,
    }


def identity_of(vm: VmView | None) -> VmIdentity:
    """A record's VM fields for `vm` as the fleet knows it (none: all unknown)."""
    if vm is None:
        return VmIdentity()
    return VmIdentity(
        vm_id=vm.vm_id,
        vm_name=vm.name,
        subscription_id=vm.subscription_id,
        resource_group=vm.resource_group,
        location=vm.location,
        zone=vm.zone,
        vm_scale_set_name=vm.scale_set,
        platform_fault_domain=vm.fault_domain,
        platform_update_domain=vm.update_domain,
    )
