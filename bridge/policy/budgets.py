"""Budgets: whether approving an event would impact more VMs of one of its groups at
once than a budget allows (`check_budgets`), counting live members and every VM some event,
cordon, drain or resource-health report impacts; and how full each budget is (`budget_use`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from bridge.policy.groups import (
    AKS_POOL_TAG,
    aks_pool,
    can_hold,
    group_index,
    group_key,
    groups_of,
    pool_of,
)
from bridge.policy.model import (
    CORDONED,
    HELD,
    PATCH,
    Budget,
    EventView,
    FleetView,
    Scope,
    VerdictKind,
    VmView,
)
from bridge.policy.wording import LISTED_NAMES, listed


def _left_out(
    budget: Budget,
    fleet: FleetView,
    index: Mapping[str, frozenset[str]],
    key: str,
    now: datetime,
) -> list[str]:
    """A line naming the live VMs whose heartbeats name the pool of node_pool group `key` and
    that do not count in it, each with why: of another scale set (or none), or AKS's tag says
    otherwise; none when there are none. Found among the groups (a few per resource group),
    not among the fleet's VMs."""
    mates = [fleet.vms[v] for v in index.get(key, ()) if v in fleet.vms]
    # The pool's names: AKS's tag, or what its nodes say (a scale set without the tag is one
    # pool, whatever they say).
    pools = {pool.lower() for pool in map(pool_of, mates) if pool}
    sample = mates[0] if mates else None
    if sample is None or not pools:
        return []
    home = (sample.subscription_id, (sample.resource_group or "").lower())
    mine = (sample.scale_set or "").lower()
    out: list[tuple[str, str]] = []
    for other, ids in index.items():
        them = next((fleet.vms[v] for v in ids if v in fleet.vms), None)
        if other == key or them is None:
            continue
        if (them.subscription_id, (them.resource_group or "").lower()) != home:
            continue
        for vm_id in sorted(ids):
            vm = fleet.vms.get(vm_id)
            if vm is None or not fleet.alive(vm_id, now):
                continue
            if (vm.node_pool or "").lower() not in pools:
                continue
            tag = aks_pool(vm)
            if (vm.scale_set or "").lower() != mine:
                why = f"in scale set {vm.scale_set}" if vm.scale_set else "in no scale set"
            else:
                why = f"its AKS tag says {tag}" if tag else f"it has no {AKS_POOL_TAG} tag"
            out.append((vm.name, f"names pool {vm.node_pool}, {why}"))
    if not out:
        return []
    shown = ", ".join(f"{name} ({why})" for name, why in sorted(out)[:LISTED_NAMES])
    if len(out) > LISTED_NAMES:
        shown += f" and {len(out) - LISTED_NAMES} more"
    return [
        f"budget {budget.name}: {key} does not count what only a heartbeat says; left out: {shown}"
    ]


def check_budgets(
    budgets: tuple[Budget, ...],
    fleet: FleetView,
    event: EventView,
    now: datetime,
    *,
    notes: list[str] | None = None,
) -> tuple[VerdictKind, str] | None:
    """("Defer"|"Hold", why) when approving `event` would break a budget; None when it fits.

    A group's size counts its live members (heard from within `fleet.alive_within`) and
    the members some event impacts: a VM deleted yesterday does not make the group larger.
    An ambiguous name counts as every VM it may be (`event.possible`); a name no VM is known
    by, in each group that can hold a VM of the scopes it may be in (`can_hold`).
    """
    others, strays = _others(fleet, event, now)
    counted = others | set(event.affected) | set(event.possible)
    unknown = set(event.unknown)
    for budget in budgets:
        index = (fleet.groups or {}).get(budget.group)
        if index is None:
            index = group_index((budget.group,), fleet.vms)[budget.group]
        members = _members(budget.group, fleet, event, index, counted, now)
        if unknown and not any(holds for _, _, holds in members.values()):
            verdict = _unheld(budget, event, unknown, strays, notes)
            if verdict is not None:
                return verdict
        for key, (group, everyone, holds) in members.items():
            # A name no VM is known by may be a VM of any group its scopes can hold: counted
            # in each (worst case).
            mine = {v for v in (*event.affected, *event.possible) if v in group}
            if holds:
                mine |= unknown
            if not mine:
                continue
            limit = budget.limit(len(group) + (len(unknown) if budget.group == "fleet" else 0))
            if len(mine) > limit:
                why = (
                    f"budget {budget.name}: the event alone impacts {len(mine)} VMs of {key}, "
                    f"more than the {limit} allowed: it starts at NotBefore"
                )
                _note(notes, why)
                return "Hold", why
            # Other events' VMs that no agent has reported are named, not in any group: in
            # the worst case in this one if it can hold them, as for this event.
            elsewhere = {
                name
                for names, scopes in strays
                if _holds(budget.group, fleet, everyone, scopes)
                for name in names
            }
            busy = (others if budget.group == "fleet" else others & (group | elsewhere)) - mine
            cordoned = _cordoned(fleet, busy)
            if budget.group == "node_pool" and notes is not None:
                notes += _left_out(budget, fleet, index, key, now)
            if len(busy | mine) > limit:
                why = (
                    f"budget {budget.name}: {key} has {len(busy)} of {len(group)} VMs impacted"
                    f"{cordoned}; {len(mine)} more would exceed {limit}"
                )
                _note(notes, why)
                return "Defer", why
            _note(
                notes,
                f"budget {budget.name}: {key} has {len(busy)} of {len(group)} VMs "
                f"impacted{cordoned}; {len(mine)} more fit the limit of "
                f"{limit}",
            )
    if not budgets:
        _note(notes, "no budget applies")
    return None


