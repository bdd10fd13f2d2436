"""Which rule an event matches: every condition of a rule's `match` must hold, the VM
conditions for every VM the event affects; `mismatch` says in words why one does not.
"""

from __future__ import annotations

import fnmatch

from bridge.policy.model import (
    EventView,
    FleetView,
    Match,
    Range,
    VmView,
)


def mismatch(match: Match, fleet: FleetView, event: EventView) -> str | None:  # noqa: PLR0911
    """Why `match` does not hold for `event`, in words; None when it does."""
    if not _in(match.event_types, event.event_type):
        return f"EventType {event.event_type} is not {_one_of(match.event_types)}"
    if not _in(match.event_sources, event.event_source):
        return f"EventSource {event.event_source} is not {_one_of(match.event_sources)}"
    if not _in(match.statuses, event.status):
        return f"EventStatus {event.status} is not {_one_of(match.statuses)}"
    if match.duration is not None and not match.duration.contains(event.duration):
        return f"DurationInSeconds {event.duration} is outside {_range(match.duration)}"
    if not match.about_vms:
        return None
    # VM conditions must hold for every affected VM, so a rule meant for one tier never
    # approves an event that also takes down a VM of another.
    if event.unresolved:
        return f"Resources name {', '.join(event.unresolved)}, not resolved to one known VM"
    vms = [fleet.vms[v] for v in event.affected if v in fleet.vms]
    if not vms:
        return "no VM of the event is known, and the rule has VM conditions"
    failing = next((vm for vm in vms if not vm_matches(match, vm)), None)
    if failing is not None:
        return f"VM {failing.name} does not meet its VM conditions"
    return None


def _one_of(values: frozenset[str]) -> str:
    return " or ".join(sorted(values))


def _range(bounds: Range) -> str:
    low = "" if bounds.at_least is None else f"{bounds.at_least} <= "
    high = "" if bounds.below is None else f" < {bounds.below}"
    return f"{low}d{high}"


def vm_matches(match: Match, vm: VmView) -> bool:
    tags = {k.lower(): v for k, v in vm.tags.items()}
    return (
        all(tags.get(k.lower()) == v for k, v in match.tags)
        and _in(match.scale_sets, vm.scale_set)
        and _in(match.resource_groups, vm.resource_group)
        and _in(match.locations, vm.location)
        and _in(match.zones, vm.zone)
        and (
            not match.names
            or any(fnmatch.fnmatchcase(vm.name.lower(), p.lower()) for p in match.names)
        )
    )


def _in(allowed: frozenset[str], value: str | None) -> bool:
    return not allowed or (value is not None and value.lower() in allowed)
