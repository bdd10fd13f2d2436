"""Guest patch runs in the budgets (issue 40, item 1): which VMs a run impacts and when. Pure:
the run and the clock in, the pseudo events of FleetView.impacted out.

A run counts from its scheduled start (the pre-event's startDateTime) to its post-event.
When the post-event never comes (a lost delivery; Update Manager documents none for a run
that did not start), it counts until its scheduled end (endDateTime) and `grace` more, and no
longer: Update Manager installs only within the window ("updates are installed as part of the
user-defined schedule maintenance window", articles/update-manager/pre-post-scripts-overview.md),
so a reboot is at most at its end, and `grace` (patchruns.grace, 30 minutes by default) is the
time a VM rebooted then takes to be back. Holding the VMs longer would block every other
event of their groups for a run that is over; shorter would let a slot go while a VM may
still be rebooting. A cancelled run counts nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from bridge.policy.model import PATCH, VmView


@dataclass(frozen=True)
class RunView:
    """A patch run as the budgets see it."""

    run_id: str  # the correlationId, lower case
    configuration: str  # the maintenance configuration's id
    start: datetime
    end: datetime  # the window's end
    cutoff: datetime | None  # the cancellation cut-off
    resources: frozenset[str]  # VM and scale set ids it patches, lower case
    post_at: datetime | None = None  # when its post-event came
    cancelled: bool = False

    @property
    def key(self) -> str:
        """Its pseudo event in FleetView.impacted."""
        return PATCH + self.run_id


def counted_until(run: RunView, grace: timedelta) -> datetime:
    """Until when `run` counts: its post-event, else its window's end and `grace`."""
    if run.post_at is not None:
        return max(run.start, run.post_at)
    return run.end + grace


def counting(run: RunView, now: datetime, grace: timedelta) -> bool:
    return not run.cancelled and run.start <= now < counted_until(run, grace)


def vm_ids(vm: VmView) -> tuple[str, ...]:
    """The ids (lower case) an assignment may name `vm` by: its own, or its scale set's."""
    if not vm.subscription_id or not vm.resource_group:
        return (vm.resource_id,) if vm.resource_id else ()
    base = (
        f"/subscriptions/{vm.subscription_id}/resourcegroups/{vm.resource_group}"
        "/providers/microsoft.compute/"
    ).lower()
    ids = [vm.resource_id or f"{base}virtualmachines/{vm.name.lower()}"]
    if vm.scale_set:
        ids.append(f"{base}virtualmachinescalesets/{vm.scale_set.lower()}")
    return tuple(i.lower() for i in ids)


def index_of(vms: Iterable[VmView]) -> dict[str, frozenset[str]]:
    """Every id (lower case) an assignment may name a known VM by, and the VmIds it names:
    made once for many runs (10,000 VMs and 100 runs: a lookup per resource, not a pass over
    the fleet per run)."""
    index: dict[str, set[str]] = {}
    for vm in vms:
        for found in vm_ids(vm):
            index.setdefault(found, set()).add(vm.vm_id)
    return {key: frozenset(ids) for key, ids in index.items()}


def members(
    resources: frozenset[str], vms: Iterable[VmView] | Mapping[str, frozenset[str]]
) -> tuple[frozenset[str], list[str]]:
    """The known VMs (VmIds) `resources` names, and the names of those it names that no
    agent reports (a VM's last segment; a scale set none of whose VMs is known is named so,
    and counts as one VM: its instances cannot be told apart without an agent). `vms`: the
    VMs, or their `index_of`."""
    index = vms if isinstance(vms, Mapping) else index_of(vms)
    found: set[str] = set()
    unknown: list[str] = []
    for resource in sorted(resources):
        hit = index.get(resource)
        if hit:
            found |= hit
        else:
            unknown.append(resource.rpartition("/")[2])
    return frozenset(found), sorted(unknown)


def impact(
    runs: Iterable[RunView], vms: Mapping[str, VmView], now: datetime, grace: timedelta
) -> dict[str, frozenset[str]]:
    """The runs counting at `now`, as pseudo events: their known VMs by VmId, the rest by
    name (as an event's VMs no agent reports are)."""
    found: dict[str, frozenset[str]] = {}
    index: Mapping[str, frozenset[str]] | None = None
    for run in runs:
        if counting(run, now, grace):
            index = index if index is not None else index_of(vms.values())
            known, unknown = members(run.resources, index)
            found[run.key] = known | frozenset(unknown)
    return found
