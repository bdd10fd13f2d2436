"""Carrying out a verdict: the ledger entry it needs, the Decision record (the audit trail)
and the signed command to one VM, sent once and resent if a crash came between writing and
sending. The ledger itself is written by the decision pass (bridge.consumer.decide), which
stores the entry `prepare` makes before `announce` and `send`, and marks it sent after.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, cast

from bridge import recordtypes as rt
from bridge.channels import CommandSender
from bridge.commands import message as commands
from bridge.consumer import documents as fs
from bridge.consumer.fleet import Fleet
from bridge.consumer.ledger import Emit, LedgerEntry, impact_of
from bridge.consumer.notices import EVERY_TARGET, NoticeQueue
from bridge.consumer.people.operatorlog import OperatorAction, pause_of
from bridge.consumer.state import Doc
from bridge.notify.notice import Notice, NoticeKind
from bridge.policy.model import ARM_CARRIER, PERSON_RULE, EventView, Policy, Verdict, VmView
from bridge.records import Origin, VmIdentity, iso, parse_time, record_id, vm_key
from bridge.redact import describe

log = logging.getLogger(__name__)
# Seconds a command stays in its channel past its ExpiresAt: an agent reads once more as
# its last Scheduled event leaves, within a poll of the start.
LATE_GRACE = 60.0

# When NotBefore is unknown or past, a command still gets this long to be acted on.
MIN_COMMAND_LIFETIME = timedelta(minutes=2)
# An unsent entry this young is most likely another consumer's, between its ledger write and
# its send: left to it, or every such overlap would send the same command twice.
RESEND_UNSENT_AFTER = timedelta(seconds=10)


@dataclass(frozen=True)
class Approval:
    """An approval ready to be stored in the ledger (`entry`, under `key`) and then sent."""

    key: str
    entry: LedgerEntry
    command: commands.Command
    record: rt.Decision
    view: EventView
    verdict: Verdict


class Dispatch:
    """Turns a verdict into Decision records and commands, and the entry an approval needs."""

    def __init__(
        self,
        fleet: Fleet,
        sender: CommandSender,
        emit: Emit,
        policy: Policy,
        host_name: str,
        *,
        mode: str = "normal",
        notifier: NoticeQueue | None = None,
    ) -> None:
        self.fleet = fleet
        self.notifier = notifier  # None: nobody is notified (an ask still waits for a person)
        self.sender = sender
        self.emit = emit
        self.policy = policy
        self.host_name = host_name
        # Shadow: everything but the send. The entry is marked sent and confirmed at once, as
        # a cooperative agent would confirm it, so the budgets play out as they would.
        self.shadow = mode == "shadow"
        # CommandIds this instance wrote to the ledger and has not yet seen marked sent.
        self._unfinished: set[str] = set()

    def prepare(
        self, event_doc: Doc, view: EventView, verdict: Verdict, vms: Mapping[str, VmView],
        now: datetime,
    ) -> Approval | None:  # fmt: skip
        """The approval `verdict` is, for the caller to store in the ledger; None for any
        other verdict, whose Decision record is said here and now."""
        verdict = with_change(fs.event_document(event_doc).get("decision"), view, verdict, vms)
        action = said_as(verdict)
        if action is None:  # Ignore, which is never said: `would_act` keeps it from the pass
            return None
        decided = (event_doc, view, verdict, action, vms, now)
        if verdict.kind != "Approve" or verdict.target is None:
            self._say(view, verdict, self._decision(*decided, None), event_doc, vms=vms)
            return None
        command = self._command(event_doc, view, verdict, now)
        record = self._decision(*decided, command)
        # The Decision travels with the entry, so a retry after a failed emit still says it.
        entry = _entry(view, verdict, command, now)
        entry["decision"] = record
        return Approval(fs.event_key(view.event_id), entry, command, record, view, verdict)

    def announce(self, approval: Approval, event_doc: Doc, vms: Mapping[str, VmView]) -> None:
        """Say the approval stored in the ledger (its Decision record), before it is sent."""
        self._unfinished.add(approval.command.command_id)
        self._say(approval.view, approval.verdict, approval.record, event_doc, vms=vms)

    @staticmethod
    def would_act(event_doc: Doc, verdict: Verdict) -> bool:
        """Whether `apply` would write or send anything for `verdict`: an approval, or a
        decision other than the one the event stands on (a standing decision is said once)."""
        if said_as(verdict) is None:
            return False
        if verdict.kind == "Approve" and verdict.target is not None:
            return True
        return fs.standing(fs.event_document(event_doc)) != _said(verdict)

    def unsent(self, key: str, entry: LedgerEntry, now: datetime) -> commands.Command | None:
        """A failure between the ledger write and the send left a command unsent: the
        command to send again (its Decision said again too, same RecordId, in case it was
        the emit that failed); None when it is not to be resent (yet)."""
        if entry.get("origin") != "approved" or entry.get("sent") or not entry.get("command"):
            return None
        issued = parse_time(entry.get("issued_at"))
        ours = entry.get("command_id") in self._unfinished
        if not ours and issued is not None and now - issued < RESEND_UNSENT_AFTER:
            return None
        log.info("resending the approval of event %s, which was decided but not sent", key)
        if "decision" in entry:
            self.emit([entry["decision"]])
        return commands.parse(entry["command"])

    def send(self, command: commands.Command, now: datetime) -> None:
        """Send `command` (not in shadow mode); a failure leaves its entry unsent: the next
        pass sends it again."""
        # Past its ExpiresAt (the event's NotBefore, when the platform starts the event) the
        # command stays a while, so an agent that reads it after the event went ahead says Late.
        ttl = max(0.0, (command.expires_at - now).total_seconds()) + LATE_GRACE
        if not self.shadow:
            self.sender.send(command, ttl)

    def sent(self, command: commands.Command) -> None:
        """`command`'s entry is marked sent."""
        self._unfinished.discard(command.command_id)
        log.info("%s the approval of event %s to VM %s (%s)",
                 "shadow mode: did not send" if self.shadow else "sent", command.event_id,
                 command.vm_id, command.reason)  # fmt: skip

    def prepares(
        self, event_doc: Doc, view: EventView, verdict: Verdict, now: datetime
    ) -> list[commands.Command]:
        """The Prepare commands that grant the drains of `verdict.grant`, one a VM."""
        return [self._command(event_doc, view, replace(verdict, target=vm), now, kind="Prepare")
                for vm in verdict.grant]  # fmt: skip

    def granted(self, command: commands.Command) -> None:
        """`command`, a Prepare, was sent."""
        log.info("%s the drain of event %s to VM %s (Prepare: %s)",
                 "shadow mode: did not grant" if self.shadow else "granted", command.event_id,
                 command.vm_id, command.reason)  # fmt: skip

    @staticmethod
    def _command(
        event_doc: Doc,
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
            document_incarnation=event_doc.value.get("incarnation"),
            issued_at=now,
            expires_at=expires or now + MIN_COMMAND_LIFETIME,
            rule=verdict.rule,
            reason=verdict.reason,
            resources=[str(r) for r in view.resources],
        )

    def _decision(  # noqa: PLR0917 - one decision in full
        self,
        event_doc: Doc,
        view: EventView,
        verdict: Verdict,
        action: rt.DecisionAction,
        vms: Mapping[str, VmView],
        now: datetime,
        command: commands.Command | None,
    ) -> rt.Decision:
        return decision_record(
            event_doc.value,
            view=view,
            verdict=verdict,
            action=action,
            target=vms.get(verdict.target) if verdict.target else None,
            command=command,
            policy_source=self.policy.source,
            host_name=self.host_name,
            now=now,
            shadow=self.shadow,
            notify_failing=self.failing(),
        )

    def failing(self) -> list[str] | None:
        """The notification targets failing for good now (NotifyFailing); None when none."""
        return list(self.notifier.failing()) or None if self.notifier is not None else None

    def notify(self, notice: Notice) -> None:
        """Hand `notice` to the notifier, which never blocks; a notifier that breaks does
        not stop a decision."""
        # A shadow consumer tells nobody: people answer the live one, which asks them too.
        if self.notifier is None or self.shadow:
            return
        every = notice.target == EVERY_TARGET
        try:
            for target in self.notifier.targets if every else (notice.target,):
                self.notifier.notify(replace(notice, target=target))
        except Exception as err:
            log.error("the %s notice about %s to %s could not be queued: %s", notice.kind,
                      notice.event_id or "the fleet", notice.target,
                      describe(err, with_type=True))  # fmt: skip

    def operated(self, action: OperatorAction, now: datetime) -> None:
        """Say a pause or a resume a person made: a Decision record and a notice."""
        record = operator_record(action, policy_source=self.policy.source,
                                 host_name=self.host_name, now=now, shadow=self.shadow,
                                 notify_failing=self.failing())  # fmt: skip
        self.emit([record])
        log.warning("%s: %s by %s (%s): %s", record["EventId"], record["DecisionAction"],
                    action.by.name, action.by.object_id, record["DecisionReason"])  # fmt: skip
        self.notify(Notice("paused" if action.kind == "pause" else "resumed", EVERY_TARGET,
                           None, None, (), None, (record["DecisionReason"],),
                           action.by.name, action.reason, None,
                           now))  # fmt: skip

    def _told(self, view: EventView, verdict: Verdict, before: fs.EventDocument | None,
              at: datetime) -> None:  # fmt: skip
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
        elif person is not None and verdict.kind in ("Approve", "Hold"):
            kind = "held" if verdict.kind == "Hold" else "override" if verdict.override else (
                "approved")  # fmt: skip
            target = asked or EVERY_TARGET
        if verdict.override and person is not None:
            log.warning("event %s (%s) approved by %s OVER A FULL BUDGET (break-glass): %s",
                        view.event_id, view.event_type, person.by.who, person.reason)  # fmt: skip
        if kind is None:
            return
        self.notify(Notice(kind, target or EVERY_TARGET, view.event_id, view.event_type,
                           tuple(view.resources), view.not_before, verdict.explanation,
                           person.by.name if person else None, person.reason if person else None,
                           None, at))  # fmt: skip

    def failed(self, event: fs.EventDocument, err: Exception, now: datetime) -> None:
        """Say (once while it lasts) that deciding `event` failed: a Defer by rule (error)."""
        reason = _valid_text(
            f"deciding the event failed ({describe(err, with_type=True)}): deferred, and tried "
            "again at every pass; other events are decided meanwhile"
        )
        view = _bare_view(event, now)
        verdict = Verdict("Defer", ERROR_RULE, reason)
        if fs.standing(event) == _said(verdict):
            return
        record = decision_record(_valid(event), view=view, verdict=verdict, action="Defer",
                                 target=None, command=None, policy_source=self.policy.source,
                                 host_name=self.host_name, now=now,
                                 shadow=self.shadow)  # fmt: skip
        self._say(view, verdict, record)

    def released(self, view: EventView, why: str, now: datetime) -> None:
        """Say that the event's budget slot was released though no VM reported its end."""
        verdict = Verdict("Release", RELEASE_RULE, why)
        event = self.fleet.event(fs.event_key(view.event_id))
        record = decision_record(event.value if event else {}, view=view, verdict=verdict,
                                 action="Release", target=None, command=None,
                                 policy_source=self.policy.source, host_name=self.host_name,
                                 now=now, shadow=self.shadow)  # fmt: skip
        self._say(view, verdict, record)

    def _say(
        self,
        view: EventView,
        verdict: Verdict,
        record: rt.Decision,
        event_doc: Doc | None = None,
        *,
        vms: Mapping[str, VmView] | None = None,
    ) -> None:
        """Emit the Decision record, then remember it so a standing decision is not repeated.

        `event_doc`: the event as just read, most likely current: written over without
        reading it again (if it changed since, the write conflicts and it is read again).
        `vms`: the policy decided on `view` and these VMs: what it saw is kept, for a later
        decision that differs to tell what changed (`with_change`).
        """
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

        def remember(value: dict[str, Any]) -> bool:
            # The first ask is when its deadline counts from (EventView.asked_at).
            asks = verdict.kind == "Ask" and verdict.asked and "asked" not in value
            if asks:
                value["asked"] = {"at": record["TimeGenerated"], "target": verdict.asked}
            if fs.standing(cast(fs.EventDocument, value)) == _said(verdict):
                return bool(asks)
            value["decision"] = said
            return True

        before = fs.event_document(event_doc) if event_doc is not None else None
        self.emit([record])
        self.fleet.remember(fs.event_key(view.event_id), remember, event_doc)
        self._told(view, verdict, before, parse_time(record["TimeGenerated"]) or view.first_seen)
        log.info("event %s (%s): %s by rule %s: %s", view.event_id, view.event_type,
                 verdict.kind, verdict.rule, verdict.reason)  # fmt: skip


