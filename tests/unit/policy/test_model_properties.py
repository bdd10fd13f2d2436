"""Property: a greedy approver that follows every Approve verdict never breaks a budget.

The fleet, the budgets and a sequence of steps (new events, retries of deferred ones, events the
platform starts on its own, completions) are random. After every step, the VMs impacted by
*approved* events fit every budget group. Platform-started events are counted as impact (so
they can make approvals wait) but are not held to the budgets: nobody approved them.

The groups and limits are computed here independently of bridge.policy.model, so a shared mistake
cannot hide.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.policy.evaluation import evaluate
from bridge.policy.groups import group_index
from bridge.policy.model import (
    GROUP_KINDS,
    Action,
    Budget,
    EventView,
    FleetView,
    Match,
    Policy,
    Rule,
    VmView,
)

NOW = datetime(2024, 6, 12, 10, 0, tzinfo=timezone.utc)
Key = tuple[object, ...]


# A VM's placement; the test gives each an id and a name. Module-level, because building
# strategies inside a composite for every VM made generation most of the run time.
placements = st.fixed_dictionaries(
    {
        # The same resource group names in two subscriptions: groups must not merge.
        "subscription_id": st.sampled_from(["sub-a", "sub-b"]),
        "resource_group": st.sampled_from(["rg1", "rg2"]),
        "zone": st.sampled_from([None, "1", "2"]),
        "scale_set": st.sampled_from([None, "web", "db"]),
        "fault_domain": st.sampled_from([None, 0, 1]),
        "update_domain": st.sampled_from([None, 0, 1, 2]),
        "tags": st.sampled_from([{}, {"tier": "db"}, {"Tier": "web"}, {"owner": "db"}]),
        "node_pool": st.sampled_from([None, "pool1", "pool2"]),
    }
)


def make_vm(index: int, placement: dict[str, Any]) -> VmView:
    return VmView(f"id{index}", f"vm{index}", location="westeurope", last_seen=NOW, **placement)


def budget(group: str, limit: int | float) -> Budget:
    if isinstance(limit, int):
        return Budget("b", group, max_vms=limit)
    return Budget("b", group, max_percent=limit)


budgets = st.builds(
    budget,
    st.sampled_from([*GROUP_KINDS, "tag:tier"]),
    st.integers(1, 4) | st.sampled_from([10.0, 25.0, 33.3, 50.0, 100.0]) | st.floats(0.5, 100),
)


@dataclass(frozen=True)
class Step:
    kind: str  # "new" | "retry" | "start" | "complete"
    vms: frozenset[int]
    unresolved: int
    pick: int


steps = st.builds(
    Step,
    kind=st.sampled_from(["new", "new", "new", "retry", "start", "complete", "complete"]),
    vms=st.frozensets(st.integers(0, 11), min_size=1, max_size=4),
    unresolved=st.sampled_from([0, 0, 0, 1]),
    pick=st.integers(0, 50),
)


def group_of(group: str, vm: VmView) -> Key | None:
    """Which group of `group` the VM is in, spelled out independently of policy.group_key."""
    tags = {k.lower(): v for k, v in vm.tags.items()}
    where = (vm.subscription_id, vm.resource_group, vm.scale_set)
    keys_scale_set = where if vm.scale_set else None
    keys: dict[str, Key | None] = {
        "fleet": ("fleet",),
        "scale_set": where if vm.scale_set else None,
        "zone": (vm.subscription_id, vm.location, vm.zone) if vm.zone else None,
        "fault_domain": (*where, "fd", vm.fault_domain) if vm.fault_domain is not None else None,
        "update_domain": (*where, "ud", vm.update_domain) if vm.update_domain is not None else None,
        "resource_group": (vm.subscription_id, vm.resource_group) if vm.resource_group else None,
        # A scale set (no AKS tag here: a heartbeat's pool chooses nothing within it), or
        # outside scale sets the resource group's nodes naming one pool.
        "node_pool": keys_scale_set or ((*where, "pool", vm.node_pool) if vm.node_pool else None),
        "tag:tier": ("tier", tags["tier"]) if "tier" in tags else None,
    }
    return keys[group]


def members(budget: Budget, fleet: Mapping[str, VmView]) -> dict[Key, set[str]]:
    out: dict[Key, set[str]] = {}
    for vm in fleet.values():
        key = group_of(budget.group, vm)
        if key is not None:
            out.setdefault(key, set()).add(vm.vm_id)
    return out


def limit(budget: Budget, size: int) -> int:
    if budget.max_vms is not None:
        return budget.max_vms
    assert budget.max_percent is not None
    return max(1, math.floor(budget.max_percent * size / 100))


def fits(budgets: list[Budget], fleet: Mapping[str, VmView], impacted: set[str],
         touched: set[str] | None = None) -> bool:  # fmt: skip
    """Every group (or only those `touched` shares) has at most its limit of `impacted` VMs."""
    for budget in budgets:
        for group in members(budget, fleet).values():
            if touched is not None and not touched & group:
                continue
            if len(impacted & group) > limit(budget, len(group)):
                return False
    return True


def union(impacted: Mapping[str, frozenset[str]], keep: set[str] | None = None) -> set[str]:
    return {v for e, vms in impacted.items() if keep is None or e in keep for v in vms}


@settings(max_examples=200, deadline=None)
@given(
    placement_list=st.lists(placements, min_size=1, max_size=12),
    budget_list=st.lists(budgets, max_size=3),
    plan=st.lists(steps, max_size=25),
)
def test_a_greedy_approver_never_breaks_a_budget(
    placement_list: list[dict[str, Any]], budget_list: list[Budget], plan: list[Step]
) -> None:
    fleet = {f"id{i}": make_vm(i, p) for i, p in enumerate(placement_list)}
    fleet_size = len(fleet)
    policy = Policy(rules=(Rule("all", Match(), Action("approve")),), budgets=tuple(budget_list))
    impacted: dict[str, frozenset[str]] = {}
    approved: set[str] = set()
    waiting: list[EventView] = []
    for n, step in enumerate(plan):
        affected = tuple(sorted(f"id{i}" for i in step.vms if i < fleet_size)) or ("id0",)
        if step.kind == "start":
            impacted[f"platform{n}"] = frozenset(affected)
        elif step.kind == "complete" and impacted:
            impacted.pop(sorted(impacted)[step.pick % len(impacted)])
        elif step.kind in ("new", "retry"):
            if step.kind == "retry" and waiting:
                event = waiting.pop(step.pick % len(waiting))
            else:
                unresolved = tuple(f"ghost{n}-{i}" for i in range(step.unresolved))
                event = EventView(
                    event_id=f"e{n}", event_type="Reboot", event_source="Platform",
                    duration=-1, status="Scheduled", not_before=NOW + timedelta(minutes=15),
                    first_seen=NOW, affected=affected, unresolved=unresolved, reporters=affected,
                )  # fmt: skip
            view = FleetView(vms=fleet, impacted=dict(impacted))
            verdict = evaluate(policy, view, event, NOW)
            # A consumer deciding a batch passes the groups it sorted once: same verdict, word
            # for word.
            kinds = [budget.group for budget in budget_list]
            indexed = replace(view, groups=group_index(kinds, fleet))
            assert evaluate(policy, indexed, event, NOW) == verdict
            mine = set(event.affected)
            would_fit = fits(budget_list, fleet, union(impacted) | mine, touched=mine)
            if not event.unresolved:
                # Not over-cautious either: it approves whenever the approval fits.
                assert (verdict.kind == "Approve") == would_fit, verdict
            if verdict.kind == "Approve":
                assert would_fit, verdict
                assert verdict.target in event.affected
                impacted[event.event_id] = frozenset(event.affected)
                approved.add(event.event_id)
            else:
                assert verdict.kind in ("Defer", "Hold"), verdict
                waiting.append(event)
        assert fits(budget_list, fleet, union(impacted, keep=approved)), (step, impacted)
