"""The carrier choice: which VM carries an approval to the platform (its agent POSTs
StartRequests to IMDS). Any VM that sees the event can start it for all.

A new kind of carrier adds its candidates and its place in `choose_target`'s preference.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from bridge.policy.model import ARM_CARRIER, EventView, FleetView

# A live VM the event names is asked to carry the approval before its own report is read only
# this soon after the event was first seen: past it, a VM that still has not reported it is
# most likely not running an agent that would (choose_target).
UNREPORTED_CARRIER_WITHIN = timedelta(minutes=2)


def choose_target(fleet: FleetView, event: EventView, now: datetime) -> str | None:
    """The VM to carry the approval, one not yet asked: a live VM the event names, then a
    live neighbour that reports it; only when none can, ARM's acknowledge (`ARM_CARRIER`,
    when `fleet.last_resort`): a live agent is always preferred.

    A VM the event names carries it even before its own report is folded in, as long as it
    is alive and the event is young (`UNREPORTED_CARRIER_WITHIN`): Azure shows an event to
    every VM of the availability set or placement group at once, and the named VM's agent
    reads its queue at the fast interval (commands.poll_interval) from its next IMDS poll on,
    while a neighbour reads every commands.others_interval (10 s). Which VM's record happens
    to be read first must not decide how late the approval lands (issue 27). A VM that was
    asked without having reported is given a shorter time to answer
    (bridge.consumer.ledger.UNREPORTED_TARGET_TIMEOUT) before a reporter is asked.
    """
    affected = set(event.affected)
    reporters = set(event.reporters)
    young = now - event.first_seen <= UNREPORTED_CARRIER_WITHIN
    named = [v for v in event.affected if v not in reporters and young]
    candidates = [
        v for v in (*event.reporters, *named) if v not in event.tried and fleet.alive(v, now)
    ]
    if not candidates:
        # No agent can: ARM's acknowledge, once, for an event Azure told of (Event Grid gives
        # the resource its acknowledge is addressed to).
        arm = fleet.last_resort and event.azure is not None and ARM_CARRIER not in event.tried
        return ARM_CARRIER if arm else None

    def preference(vm_id: str) -> tuple[bool, bool, str]:
        vm = fleet.vms[vm_id]
        return (vm_id not in affected, vm_id not in reporters, vm.name.lower())

    return min(candidates, key=preference)


def carrier_name(fleet: FleetView, target: str) -> str:
    """How a verdict's carrier is said: the VM's name, or ARM's acknowledge."""
    if target == ARM_CARRIER:
        return "ARM's acknowledge (no live agent can carry it)"
    return fleet.vms[target].name
