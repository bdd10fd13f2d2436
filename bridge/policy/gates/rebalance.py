"""The rebalance gate: a Spot rebalance recommendation (an Advisory, bridge.agent.advisory) is
never approved, whatever a rule or a person says; with the policy's `rebalance: {drain: true}`
the Kubernetes node of each VM it names is drained at once, a drain granted within the
budgets as any drain is (it takes a slot of the node's pool, and holds it until the
recommendation clears, the VM is evicted, or its agent falls silent).

It always returns the Verdict: Ignore (nothing to do), Defer (a drain to grant, or granted and
not finished, or drained: the slot stays taken), or Hold (a drain ended without the node ready,
or nothing to drain but a target to tell: `rebalance.notify`, told of the first decision).
Never Approve: nothing is sent to IMDS for an advisory.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from bridge.policy.budgets import check_budgets
from bridge.policy.gates import drain, pause
from bridge.policy.model import REBALANCE_RULE, EventView, FleetView, Policy, Verdict
from bridge.policy.wording import explained, listed, node_names

ADVISORY = "a Spot rebalance recommendation is an advisory: nothing to approve"


def check(
    policy: Policy, fleet: FleetView, event: EventView, now: datetime, notes: list[str]
) -> Verdict:
    """The verdict on the advisory `event`, with the target to tell (rebalance.notify); pure."""
    settings = policy.rebalance
    verdict = _decide(policy, fleet, event, now, notes)
    if settings is None or settings.notify is None:
        return verdict
    # An Ignore is never said: with a target to tell, nothing to do is a Hold, said once.
    kind = "Hold" if verdict.kind == "Ignore" else verdict.kind
    return replace(verdict, kind=kind, notify=settings.notify)


def _decide(  # noqa: PLR0911 - one verdict a step, as the module's docstring lists them
    policy: Policy, fleet: FleetView, event: EventView, now: datetime, notes: list[str]
) -> Verdict:
    settings = policy.rebalance
    if settings is None or not settings.drain:
        why = f"{ADVISORY} (the policy drains nothing on one: no rebalance.drain)"
        return explained(Verdict("Ignore", REBALANCE_RULE, why), [*notes, why])
    draining = [v for v in event.affected if drain.needed(fleet, event, v, now)]
    if not draining:
        why = f"{ADVISORY}, and no VM it names drains a Kubernetes node on a grant"
        return explained(Verdict("Ignore", REBALANCE_RULE, why), [*notes, why])
    notes.extend(drain.blocked_lines(fleet, event, draining, now))
    failed = drain.why_failed(fleet, event, draining)
    if failed is not None:
        why = failed.replace(": the event starts at NotBefore", "")
        return explained(Verdict("Hold", REBALANCE_RULE, why), [*notes, why])
    waiting = [v for v in draining if v not in event.ready]
    if not waiting:
        drained = listed("drained {names}", node_names(fleet, draining))[0]
        why = (
            f"{ADVISORY}; {drained}: the slot stays taken until the recommendation clears "
            "or the VM is evicted (its Preempt drains nothing more)"
        )
        return explained(Verdict("Defer", REBALANCE_RULE, why), [*notes, why])
    grant = drain.to_grant(event, waiting)
    if not grant:
        why = f"{ADVISORY}; waiting for drains: {'; '.join(drain.waits(fleet, event, waiting))}"
        return explained(Verdict("Defer", REBALANCE_RULE, why), [*notes, why])
    # A pause stops a drain's grant as it stops an approval: both take VMs down early.
    paused = pause.check(fleet, event, now, REBALANCE_RULE, notes)
    if paused is not None:
        return paused
    blocked = check_budgets(policy.budgets, fleet, event, now, notes=notes)
    if blocked is not None:
        # A full budget defers the drain as it would an approval: the next pass looks again.
        _, why = blocked
        return explained(Verdict("Defer", REBALANCE_RULE, f"drain not granted: {why}"), notes)
    granted = listed("drain granted on {names} at once (rebalance.drain)", node_names(fleet, grant))
    why = f"{ADVISORY}; {granted[0]}"
    return explained(Verdict("Defer", REBALANCE_RULE, why, grant=grant), [*notes, why])
