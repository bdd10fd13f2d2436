"""The pause gate: a pause people set stops every early approval in its scope, the
policy's and a person's, and a drain's grant (both start taking VMs down early).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from bridge.policy.groups import (
    group_key,
)
from bridge.policy.model import (
    EventView,
    FleetView,
    Pause,
    Verdict,
    VmView,
    parse_scope,
    scope_value_matches,
)
from bridge.policy.wording import explained


def covers(pause: Pause, vms: Iterable[VmView]) -> bool:
    """Whether `pause` covers an event of `vms` (a fleet-wide one covers every event,
    and so does one whose scope cannot be read: a pause errs on the side of stopping)."""
    try:
        scope = parse_scope(pause.scope)
    except ValueError:
        return True
    if scope is None:
        return True
    kind, value = scope
    # A pool's name a heartbeat says puts no VM in a budget's group within a scale set
    # (`group_key`), but stopping a node that says it is in the paused pool is safe.
    return any(
        scope_value_matches(value, group_key(kind, vm))
        or (kind == "node_pool" and scope_value_matches(value, vm.node_pool))
        for vm in vms
    )


def active_pause(fleet: FleetView, event: EventView, now: datetime) -> Pause | None:
    """The pause that stops approving `event` now, if any (a fleet-wide one first, then the
    one that lasts longest)."""
    vms = [fleet.vms[v] for v in (*event.affected, *event.possible) if v in fleet.vms]
    covering = [p for p in fleet.pauses if p.active(now) and covers(p, vms)]
    if not covering:
        return None
    return min(covering, key=lambda p: (p.scope is not None, p.until is not None, p.until or now))


def check(
    fleet: FleetView, event: EventView, now: datetime, rule: str, notes: list[str]
) -> Verdict | None:
    pause = active_pause(fleet, event, now)
    if pause is None:
        return None
    until = f"until {pause.until:%Y-%m-%d %H:%M:%S}Z" if pause.until else "until resumed"
    why = (
        f"paused ({pause.where}) by {pause.by.name} {until}: {pause.reason}; no early "
        "approval, by the policy or a person, while it lasts"
    )
    return explained(
        Verdict("Defer", rule, why, recheck_at=pause.until, pause=pause), [*notes, why]
    )
