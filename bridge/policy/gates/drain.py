"""The drain gate: an approving action waits for the drains of the event's Kubernetes
nodes, with no deadline of its own (the agent's kubernetes.give_up_before decides, and says so
in its records). A drain not granted yet is granted by the verdict (`Verdict.grant`) once the
budgets let the event through; one that ended without its node ready holds the event.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from bridge.policy.model import (
    Blocker,
    EventView,
    FleetView,
    Rule,
    Verdict,
)
from bridge.policy.wording import LISTED_NAMES, listed, node_names, took


def needed(fleet: FleetView, event: EventView, vm_id: str, now: datetime) -> bool:
    """Whether `vm_id`'s node is drained for `event` before the event is approved: its live
    agent drains on a grant and did not refuse this event's (`EventView.no_drain`). Not
    for a Spot eviction: its agent drains at once (30 s notice), with no grant to wait for."""
    vm = fleet.vms.get(vm_id)
    return (
        vm is not None
        and vm.drains_on_grant
        and vm_id not in event.no_drain
        and event.event_type.lower() != "preempt"
        and fleet.alive(vm_id, now)
    )


def check(
    rule: Rule, fleet: FleetView, event: EventView, now: datetime, notes: list[str]
) -> Verdict | None:
    """An approving action waits for the drains of the event's nodes, with no deadline of its
    own: the agent's (kubernetes.give_up_before) decides, and says so in its records."""
    waiting = [v for v in event.affected if v not in event.ready and needed(fleet, event, v, now)]
    if not waiting:
        return None
    notes.extend(blocked_lines(fleet, event, waiting, now))
    failed = why_failed(fleet, event, waiting)
    if failed is not None:
        return Verdict("Hold", rule.name, failed)
    why = f"waiting for drains: {'; '.join(waits(fleet, event, waiting))}"
    return Verdict("Defer", rule.name, why, grant=to_grant(event, waiting))


def to_grant(event: EventView, waiting: Iterable[str]) -> tuple[str, ...]:
    return tuple(v for v in waiting if v not in event.granted)


def why_failed(fleet: FleetView, event: EventView, waiting: Iterable[str]) -> str | None:
    """Why the event is held when a drain of `waiting` ended without its node ready (it gave
    up with on_deadline hold, or failed); None when none did."""
    failed = [v for v in waiting if (d := event.drains.get(v)) is not None and d.failed]
    said = listed("the drain on {names} ended without the node ready", node_names(fleet, failed))
    return f"{said[0]} (see its Hook record): the event starts at NotBefore" if said else None


_DRAIN_READY = frozenset({"Drained", "GaveUp"})  # a drain that ended (GaveUp: failed, or not)


def waits(fleet: FleetView, event: EventView, waiting: Iterable[str]) -> list[str]:
    # Drained and not ready: its agent's prepare hook runs after the drain (issue 38).
    hooking = [
        v
        for v in waiting
        if (d := event.drains.get(v)) and d.status in _DRAIN_READY and not d.failed
    ]
    blocked = [v for v in waiting if (d := event.drains.get(v)) and d.status == "Blocked"]
    rest = [v for v in waiting if v not in blocked and v not in hooking and v in event.granted]
    ungranted = [
        v for v in waiting if v not in blocked and v not in hooking and v not in event.granted
    ]
    return [
        *listed(
            "prepare hook not yet succeeded after the drain on {names}",
            node_names(fleet, hooking),
        ),
        *listed("drain blocked on {names}", node_names(fleet, blocked)),
        *listed("drain not finished on {names}", node_names(fleet, rest)),
        *listed("drain not granted yet on {names}", node_names(fleet, ungranted)),
    ]


def blocked_lines(
    fleet: FleetView, event: EventView, waiting: Iterable[str], now: datetime
) -> list[str]:
    """A line for each blocked drain of `waiting`: its node, for how long, and each pod that
    holds it up with the PodDisruptionBudget that refused its eviction."""
    lines = []
    for vm_id in waiting:
        drain = event.drains.get(vm_id)
        if drain is None or drain.status != "Blocked":
            continue
        node = node_names(fleet, [vm_id])[0]
        since = f" {took(now - drain.blocked_since)}" if drain.blocked_since else ""
        pods = [_pod(b) for b in drain.blockers]
        if len(pods) > LISTED_NAMES:
            pods[LISTED_NAMES:] = [f"and {len(pods) - LISTED_NAMES} more"]
        lines.append(f"drain on {node} blocked{since}: {', '.join(pods) or 'no pod named'}")
    return lines


def _pod(blocker: Blocker) -> str:
    why = f"PDB {blocker.pdb} refused eviction" if blocker.pdb else blocker.reason or "no reason"
    return f"pod {blocker.namespace}/{blocker.pod} ({why})"