ERROR_RULE = "(error)"
RELEASE_RULE = "(released)"


def said_as(verdict: Verdict) -> rt.DecisionAction | None:
    """The DecisionAction `verdict` is said as; None for Ignore (an event that is no longer
    Scheduled), which is never said: no Decision record is made of it."""
    return None if verdict.kind == "Ignore" else verdict.kind


def _said(verdict: Verdict) -> tuple[str, str, str]:
    """What tells one decision from another (`documents.standing`)."""
    return verdict.kind, verdict.rule, verdict.reason


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
    line = (f"changed from {before.get('kind')} by {before.get('rule')} (decided at "
            f"{before.get('at', 'an earlier pass')}): {what}")  # fmt: skip
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
    added = [v for v in view.affected
             if v not in before.get("affected", ()) and vm_key(name(v)) not in since]  # fmt: skip
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
        changes.append(f"{', '.join(lost)} no longer {_s(len(lost), 'resolves', 'resolve')} to one "
                       "known VM")  # fmt: skip
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
        changes.append(f"{reporters} more {_s(reporters, 'VM reports', 'VMs report')} "
                       "the event")  # fmt: skip
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


def _valid(event: fs.EventDocument) -> dict[str, Any]:
    resources = [_valid_text(str(r)) for r in event.get("resources") or []]
    return {"resources": resources}


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


