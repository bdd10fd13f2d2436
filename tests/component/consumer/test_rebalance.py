"""Spot rebalance recommendations on the real consumer over SQLite (issue 40, item 3): an
Advisory is never approved; with `rebalance: {drain: true}` a Kubernetes node's drain is
granted at once, within the pool's budget, and its slot is held until the recommendation
clears."""

from __future__ import annotations

from pathlib import Path

from bridge.config import ConsumerSettings
from bridge.consumer.core import Consumer
from bridge.consumer.documents import event_key
from bridge.consumer.ledger import read_ledger
from bridge.policy.model import REBALANCE_RULE, Action, Budget, Match, Policy, Rebalance, Rule
from tests.component.consumer.test_core import E1, E2, Rig
from tests.component.consumer.test_people import Notices
from tests.support.records import assert_valid

POOL = "aks-pool1-12345678-vmss"
E3 = "5D0B7A4E-1111-4C3B-8E2A-0A9B8C7D6E5F"
APPROVE_ALL = (Rule("everything", Match(), Action("approve")),)
ONE_PER_POOL = (Budget("one-per-pool", "node_pool", max_vms=1),)


def nodes(path: Path, rebalance: Rebalance | None) -> Rig:
    """Two Spot nodes of one pool, whose agents drain on a grant; a rule that approves every
    event, to show that it never approves an advisory."""
    rig = Rig(path, Policy(rules=APPROVE_ALL, budgets=ONE_PER_POOL, rebalance=rebalance))
    for name in ("n0", "n1"):
        rig.fleet.vm(name, scale_set=POOL)
    rig.consumer.process([rig.fleet.node(n, "pool1") for n in ("n0", "n1")])
    return rig


def sent(rig: Rig) -> list[tuple[str, str, str]]:
    """(command type, VM name, EventId) of every command sent."""
    by_id = {rig.fleet.vm_id(n): n for n in rig.fleet.origins}
    return [(c.type, by_id[c.vm_id], c.event_id) for c in rig.sender.sent]


def test_a_recommendation_drains_its_node_at_once_within_the_pools_budget(tmp_path: Path) -> None:
    rig = nodes(tmp_path / "fleet.db", Rebalance(drain=True))
    raised = [rig.fleet.advisory("n0", E1)]
    for record in raised:
        assert_valid(record)
    rig.consumer.process(raised)
    assert sent(rig) == [("Prepare", "n0", E1)]
    # The pool's one slot is n0's drain now: n1's recommendation waits for it.
    rig.fleet.advance(5)
    rig.consumer.process([rig.fleet.advisory("n1", E2)])
    assert sent(rig) == [("Prepare", "n0", E1)]
    # So does an ordinary event on n1: the drain took the slot as an approval takes it.
    rig.consumer.process([rig.fleet.event("n1", E3)])
    assert sent(rig) == [("Prepare", "n0", E1)]
    # Drained: still nothing approved, and the slot stays taken.
    rig.fleet.advance(5)
    rig.consumer.process([rig.fleet.drain("n0", E1, "Drained", exit_code=0)])
    assert [c[0] for c in sent(rig)] == ["Prepare"]
    assert event_key(E1) in read_ledger(rig.store).events
    # The recommendation clears: the slot is free and n1's drain is granted.
    rig.fleet.advance(5)
    rig.consumer.process([rig.fleet.advisory("n0", E1, "Cleared")])
    assert event_key(E1) not in read_ledger(rig.store).events
    rig.fleet.advance(5)
    rig.consumer.tick()  # deferred events are looked at again
    assert ("Prepare", "n1", E2) in sent(rig) or ("Prepare", "n1", E3) in sent(rig)
    assert not any(kind == "Approve" and event in (E1, E2) for kind, _, event in sent(rig))
    rules = {(d["EventId"], d["DecisionRule"]) for d in rig.decisions}
    assert (E1, REBALANCE_RULE) in rules


def test_without_a_rebalance_section_a_recommendation_is_only_recorded(tmp_path: Path) -> None:
    rig = nodes(tmp_path / "fleet.db", None)
    rig.consumer.process([rig.fleet.advisory("n0", E1)])
    assert sent(rig) == []
    assert read_ledger(rig.store).events == {}
    # Nothing was taken from the budget: an event on the other node is approved at once.
    rig.consumer.process([rig.fleet.event("n1", E2)])
    assert [c[0] for c in sent(rig)] == ["Prepare"]  # its drain first, as any event's


def test_a_recommendation_an_agent_wrote_as_an_event_is_never_approved(tmp_path: Path) -> None:
    # An agent with agent.spot_rebalance off, should the GA api-version ever list one.
    rig = nodes(tmp_path / "fleet.db", None)
    event = rig.fleet.event("n0", E1, event_type="SpotRebalanceRecommendation")
    rig.consumer.process([event])
    rig.fleet.advance(60)
    rig.consumer.tick()
    assert sent(rig) == []
    assert read_ledger(rig.store).events == {}


def test_rebalance_notify_tells_its_target_once(tmp_path: Path) -> None:
    rig = nodes(tmp_path / "fleet.db", Rebalance(drain=True, notify="ops"))
    told = Notices()
    rig.consumer = Consumer(rig.store, rig.sender, rig.consumer.policy, rig.decisions.extend,
                            ConsumerSettings(), now=lambda: rig.fleet.now,
                            notifier=told)  # fmt: skip
    rig.consumer.process([rig.fleet.advisory("n0", E1)])
    rig.fleet.advance(5)
    rig.consumer.process([rig.fleet.drain("n0", E1, "Drained", exit_code=0)])
    rig.consumer.tick()
    assert [(n.kind, n.target, n.event_id) for n in told.told] == [("rebalance", "ops", E1)]
    assert told.told[0].event_type == "SpotRebalanceRecommendation"
