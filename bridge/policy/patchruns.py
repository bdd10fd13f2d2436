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
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from bridge.policy.model import PATCH, Scope, VmView


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
    # Scale sets of `resources` whose instances Resource Graph listed (each is in
    # `resources`): they count by those, and by their VMs agents report, never as a name.
    whole: frozenset[str] = frozenset()
    # Scale sets whose instances could not be read: the run counts as breaking every budget.
    unread: frozenset[str] = frozenset()
    # VM ids of `resources` Resource Graph placed: the name of the scale set each is in, or
    # "" (none, or an availability set). A VM no agent reports counts where it is; one not
    # placed may be anywhere (worst case).
    placed: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def key(self) -> str:
        """Its pseudo event in FleetView.impacted: its known VMs and the names that may be
        anywhere. The names of VMs no agent reports whose scope is known count apart, one
        pseudo event per scope (`part_key`), so that FleetView.reach says where each may be."""
        return PATCH + self.run_id

    def part_key(self, number: int) -> str:
        return f"{PATCH}{number}:{self.run_id}"

    def owns(self, key: str) -> bool:
        """Whether `key` of FleetView.impacted is one of this run's pseudo events."""
        number, colon, run_id = key.removeprefix(PATCH).partition(":")
        return key == self.key or (
            key.startswith(PATCH) and bool(colon) and number.isdigit() and run_id == self.run_id
        )


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
        scale_set = f"{base}virtualmachinescalesets/{vm.scale_set.lower()}"
        ids.append(scale_set)
        # A Uniform set names its instances `{set}_{instance id}`: the instance's id is known
        # from the name where the agent does not say its resource id.
        prefix, _, number = vm.name.lower().rpartition("_")
        if not vm.resource_id and prefix == vm.scale_set.lower() and number.isdigit():
            ids.append(f"{scale_set}/virtualmachines/{number}")
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
    resources: frozenset[str],
    vms: Iterable[VmView] | Mapping[str, frozenset[str]],
    whole: frozenset[str] = frozenset(),
) -> tuple[frozenset[str], list[str]]:
    """The known VMs (VmIds) `resources` names, and the names of those it names that no
    agent reports (`name_of`; a scale set none of whose VMs is known and whose instances were
    not read is named so, and counts as one VM). A scale set of `whole` (its instances are
    in `resources` too) counts its known VMs and never its name. `vms`: the VMs, or their
    `index_of`."""
    index = vms if isinstance(vms, Mapping) else index_of(vms)
    found: set[str] = set()
    unknown: list[str] = []
    for resource in sorted(resources):
        hit = index.get(resource)
        if hit:
            found |= hit
        elif resource not in whole:
            unknown.append(name_of(resource))
    return frozenset(found), sorted(unknown)


def name_of(resource: str) -> str:
    """The name a VM no agent reports counts by: a Uniform scale set's instance
    (.../virtualmachinescalesets/web/virtualmachines/3) is `web_3`, as IMDS and scheduled
    events name it; any other resource its last segment."""
    parent, _, instance = resource.rpartition("/virtualmachines/")
    if parent.rpartition("/")[0].endswith("/virtualmachinescalesets"):
        return f"{parent.rpartition('/')[2]}_{instance}"
    return resource.rpartition("/")[2]


def where(resource: str, run: RunView) -> Scope | None:
    """Where a VM (or scale set) of `run` no agent reports is: its subscription, resource
    group and scale set, from its id (a scale set, an instance) or from Resource Graph
    (`run.placed`); None when that is not known (it may be in any group)."""
    parts = resource.split("/")
    if len(parts) < 9 or parts[1] != "subscriptions" or parts[3] != "resourcegroups":
        return None
    sub, group = parts[2], parts[4]
    if parts[7] == "virtualmachinescalesets":
        return (sub, group, parts[8])
    if resource in run.placed:
        return (sub, group, run.placed[resource] or None)
    return None


def places(run: RunView, index: Mapping[str, frozenset[str]]) -> dict[str, Scope | None]:
    """Each name `run` counts that no agent reports, and where it is (`where`)."""
    found: dict[str, Scope | None] = {}
    for resource in sorted(run.resources):
        if resource in index or resource in run.whole:
            continue
        name = name_of(resource)
        scope = where(resource, run)
        # One name in two places (two scale sets' web_0) may be either: where it is, unknown.
        found[name] = scope if found.get(name, scope) == scope else None
    return found


def impact(
    runs: Iterable[RunView], vms: Mapping[str, VmView], now: datetime, grace: timedelta
) -> dict[str, frozenset[str]]:
    """The runs counting at `now`, as pseudo events (`counted`)."""
    return counted(runs, vms, now, grace)[0]


def counted(
    runs: Iterable[RunView], vms: Mapping[str, VmView], now: datetime, grace: timedelta
) -> tuple[dict[str, frozenset[str]], dict[str, frozenset[Scope]]]:
    """The runs counting at `now`, as pseudo events of FleetView.impacted, and where the
    names they count may be (FleetView.reach): a run's known VMs by VmId and the names of
    VMs no agent reports that may be anywhere under its key; the names Resource Graph placed
    under a key a scope (`RunView.part_key`), reached only there, as an event's VMs no
    agent reports are (bridge.policy.budgets)."""
    found: dict[str, frozenset[str]] = {}
    reach: dict[str, frozenset[Scope]] = {}
    index: Mapping[str, frozenset[str]] | None = None
    for run in runs:
        if not counting(run, now, grace):
            continue
        index = index if index is not None else index_of(vms.values())
        known, _ = members(run.resources, index, run.whole)
        anywhere = set(known)
        by_scope: dict[Scope, set[str]] = {}
        for name, scope in places(run, index).items():
            if scope is None:
                anywhere.add(name)
            else:
                by_scope.setdefault(scope, set()).add(name)
        found[run.key] = frozenset(anywhere)
        for number, scope in enumerate(sorted(by_scope, key=repr)):
            found[run.part_key(number)] = frozenset(by_scope[scope])
            reach[run.part_key(number)] = frozenset((scope,))
    return found, reach
