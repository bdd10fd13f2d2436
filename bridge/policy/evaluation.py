"""The policy's decision for one event: `evaluate(policy, fleet, event, now)`.

It looks at one event and the fleet as the consumer knows it and returns a Verdict: approve it
now (and through which VM), defer it (look again later: a budget is full, hooks are not ready,
the window is closed), or hold it (let NotBefore arrive). It does no I/O and reads no clock: the
same inputs always give the same verdict, which is what the table-driven and property tests
rely on.

The order is the whole of it: the first rule that matches (bridge.policy.matching), a person's
decision before any rule (gates.person), then the rule's gate (gates.ready, gates.window,
gates.ask, and gates.drain for every approving action), the pauses (gates.pause), the budgets
(bridge.policy.budgets) and the VM that carries the approval (bridge.policy.carrier). Each gate
returns None to let the event through, or the Verdict that stops it, and says why in the
explanation's lines. A Spot rebalance recommendation (`EventView.advisory`) goes to
gates.rebalance alone, before any rule or person: it is never approved.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from bridge.policy.budgets import check_budgets
from bridge.policy.carrier import carrier_name, choose_target
from bridge.policy.gates import ask, drain, pause, person, ready, rebalance, window
from bridge.policy.matching import mismatch
from bridge.policy.model import (
    ARM_CARRIER,
    NO_RULE,
    EventView,
    FleetView,
    Policy,
    Rule,
    Verdict,
)
from bridge.policy.wording import explained, listed, node_names


def evaluate(policy: Policy, fleet: FleetView, event: EventView, now: datetime) -> Verdict:  # noqa: PLR0911
    """The decision for `event` now, with its explanation; pure."""
    if event.status.lower() != "scheduled":
        why = f"the event is {event.status}: nothing to approve"
        return Verdict("Ignore", NO_RULE, why, explanation=(why,))
    notes: list[str] = [f"agents and Event Grid disagree: {line}" for line in event.disagreements]
    if event.advisory:  # before any rule or person: an advisory is never approved
        return rebalance.check(policy, fleet, event, now, notes)
    rule = None
    for candidate in policy.rules:
        miss = mismatch(candidate.match, fleet, event)
        if miss is None:
            rule = candidate
            notes.append(f"rule {candidate.name}: matches; its action is {_action(candidate)}")
            break
        notes.append(f"rule {candidate.name}: does not match: {miss}")
    if event.person is not None:
        return person.check(policy, fleet, event, event.person, now, notes)
    if rule is None:
        return explained(
            Verdict("Hold", NO_RULE, "no rule matches: the event starts at NotBefore"), notes
        )
    gate = _gate(rule, fleet, event, now, notes)
    if gate is not None and not gate.grant:
        notes.append(f"{rule.action.kind.replace('_', ' ')}: {gate.reason}")
        return explained(gate, notes)
    # An ask its deadline let through (nobody answered, on_deadline approve) says so.
    asked = rule.action.target if rule.action.kind == "ask" else None
    # A pause stops a drain's grant as it stops an approval: both start taking VMs down early.
    paused = pause.check(fleet, event, now, rule.name, notes)
    if paused is not None:
        return replace(paused, asked=asked, ask_deadline=ask.ends_at(rule.action, event, now))
    if gate is not None:
        notes.append(f"{rule.action.kind.replace('_', ' ')}: {gate.reason}")
        return replace(_granting(policy, rule, fleet, event, now, gate, notes), asked=asked)
    blocked = check_budgets(policy.budgets, fleet, event, now, notes=notes)
    if blocked is not None:
        kind, why = blocked
        return explained(Verdict(kind, rule.name, why, asked=asked), notes)
    target = choose_target(fleet, event, now)
    if target is None:
        why = "no live VM reports the event to carry the approval"
        return explained(Verdict("Defer", rule.name, why, asked=asked), [*notes, why])
    verdict = Verdict(
        "Approve", rule.name, _approve_reason(rule, fleet, target), target, asked=asked
    )
    through = f"approval sent through {carrier_name(fleet, target)}"
    if target not in event.reporters and target != ARM_CARRIER:
        through += (
            f" ({fleet.vms[target].name} has not reported the event yet: the event names it and "
            "it is alive, so it sees the event at its next poll and reads its queue at once)"
        )
    return explained(verdict, [*notes, through])


def _granting(  # noqa: PLR0917 - the evaluation's state, handed on
    policy: Policy,
    rule: Rule,
    fleet: FleetView,
    event: EventView,
    now: datetime,
    gate: Verdict,
    notes: list[str],
) -> Verdict:
    """`gate` waits for drains not granted yet (`gate.grant`): granted now if the budgets let
    the event through, as an approval would be (the drain takes the capacity away)."""
    blocked = check_budgets(policy.budgets, fleet, event, now, notes=notes)
    if blocked is not None:
        kind, why = blocked
        return explained(Verdict(kind, rule.name, why, recheck_at=gate.recheck_at), notes)
    nodes = listed("drain granted on {names}; waiting for it", node_names(fleet, gate.grant))[0]
    notes.append(nodes)
    return explained(replace(gate, reason=nodes), notes)


def _action(rule: Rule) -> str:
    action = rule.action
    if action.kind == "approve_when_ready" and action.deadline is not None:
        return f"approve when ready (deadline {action.deadline}, then {action.on_deadline})"
    if action.kind == "ask":
        deadline = (
            f"deadline {action.deadline}, then {action.on_deadline}"
            if action.deadline
            else "until NotBefore"
        )
        return f"ask {action.target} ({deadline})"
    return action.kind.replace("_", " ")


def _gate(
    rule: Rule, fleet: FleetView, event: EventView, now: datetime, notes: list[str]
) -> Verdict | None:
    """Hold or Defer when the rule's action does not allow approval yet; None when it does
    (a gate that lets the event through with something to say adds it to `notes`)."""
    action = rule.action
    if action.kind == "hold":
        return Verdict("Hold", rule.name, f"rule {rule.name} holds: the event starts at NotBefore")
    if action.kind == "approve_when_ready":
        return ready.check(rule, fleet, event, now, notes)
    if action.kind == "approve_in_window":
        closed = window.check(rule, event, now)
        if closed is not None:
            return closed
    if action.kind == "ask":
        unanswered = ask.check(rule, event, now, notes)
        if unanswered is not None:
            return unanswered
    return drain.check(rule, fleet, event, now, notes)


def _approve_reason(rule: Rule, fleet: FleetView, target: str) -> str:
    name = carrier_name(fleet, target)
    return f"rule {rule.name} ({rule.action.kind.replace('_', ' ')}); approval sent through {name}"
