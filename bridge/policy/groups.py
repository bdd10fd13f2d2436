"""Budget groups: which group of a kind a VM is in (`group_key`), the groups of a fleet
(`group_index`), which groups a VM no agent reports may be in (`can_hold`), and what the
nodes' self-reported pools and what Azure proves disagree on (`pool_disputes`).

A group's key is what Azure keeps about the VM (subscription, resource group, scale set, zone,
domains, tags), never only what its agent says: a node's pool label chooses no group within a
scale set (issue 37, docs/policy.md#a-pools-key).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from bridge.policy.model import (
    Scope,
    VmView,
    scope_of,
)
from bridge.policy.wording import listed


def group_key(group: str, vm: VmView) -> str | None:
    """The group `vm` belongs to for a budget over `group`; None when it belongs to none."""
    if group.startswith("tag:"):
        wanted = group[4:].lower()
        value = next((v for k, v in vm.tags.items() if k.lower() == wanted), None)
        return None if value is None else f"{group[4:]}={value}"
    # Resource group names repeat across subscriptions (rg-prod in each), and a zone number
    # is each subscription's own mapping of the region's zones: every key starts with the
    # subscription, or two groups of the same name share one budget.
    sub = vm.subscription_id or "-"
    if group in ("fault_domain", "update_domain"):
        number = vm.fault_domain if group == "fault_domain" else vm.update_domain
        # IMDS does not name the availability set, so a domain is scoped by group and scale set.
        scope = f"{sub}/{vm.resource_group}/{vm.scale_set or 'availability set'}"
        return None if number is None else f"{scope}/{group.replace('_', ' ')} {number}"
    scale_set = f"{sub}/{vm.resource_group}/{vm.scale_set}" if vm.scale_set else None
    if group == "node_pool":
        # A heartbeat's pool is the node's own word (a label): within a scale set it chooses
        # nothing, or a node (or a forged heartbeat) could leave its pool's group for one of its
        # own and take a second slot (issue 37); nor does it reach past the scale set, or it
        # could fill or enlarge another pool's group, and two clusters' pools of one name in
        # one resource group would merge. AKS's tag, which Azure keeps, names the pool where
        # the VM has one; else a scale set is one pool. Outside scale sets the label is all
        # there is.
        tag = aks_pool(vm)
        if scale_set is not None:
            return f"{scale_set}/pool {tag}" if tag else scale_set
        pool = tag or vm.node_pool
        return None if pool is None else f"{sub}/{vm.resource_group}/pool {pool}"
    keys = {
        "fleet": "fleet",
        "scale_set": scale_set,
        "zone": f"{sub}/{vm.location}/zone {vm.zone}" if vm.zone else None,
        "resource_group": f"{sub}/{vm.resource_group}" if vm.resource_group else None,
    }
    return keys.get(group)


# AKS tags each node pool's scale set (and a virtual-machines pool's VMs) with the pool's name;
# a VM sees its tags in IMDS and cannot change them.
AKS_POOL_TAG = "aks-managed-poolName"


def aks_pool(vm: VmView) -> str | None:
    return next((v for k, v in vm.tags.items() if k.lower() == AKS_POOL_TAG.lower() and v), None)


def pool_of(vm: VmView) -> str | None:
    """The node pool `vm` is known by: AKS's tag where the VM has it, else its heartbeat's
    (which puts it in a group only outside scale sets, `group_key`)."""
    return aks_pool(vm) or vm.node_pool


# Pools' VMs by where they are and what they are split by, each part's label, and the sentence.
_Split = tuple[Mapping[Any, Mapping[Any, list[VmView]]], Callable[[VmView], str], str]


def pool_disputes(vms: Iterable[VmView]) -> list[str]:
    """What the node pools the heartbeats name and what the VMs' scale sets and AKS tags prove
    disagree on, a sentence each (the consumer logs them at WARNING): a pool named by the nodes
    of more than one scale set (or of one and of none) of a resource group, the nodes of one
    scale set without AKS's tag naming more than one pool, and a VM whose heartbeat names a
    pool its AKS tag does not. Sorted, so the same fleet says the same."""
    said: list[str] = []
    named: dict[tuple[str | None, str, str], dict[str | None, list[VmView]]] = {}
    untagged: dict[tuple[str | None, str, str], dict[str, list[VmView]]] = {}
    for vm in vms:
        tag = aks_pool(vm)
        if tag and vm.node_pool and vm.node_pool.lower() != tag.lower():
            said.append(
                f"VM {vm.name} names node pool {vm.node_pool}, but its AKS tag "
                f"{AKS_POOL_TAG} says {tag}: it counts in pool {tag}"
            )
        if not tag and vm.scale_set and vm.node_pool:
            where = (vm.subscription_id, (vm.resource_group or "").lower(), vm.scale_set.lower())
            untagged.setdefault(where, {}).setdefault(vm.node_pool.lower(), []).append(vm)
        pool = pool_of(vm)
        if pool is not None:
            where = (vm.subscription_id, (vm.resource_group or "").lower(), pool.lower())
            named.setdefault(where, {}).setdefault(
                vm.scale_set.lower() if vm.scale_set else None, []
            ).append(vm)
    splits: tuple[_Split, ...] = (
        (
            named,
            lambda v: v.scale_set or "no scale set",
            "node pool {pool} of {where} is named by the nodes of more than one scale set: "
            "{parts}; a pool is one scale set's, so each counts in a node_pool budget as a pool "
            "of its own",
        ),
        (
            untagged,
            lambda v: v.node_pool or "",
            "the nodes of scale set {scale_set} of {where} name more than one node pool: {parts}; "
            f"without the {AKS_POOL_TAG} tag a scale set is one pool, so they all count in it",
        ),
    )
    for groups, label, sentence in splits:
        for (sub, _, _), parts in groups.items():
            if len(parts) > 1:
                first = next(iter(parts.values()))[0]
                said.append(
                    sentence.format(
                        pool=pool_of(first),
                        scale_set=first.scale_set,
                        where=f"{sub or '-'}/{first.resource_group}",
                        parts=_split(parts, label),
                    )
                )
    return sorted(said)


def _split(parts: Mapping[Any, list[VmView]], label: Callable[[VmView], str]) -> str:
    """Each part's label with the names of its VMs, sorted: `a (vm0), b (vm1, vm2)`."""
    return ", ".join(
        sorted(
            f"{label(members[0])} ({listed('{names}', sorted(v.name for v in members))[0]})"
            for members in parts.values()
        )
    )