def _members(  # noqa: PLR0917 - check_budgets' parts
    kind: str,
    fleet: FleetView,
    event: EventView,
    index: Mapping[str, frozenset[str]],
    counted: set[str],
    now: datetime,
) -> dict[str, tuple[set[str], frozenset[str], bool]]:
    """The groups of kind `kind` `event` can break: key -> (its live and impacted members,
    all its members, whether it can hold the event's names no VM is known by).

    Only the event's own groups can be broken by it, and those that can hold a name of it no
    VM is known by; a group counts its live members and those some event impacts. A group
    whose known members are all silent still holds such names (agent-less VMs Event Grid told
    of, issue 36): it is checked."""
    wanted = _keys(kind, fleet, event)
    members: dict[str, tuple[set[str], frozenset[str], bool]] = {}
    for key, everyone in index.items():
        holds = bool(event.unknown) and _holds(kind, fleet, everyone, event.scopes)
        if key in wanted or holds:
            group = {v for v in everyone if v in counted or fleet.alive(v, now)}
            if group or holds:
                members[key] = (group, everyone, holds)
    return members


def _unheld(
    budget: Budget,
    event: EventView,
    unknown: set[str],
    strays: list[tuple[frozenset[str], frozenset[Scope]]],
    notes: list[str] | None,
) -> tuple[VerdictKind, str] | None:
    """`budget` for the names no VM is known by that no known group can hold: VMs of a set no
    agent ever reported (issue 36: Event Grid tells their events, ARM can approve them). In
    the worst case they are one group with the other events' such names that may share one
    of their scopes (any scope where either has none)."""
    where = set(event.scopes)
    busy = {
        name
        for names, scopes in strays
        if not where or not scopes or where & scopes
        for name in names
    } - unknown
    limit = budget.limit(len(busy | unknown))
    names = ", ".join(sorted(unknown))
    if len(unknown) > limit:
        why = (
            f"budget {budget.name}: the event alone impacts {len(unknown)} VMs no agent "
            f"reports ({names}), more than the {limit} allowed: it starts at NotBefore"
        )
        _note(notes, why)
        return "Hold", why
    if len(busy | unknown) > limit:
        why = (
            f"budget {budget.name}: {len(busy)} VMs no agent reports are impacted where "
            f"{names} may be; {len(unknown)} more would exceed {limit}"
        )
        _note(notes, why)
        return "Defer", why
    _note(
        notes,
        f"budget {budget.name}: {len(busy)} VMs no agent reports are impacted where "
        f"{names} may be; {len(unknown)} more fit the limit of {limit}",
    )
    return None


def _cordoned(fleet: FleetView, busy: Iterable[str]) -> str:
    """Which of the impacted VMs `busy` count because their nodes were cordoned by someone
    else (`cordoned_impact`), said in a budget's explanation; "" when none."""
    nodes = [v for v in busy if v in fleet.impacted.get(CORDONED + v, ())]
    held = [v for v in busy if v in fleet.impacted.get(HELD + v, ()) and v not in nodes]
    sick = sorted(v for v in busy if v in fleet.unhealthy and v not in nodes and v not in held)
    said = [
        *_patched(fleet, busy),
        *(
            f"{fleet.vms[v].name if v in fleet.vms else v} {fleet.unhealthy[v][0].lower()} since "
            f"{fleet.unhealthy[v][1]:%H:%M} (resource health)"
            for v in sick
        ),
        *listed("{names} cordoned by someone else", sorted(nodes), fleet),
        *listed(
            "{names} still cordoned by se-bridge's drain until {it} {has} been uncordoned",
            sorted(held),
            fleet,
        ),
    ]
    return f" ({'; '.join(said)})" if said else ""


