"""A node cannot move itself into another node pool (issue 37), on the real consumer over
SQLite: its heartbeat's pool neither fills nor enlarges another scale set's pool, the
disagreement is logged at WARNING with both names, and `policy explain` says who was left
out of the pool and why."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bridge.consumer.explain import render
from bridge.policy.model import Action, Budget, Match, Policy, Rule
from tests.component.consumer.test_core import E1, E2, Rig

POOL_A, POOL_B = "aks-poola-12345678-vmss", "aks-poolb-12345678-vmss"


def pools(path: Path, budget: Budget) -> Rig:
    rig = Rig(path, Policy(rules=(Rule("nodes", Match(), Action("approve")),), budgets=(budget,)))
    for name, scale_set in (("a0", POOL_A), ("a1", POOL_A), ("b0", POOL_B), ("b1", POOL_B)):
        rig.fleet.vm(name, scale_set=scale_set)
    return rig


def prepared(rig: Rig) -> list[str]:
    by_id = {rig.fleet.vm_id(n): n for n in rig.fleet.origins}
    return [by_id[c.vm_id] for c in rig.sender.sent if c.type == "Prepare"]


def test_a_node_of_pool_a_cannot_take_pool_bs_only_slot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rig = pools(tmp_path / "fleet.db", Budget("one-per-pool", "node_pool", max_vms=1))
    with caplog.at_level(logging.WARNING, logger="bridge.consumer"):
        rig.consumer.process([rig.fleet.node("a0", "poolb", cordoned=True),
                              rig.fleet.node("a1", "poola"), rig.fleet.node("b0", "poolb"),
                              rig.fleet.node("b1", "poolb")])  # fmt: skip
        rig.consumer.process([rig.fleet.event("b0", E1)])
        rig.fleet.advance(10)
        rig.consumer.process([rig.fleet.node(n, "poolb") for n in ("b0", "b1")])
    assert prepared(rig) == ["b0"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    said = [m for m in warned if "node pool poolb" in m]
    assert len(said) == 1, warned  # said once, not at every batch
    assert f"{POOL_A} (a0)" in said[0]
    assert f"{POOL_B} (b0, b1)" in said[0]
    rig.consumer.process([rig.fleet.event("b1", E2)])
    found = rig.consumer.explain(E2)
    assert found is not None
    text = render(found, rig.consumer.policy, as_json=False)
    assert f"left out: a0 (names pool poolb, in scale set {POOL_A})" in text


def test_two_nodes_of_pool_a_cannot_make_pool_b_look_twice_its_size(tmp_path: Path) -> None:
    rig = pools(tmp_path / "fleet.db", Budget("half-a-pool", "node_pool", max_percent=50))
    rig.consumer.process([rig.fleet.node(n, "poolb") for n in ("a0", "a1", "b0", "b1")])
    rig.consumer.process([rig.fleet.event("b0", E1)])
    rig.fleet.advance(1)
    rig.consumer.process([rig.fleet.event("b1", E2)])
    assert prepared(rig) == ["b0"]