def _entry(
    view: EventView, verdict: Verdict, command: commands.Command, now: datetime
) -> LedgerEntry:
    assert verdict.target is not None
    return {
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
    }


def decision_record(
    event: Mapping[str, Any],
    *,
    view: EventView,
    verdict: Verdict,
    action: rt.DecisionAction,
    target: VmView | None,
    command: commands.Command | None,
    policy_source: str,
    host_name: str,
    now: datetime,
    shadow: bool = False,
    notify_failing: list[str] | None = None,
) -> rt.Decision:
    """The audit trail of one decision (`verdict`, said as `action`); its common fields
    describe the target VM, if any."""
    person, pause = verdict.person, verdict.pause
    attempt = len(view.tried) + 1 if command is not None else 0
    rid = record_id("Decision", fs.event_key(view.event_id), action, verdict.rule,
                    verdict.reason, verdict.target, attempt)  # fmt: skip
    return {
        **Origin(_identity(target), host_name).common("Decision", rid, now),
        rt.RECORD_TYPE: "Decision",
        "EventId": view.event_id,
        "EventType": view.event_type,
        "EventSource": view.event_source,
        "DurationInSeconds": view.duration,
        "Resources": list(event.get("resources") or []),
        "NotBefore": iso(view.not_before) if view.not_before else None,
        "EventStatus": view.status,
        "DecisionAction": action,
        "DecisionRule": verdict.rule,
        "DecisionReason": verdict.reason,
        # ARM's acknowledge is no VM: its Approval record says ARM (ApprovalSource).
        "TargetVmId": None if verdict.target == ARM_CARRIER else verdict.target,
        "TargetVmName": target.name if target else None,
        "CommandId": command.command_id if command else None,
        "Attempt": attempt,
        "PolicySource": policy_source,
        "DecisionMode": "shadow" if shadow else "normal",
        "DecisionExplanation": "\n".join(verdict.explanation) or None,
        # A person's decision, an ask and a pause say more (docs/people.md).
        "DecidedBy": person.by.object_id if person else None,
        "DecidedByName": person.by.name if person else None,
        "OperatorReason": person.reason if person else None,
        "BudgetOverride": verdict.override,
        "AskedTarget": verdict.asked,
        "AskDeadline": iso(verdict.ask_deadline) if verdict.ask_deadline else None,
        "NotifyFailing": notify_failing,
        "PauseScope": pause.where if pause else None,
        "PauseUntil": iso(pause.until) if pause and pause.until else None,
    }


