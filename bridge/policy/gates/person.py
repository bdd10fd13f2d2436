"""The person gate: what a person decided about an event comes before the rules.

A hold holds; an approval goes through the pauses, the budgets and the drains like the
policy's, unless it overrides the budgets (break-glass, said in the explanation).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from bridge.policy.budgets import check_budgets
from bridge.policy.carrier import carrier_name, choose_target
from bridge.policy.gates import drain, pause
from bridge.policy.model import (
    PERSON,
    PERSON_RULE,
    EventView,
    FleetView,
    PersonDecision,
    Policy,
    Verdict,
)
from bridge.policy.wording import explained, listed, node_names


def check(  # noqa: PLR0917 - evaluate's arguments and the decision
    policy: Policy,
    fleet: FleetView,
    event: EventView,
    person: PersonDecision,
    now: datetime,
    notes: list[str],
) -> Verdict:
    """What a person decided, whatever the rules say: a hold holds; an approval goes through
    the pauses and the budgets like the policy's, unless it overrides the budgets."""
    said = f"{person.reason}" if person.reason else "no reason given"
    notes.append(
        f"{person.kind} by {person.by.who} at {person.at:%Y-%m-%d %H:%M:%S}Z: {said}; "
        "a person's decision comes before the rules"
    )
    if person.kind == "hold":
        why = f"held by {person.by.name}: the event starts at NotBefore ({said})"
        return explained(Verdict("Hold", PERSON_RULE, why, person=person), notes)
    paused = pause.check(fleet, event, now, PERSON_RULE, notes)
    if paused is not None:
        return replace(paused, person=person)
    override = False
    blocked = check_budgets(policy.budgets, fleet, event, now, notes=notes)
    if blocked is not None and not person.override_budget:
        kind, why = blocked
        why = f"approved by {person.by.name}, and the budgets still apply: {why}"
        return explained(Verdict(kind, PERSON_RULE, why, person=person), notes)
    if blocked is not None:
        override = True
        notes.append(f"budget overridden by {person.by.who} (break-glass): {said}")
    # A node is drained before it is approved, whoever approves (the budgets were checked:
    # a grant takes the slot as an approval does).
    gate = drain.check(PERSON, fleet, event, now, notes)
    if gate is not None:
        if gate.grant:
            granted = listed(
                "drain granted on {names}; waiting for it", node_names(fleet, gate.grant)
            )[0]
            notes.append(granted)
            gate = replace(gate, reason=granted)
        return explained(replace(gate, person=person, override=override), notes)
    target = choose_target(fleet, event, now)
    if target is None:
        why = "no live VM reports the event to carry the approval"
        return explained(Verdict("Defer", PERSON_RULE, why, person=person), [*notes, why])
    over = " over the budget" if override else ""
    name = carrier_name(fleet, target)
    why = f"approved by {person.by.name}{over} ({said}); approval sent through {name}"
    notes.append(f"approval sent through {name}")
    return explained(
        Verdict("Approve", PERSON_RULE, why, target, person=person, override=override), notes
    )
