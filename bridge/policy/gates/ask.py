"""The ask gate: an `ask` rule waits for a person's answer until its deadline (never past
NotBefore), then approves or holds as its `on_deadline` says.
"""

from __future__ import annotations

from datetime import datetime

from bridge.policy.model import (
    Action,
    EventView,
    Rule,
    Verdict,
)


def ends_at(action: Action, event: EventView, now: datetime) -> datetime | None:
    """Until when an ask waits: its deadline from when it was first asked (`now` when it has
    not been yet), never past NotBefore, when the platform starts the event anyway."""
    if action.kind != "ask":
        return None
    ends = [event.not_before] if event.not_before is not None else []
    if action.deadline is not None:
        ends.append((event.asked_at or now) + action.deadline)
    return min(ends, default=None)


def check(rule: Rule, event: EventView, now: datetime, notes: list[str]) -> Verdict | None:
    action = rule.action
    deadline = ends_at(action, event, now)
    until = f"{deadline:%Y-%m-%d %H:%M:%S}Z" if deadline else "NotBefore"
    if deadline is None or now < deadline:
        why = f"asked {action.target}; waiting for a person's answer until {until}, then " + (
            action.on_deadline if deadline != event.not_before else "the event starts"
        )
        return Verdict(
            "Ask", rule.name, why, recheck_at=deadline, asked=action.target, ask_deadline=deadline
        )
    if action.on_deadline == "approve" and deadline != event.not_before:
        notes.append(f"nobody answered {action.target} by {until}: approved (on_deadline approve)")
        return None
    why = f"nobody answered {action.target} by {until}: the event starts at NotBefore"
    return Verdict("Hold", rule.name, why, asked=action.target, ask_deadline=deadline)