def operator_record(
    action: OperatorAction,
    *,
    policy_source: str,
    host_name: str,
    now: datetime,
    shadow: bool = False,
    notify_failing: list[str] | None = None,
) -> rt.Decision:
    """The Decision record of a pause or a resume. Its EventId names what it covers, in
    parentheses: `(fleet)` or `(KIND:VALUE)` (docs/contracts.md#decision)."""
    pause = pause_of(action)
    verb = "paused" if action.kind == "pause" else "resumed"
    until = ""
    if action.kind == "pause":
        until = f" until {iso(pause.until)}" if pause.until else " until resumed"
    reason = (f"{pause.where} {verb} by {action.by.name}{until}: {action.reason}; "
              + ("no early approval, by the policy or a person, while it lasts"
                 if action.kind == "pause" else "early approvals go on"))  # fmt: skip
    action_name: rt.DecisionAction = "Pause" if action.kind == "pause" else "Resume"
    rid = record_id("Decision", f"({pause.where})", action_name, iso(action.at),
                    action.by.object_id, reason)  # fmt: skip
    return {
        **Origin(VmIdentity(), host_name).common("Decision", rid, now),
        rt.RECORD_TYPE: "Decision",
        "EventId": f"({pause.where})",
        "EventType": None,
        "EventSource": None,
        "DurationInSeconds": None,
        "Resources": [],
        "NotBefore": None,
        "EventStatus": None,
        "DecisionAction": action_name,
        "DecisionRule": PERSON_RULE,
        "DecisionReason": reason,
        "TargetVmId": None,
        "TargetVmName": None,
        "CommandId": None,
        "Attempt": 0,
        "PolicySource": policy_source,
        "DecisionMode": "shadow" if shadow else "normal",
        "DecisionExplanation": None,
        "DecidedBy": action.by.object_id,
        "DecidedByName": action.by.name,
        "OperatorReason": action.reason,
        "BudgetOverride": False,
        "AskedTarget": None,
        "AskDeadline": None,
        "NotifyFailing": notify_failing,
        "PauseScope": pause.where,
        "PauseUntil": iso(pause.until) if action.kind == "pause" and pause.until else None,
    }


def _identity(vm: VmView | None) -> VmIdentity:
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