def can_hold(kind: str, vm: VmView, scopes: Iterable[Scope]) -> bool:
    """Whether the group of kind `kind` that `vm` is in can hold a VM of one of `scopes`,
    whose zone, domains and tags are not known (no scope given: a VM of any scope).

    Every VM of a group but a `fleet` or `tag:NAME` one shares its subscription (the key
    starts with it, `group_key`); a resource group's and a node pool's also its resource
    group; a scale set's and a domain's the whole scope (a domain outside scale sets is the
    resource group's availability-set VMs). Of a zone only the subscription is known. A scope
    missing its subscription or resource group (a VM whose identity is not known yet) may be
    anywhere.
    """
    given = tuple(scopes)
    if not given or kind == "fleet" or kind.startswith("tag:"):
        return True
    # A node pool of VMs outside scale sets may hold any of its resource group's.
    pooled_apart = kind == "node_pool" and not vm.scale_set
    width = 2 if pooled_apart else {"zone": 1, "resource_group": 2}.get(kind, 3)
    mine = scope_of(vm)[:width]
    return any(None in scope[:2] or scope[:width] == mine for scope in given)


def group_index(
    kinds: Iterable[str], vms: Mapping[str, VmView]
) -> dict[str, dict[str, frozenset[str]]]:
    """Per budget group kind: each group's key and every known VM in it, live or not, in the
    order of `vms` (so explanations list groups in the same order every time)."""
    index: dict[str, dict[str, frozenset[str]]] = {}
    for kind in set(kinds):
        index[kind] = {key: frozenset(ids) for key, ids in groups_of(kind, vms.values()).items()}
    return index


def groups_of(group: str, vms: Iterable[VmView]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for vm in vms:
        key = group_key(group, vm)
        if key is not None:
            out.setdefault(key, set()).add(vm.vm_id)
    return out