def _patched(fleet: FleetView, busy: Iterable[str]) -> list[str]:
    """Which patch runs count VMs of `busy`: "N by patch run CONFIGURATION/RUN" each, once
    per run whatever its parts (`RunView.part_key`), saying how many of them are VMs no agent
    reports whose place nobody could tell (counted in every group, the worst case). Only the
    runs' keys carried on the fleet are looked at (few, made once per pass), so a check
    costs nothing more when no run counts."""
    if not fleet.patch_runs:
        return []
    busy = set(busy)
    counts: dict[str, tuple[int, int]] = {}
    for key in fleet.patch_runs:
        mine = busy & fleet.impacted.get(key, frozenset())
        if not mine:
            continue
        name, whole = _run_name(key)
        # A run's own key holds the names no scope was found for (the others have parts).
        anywhere = len(mine - fleet.vms.keys()) if whole else 0
        count, unplaced = counts.get(name, (0, 0))
        counts[name] = (count + len(mine), unplaced + anywhere)
    said = []
    for name, (count, unplaced) in counts.items():
        line = f"{count} by patch run {name}"
        if unplaced:
            line += (
                f", {unplaced} of them VMs no agent reports that Resource Graph could not place, "
                "counted in every group"
            )
        said.append(line)
    return said


def _run_name(key: str) -> tuple[str, bool]:
    """`CONFIGURATION/RUN` of a run's key (PATCH + its id, lower case; or a part of it,
    PATCH + N: + its id), as its notices and Decision records name it in
    `(patch:CONFIGURATION/RUN)`; and whether the key is the run's own (not a part)."""
    config = key.partition("maintenanceconfigurations/")[2].partition("/")[0]
    rest = key[len(PATCH) :]
    number, colon, run_id = rest.partition(":")
    part = bool(colon) and number.isdigit()
    return f"{config or '?'}/{(run_id if part else rest)[-14:]}", not part


def cordoned_impact(vms: Iterable[VmView]) -> dict[str, frozenset[str]]:
    """What cordoned nodes impact, as pseudo events of FleetView.impacted: a node nobody may
    schedule on is capacity gone, in every budget. Cordoned by someone else
    (`cordoned:<VmId>`), or still held by se-bridge's own drain (`held:<VmId>`, see HELD)."""
    impact: dict[str, frozenset[str]] = {}
    for vm in vms:
        if vm.cordoned:
            impact[CORDONED + vm.vm_id] = frozenset((vm.vm_id,))
        if vm.held:
            impact[HELD + vm.vm_id] = frozenset((vm.vm_id,))
    return impact


def _others(
    fleet: FleetView, event: EventView, now: datetime
) -> tuple[set[str], list[tuple[frozenset[str], frozenset[Scope]]]]:
    """What the other events impact, and per other event the names it counts that no VM is
    known by, with where they may be."""
    others: set[str] = set()
    strays: list[tuple[frozenset[str], frozenset[Scope]]] = []
    for event_id, vms in fleet.impacted.items():
        if event_id.startswith(HELD) and not fleet.alive(event_id[len(HELD) :], now):
            continue
        if event_id != event.event_id:
            others |= vms
            names = frozenset(v for v in vms if v not in fleet.vms)
            if names:
                strays.append((names, fleet.reach.get(event_id, frozenset())))
    return others, strays


def _holds(kind: str, fleet: FleetView, group: Iterable[str], scopes: Iterable[Scope]) -> bool:
    """`can_hold` for a group of VmIds of `fleet.vms` (all of one group: any one tells)."""
    sample = next((fleet.vms[v] for v in group if v in fleet.vms), None)
    return sample is None or can_hold(kind, sample, scopes)


def budget_use(budgets: tuple[Budget, ...], fleet: FleetView, now: datetime) -> dict[str, float]:
    """Per budget: impacted VMs over the limit in its fullest group (the metrics' gauge)."""
    impacted = {vm for vms in fleet.impacted.values() for vm in vms}
    members = [v for v in fleet.vms.values() if v.vm_id in impacted or fleet.alive(v.vm_id, now)]
    use: dict[str, float] = {}
    for budget in budgets:
        groups = groups_of(budget.group, members).values()
        ratios = [len(group & impacted) / budget.limit(len(group)) for group in groups]
        use[budget.name] = max(ratios, default=0.0)
    return use


def _note(notes: list[str] | None, line: str) -> None:
    if notes is not None:
        notes.append(line)


def _keys(kind: str, fleet: FleetView, event: EventView) -> set[str]:
    keys = set()
    for vm_id in (*event.affected, *event.possible):
        vm = fleet.vms.get(vm_id)
        key = None if vm is None else group_key(kind, vm)
        if key is not None:
            keys.add(key)
    return keys
