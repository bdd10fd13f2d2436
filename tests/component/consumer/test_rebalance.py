"""Spot rebalance recommendations on the real consumer over SQLite (issue 40, item 3): an
Advisory is never approved; with `rebalance: {drain: true}` a Kubernetes node's drain is
granted at once, within the pool's budget, and its slot is held until the recommendation
clears."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bridge.commands.signing import Signer
from bridge.config import ConsumerSettings
from bridge.consumer import status
from bridge.consumer.core import Consumer
from bridge.consumer.documents import event_key
from bridge.consumer.ledger import read_ledger
from bridge.consumer.people import page
from bridge.consumer.people.operatorlog import OperatorAction
from bridge.policy.model import (
    REBALANCE_RULE,
    Action,
    Budget,
    Match,
    Person,
    Policy,
    Rebalance,
    Rule,
)
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


def test_people_see_a_recommendation_as_an_advisory_they_cannot_approve_or_hold(
    tmp_path: Path,
) -> None:
    rig = nodes(tmp_path / "fleet.db", Rebalance(drain=True, notify="ops"))
    alice = Person("oid-alice", "Alice")
    rig.consumer = Consumer(rig.store, rig.sender, rig.consumer.policy, rig.decisions.extend,
                            ConsumerSettings(), now=lambda: rig.fleet.now,
                            signer=Signer(Ed25519PrivateKey.generate()))  # fmt: skip
    rig.consumer.process([rig.fleet.advisory("n0", E1)])
    now = rig.fleet.now
    (shown,) = rig.consumer.desk.open_events(now)
    assert shown.advisory
    assert "drain not finished on n0" in shown.reason
    # The page says what it is and what the policy did, and offers no approve or hold.
    html = page.render(page.View(alice, False, "csrf", [shown], [], {}, None, now))
    assert "advisory" in html
    assert "never approved" in html
    assert "drain not finished on n0" in html
    assert 'value="approve"' not in html
    assert 'value="hold"' not in html
    assert 'value="override"' not in html
    # An approve or a hold through the API (the desk) is refused, and says why.
    for kind in ("approve", "hold"):
        action = OperatorAction(kind, alice, "go", now, event_id=E1,
                                resources_digest=shown.resources_digest)  # fmt: skip
        answer = rig.consumer.desk.operate(action)
        assert (answer.accepted, answer.code) == (False, "Advisory")
        assert "never approved" in answer.detail
    assert sent(rig) == [("Prepare", "n0", E1)]
    # `status --consumer` lists it as an advisory, never as an ask.
    report = status.assess("state", pauses=[], events=[shown], actions=[], forged=0, now=now,
                           ask_age=timedelta(hours=1))  # fmt: skip
    assert report.asks == []
    assert [(a["event_id"], a["action"]) for a in report.advisories] == [(E1, "Defer")]
    assert "advisories open (never approved): 1" in status.render(report)
    assert "drain not finished on n0" in status.render(report)
