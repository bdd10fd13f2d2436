"""The ready gate (`approve_when_ready`): every VM the event affects has finished its
prepare step (a prepare hook, or a node's drain), or the rule's deadline decides.

What a VM waits on is said part by part (`check`'s `parts`): a new kind of prepare step adds
its own part and its own notion of "not ready yet" there.
"""

from __future__ import annotations

from datetime import datetime

from bridge.policy.gates import drain
from bridge.policy.model import (
    EventView,
    FleetView,
    Rule,
    Verdict,
)
from bridge.policy.wording import listed


def check(
    rule: Rule, fleet: FleetView, event: EventView, now: datetime, notes: list[str]
) -> Verdict | None:
    """Every affected VM's prepare hook succeeded, or the deadline decides.

    A VM whose agent says it has no prepare hook never gets ready: with on_deadline hold
    the event is held at once rather than at the deadline, with on_deadline approve it is
    not waited for (docs/policy.md#approve_when_ready-and-vms-without-a-prepare-hook). An
    agent that does not say (older than HasPrepareHook) may have one: waited for.
    """
    waiting = [v for v in event.affected if v not in event.ready]
    if not waiting and not event.unresolved:
        return None
    hooks = {v: fleet.vms[v].prepare_hook if v in fleet.vms else None for v in waiting}
    # An agent that refused the drain's grant (Prepare) drains nothing for the event: as if it
    # had no prepare hook, so the event is not waited on for ever.
    refused = [v for v in waiting if v in event.no_drain and hooks[v] is not False]
    none = [v for v in waiting if hooks[v] is False or v in refused]
    blocking = [v for v in waiting if v not in none]
    draining = [v for v in blocking if drain.needed(fleet, event, v, now)]
    notes.extend(drain.blocked_lines(fleet, event, draining, now))
    failed = drain.why_failed(fleet, event, draining)
    if failed is not None:
        return Verdict("Hold", rule.name, failed)
    parts = [
        *drain.waits(fleet, event, draining),
        *listed(
            "prepare hook not yet succeeded on {names}",
            [v for v in blocking if hooks[v] and v not in draining],
            fleet,
        ),
        *listed(
            "{VM} {names} {has} not said whether {it} {has} a prepare hook",
            [v for v in blocking if hooks[v] is None],
            fleet,
        ),
        *listed("{names} not resolved to one known VM", event.unresolved),
    ]
    no_hook = [
        *listed("no prepare hook on {VM} {names}", [v for v in none if v not in refused], fleet),
        *listed("{names} refused the drain (Prepare)", refused, fleet),
    ]
    total = len(event.affected) + len(event.unresolved)
    if none and rule.action.on_deadline == "hold":
        why = f"{'; '.join(no_hook)}: never ready, so the event starts at NotBefore"
        if parts:
            why += f" ({'; '.join(parts)})"
        return Verdict("Hold", rule.name, why)
    if none:
        notes.append(f"{'; '.join(no_hook)}: not waited for (on_deadline approve)")
    if not parts:
        return None
    count = len(blocking) + len(event.unresolved)
    state = f"{count} of {total} VMs not ready: {'; '.join([*parts, *no_hook])}"
    grant = drain.to_grant(event, draining)
    # Without a deadline the rule waits for the hooks until NotBefore makes it moot.
    deadline = event.first_seen + rule.action.deadline if rule.action.deadline else None
    if deadline is None or now < deadline:
        return Verdict(
            "Defer",
            rule.name,
            f"waiting for prepare hooks: {state}",
            recheck_at=deadline,
            grant=grant,
        )
    return _past_deadline(rule, state, grant if draining else None, notes)


def _past_deadline(
    rule: Rule, state: str, grant: tuple[str, ...] | None, notes: list[str]
) -> Verdict | None:
    """approve_when_ready past its deadline with VMs not ready (`state`); `grant`: the drains
    not granted yet when some VM drains (None: none does)."""
    if rule.action.on_deadline == "approve" and grant is not None:
        # A node is not approved with its pods on it: the drain's own deadline decides.
        why = (
            f"prepare deadline passed with {state}: the drains are waited for (their own "
            "deadline, kubernetes.give_up_before, decides)"
        )
        return Verdict("Defer", rule.name, why, grant=grant)
    if rule.action.on_deadline == "approve":
        notes.append(f"prepare deadline passed with {state}: approved anyway (on_deadline approve)")
        return None
    why = f"prepare deadline passed with {state}: the event starts at NotBefore"
    return Verdict("Hold", rule.name, why)
