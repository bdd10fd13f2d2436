"""A node pool is what a VM's scale set (and its AKS tag) can prove, never only what its
heartbeat says (issue 37): a VM that names another pool neither fills nor enlarges it."""

from __future__ import annotations

from bridge.policy.budgets import cordoned_impact
from bridge.policy.evaluation import evaluate
from bridge.policy.groups import AKS_POOL_TAG, group_key, pool_disputes
from bridge.policy.model import Budget, VmView
from tests.unit.policy.test_model import APPROVE_ALL, NOW, event, fleet, vm, with_rules

ONE_PER_POOL = Budget("one-per-pool", "node_pool", max_vms=1)
HALF_A_POOL = Budget("half-a-pool", "node_pool", max_percent=50)


def node(n: int, scale_set: str | None, pool: str, **fields: object) -> VmView:
    return vm(n, subscription_id="s", scale_set=scale_set, node_name=f"node-{n}",
              node_pool=pool, prepare_hook=True, **fields)  # fmt: skip


def test_a_node_naming_another_pool_does_not_take_its_only_slot() -> None:
    liar = node(0, "aks-poola-vmss", "poolb", cordoned=True)
    vms = [liar, node(1, "aks-poola-vmss", "poola"), node(2, "aks-poolb-vmss", "poolb")]
    verdict = evaluate(with_rules(APPROVE_ALL, budgets=(ONE_PER_POOL,)),
                       fleet(*vms, impacted=cordoned_impact(vms)), event("id2"), NOW)  # fmt: skip
    assert verdict.grant == ("id2",)
    why = "\n".join(verdict.explanation)
    assert "has 0 of 1 VMs impacted" in why
    # Explain says who was left out of the pool and why.
    assert "left out: vm0 (names pool poolb, in scale set aks-poola-vmss)" in why


def test_nodes_naming_another_pool_do_not_make_it_look_larger() -> None:
    """Two VMs of pool A naming pool B made it look twice its size: max_percent 50 granted
    drains to both real nodes of B at once."""
    vms = [node(0, "aks-poola-vmss", "poolb"), node(1, "aks-poola-vmss", "poolb"),
           node(2, "aks-poolb-vmss", "poolb"), node(3, "aks-poolb-vmss", "poolb")]  # fmt: skip
    policy = with_rules(APPROVE_ALL, budgets=(HALF_A_POOL,))
    first = evaluate(policy, fleet(*vms), event("id2"), NOW)
    assert first.grant == ("id2",)
    busy = fleet(*vms, impacted={"e0": frozenset({"id2"})})
    second = evaluate(policy, busy, event("id3", event_id="e1"), NOW)
    assert (second.kind, second.grant) == ("Defer", ())
    assert "has 1 of 2 VMs impacted" in second.reason


def test_two_clusters_whose_pools_share_a_name_in_one_resource_group_stay_apart() -> None:
    vms = [node(n, f"cluster{1 + n // 2}-workers", "workers") for n in range(4)]
    policy = with_rules(APPROVE_ALL, budgets=(HALF_A_POOL,))
    busy = fleet(*vms, impacted={"e0": frozenset({"id0"})})
    assert evaluate(policy, busy, event("id1", event_id="e1"), NOW).kind == "Defer"
    assert evaluate(policy, busy, event("id2", event_id="e2"), NOW).grant == ("id2",)
    assert group_key("node_pool", vms[0]) == "s/rg/cluster1-workers"
    assert group_key("node_pool", vms[2]) == "s/rg/cluster2-workers"


def test_the_aks_pool_tag_wins_over_the_heartbeat() -> None:
    """An AKS virtual-machines pool has no scale set: Azure's tag on the VM names its pool."""
    liar = node(0, None, "poolb", cordoned=True, tags={AKS_POOL_TAG: "poola"})
    honest = node(1, None, "poolb", tags={AKS_POOL_TAG: "poolb"})
    assert group_key("node_pool", liar) == "s/rg/pool poola"
    vms = [liar, honest]
    verdict = evaluate(with_rules(APPROVE_ALL, budgets=(ONE_PER_POOL,)),
                       fleet(*vms, impacted=cordoned_impact(vms)), event("id1"), NOW)  # fmt: skip
    assert verdict.grant == ("id1",)
    assert "left out: vm0 (names pool poolb, its AKS tag says poola)" in "\n".join(
        verdict.explanation
    )


def test_each_disagreement_is_said_with_both_names() -> None:
    vms = [node(0, "aks-poola-vmss", "poolb"), node(1, "aks-poola-vmss", "poola"),
           node(2, "aks-poolb-vmss", "poolb"),
           node(3, None, "poolc", tags={AKS_POOL_TAG: "poold"})]  # fmt: skip
    said = pool_disputes(vms)
    assert said == [
        "VM vm3 names node pool poolc, but its AKS tag aks-managed-poolName says poold: it "
        "counts in pool poold",
        "node pool poolb of s/rg is named by the nodes of more than one scale set: "
        "aks-poola-vmss (vm0), aks-poolb-vmss (vm2); a pool is one scale set's, so each "
        "counts in a node_pool budget as a pool of its own",
        "the nodes of scale set aks-poola-vmss of s/rg name more than one node pool: poola "
        "(vm1), poolb (vm0); without the aks-managed-poolName tag a scale set is one pool, so "
        "they all count in it",
    ]
    assert pool_disputes(vms[1:3]) == []


def test_within_a_scale_set_a_heartbeats_pool_does_not_choose_the_group() -> None:
    """Two VMs of one scale set and no AKS tag: the one whose heartbeat names another pool
    was in a group of its own and took a second slot of a one-per-pool budget (issue 37)."""
    vms = [node(0, "aks-poola-vmss", "poola"), node(1, "aks-poola-vmss", "poolz")]
    policy = with_rules(APPROVE_ALL, budgets=(ONE_PER_POOL,))
    assert evaluate(policy, fleet(*vms), event("id0"), NOW).grant == ("id0",)
    busy = fleet(*vms, impacted={"e0": frozenset({"id0"})})
    second = evaluate(policy, busy, event("id1", event_id="e1"), NOW)
    assert (second.kind, second.grant) == ("Defer", ())
    assert "s/rg/aks-poola-vmss has 1 of 2 VMs impacted" in second.reason
    assert group_key("node_pool", vms[1]) == group_key("scale_set", vms[1])


def test_within_a_scale_set_the_aks_tag_names_the_pool_whatever_the_heartbeat_says() -> None:
    tag = {AKS_POOL_TAG: "poola"}
    vms = [node(0, "aks-poola-vmss", "poola", tags=tag),
           node(1, "aks-poola-vmss", "poolz", tags=tag)]  # fmt: skip
    assert {group_key("node_pool", v) for v in vms} == {"s/rg/aks-poola-vmss/pool poola"}
    busy = fleet(*vms, impacted={"e0": frozenset({"id0"})})
    second = evaluate(with_rules(APPROVE_ALL, budgets=(ONE_PER_POOL,)), busy,
                      event("id1", event_id="e1"), NOW)  # fmt: skip
    assert (second.kind, second.grant) == ("Defer", ())
