"""Kubernetes nodes on the real consumer (issue 30): a drain is granted within the budgets (a
Prepare command), approvals come only once the drains finished, a node cordoned by someone
else counts in its pool's budget, blocked drains are explained, and a refused Prepare does
not stall its event."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from bridge.commands.message import Command
from bridge.config import ConsumerSettings
from bridge.consumer.core import Consumer
from bridge.consumer.ledger import read_ledger
from bridge.policy.model import Action, Budget, Match, Policy, Rule
from bridge.retry import RetryableError
from tests.component.consumer.test_core import E1, E2, InterleavingStore, Rig
from tests.component.consumer.test_followed import explain
from tests.support.records import assert_valid

POOL = "aks-pool1-vmss"
N0, N1 = "aks-pool1-0", "aks-pool1-1"
ONE_PER_POOL = Budget("one-node-per-pool", "node_pool", max_vms=1)


def nodes_rig(path: Path, action: Action, *budgets: Budget) -> Rig:
    rig = Rig(path, Policy(rules=(Rule("nodes", Match(), action),), budgets=budgets))
    for name in (N0, N1):
        rig.fleet.vm(name, scale_set=POOL)
    rig.consumer.process([rig.fleet.node(n, "pool1") for n in (N0, N1)])
    return rig


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Rig]:
    made = nodes_rig(tmp_path / "fleet.db", Action("approve_when_ready"), ONE_PER_POOL)
    yield made
    made.store.close()


def sent(rig: Rig, kind: str) -> list[Command]:
    return [c for c in rig.sender.sent if c.type == kind]


def names(rig: Rig, commands: list[Command]) -> list[str]:
    by_id = {rig.fleet.vm_id(n): n for n in rig.fleet.origins}
    return [by_id[c.vm_id] for c in commands]


def test_the_second_node_of_a_pool_is_not_granted_until_the_first_is_back(pool: Rig) -> None:
    rig = pool
    rig.consumer.process([rig.fleet.event(N0, E1)])
    rig.fleet.advance(1)
    rig.consumer.process([rig.fleet.event(N1, E2)])
    assert names(rig, sent(rig, "Prepare")) == [N0]
    assert sent(rig, "Approve") == []
    granted = [d for d in rig.decisions if d["DecisionAction"] == "Defer"]
    assert f"drain granted on {N0}" in granted[0]["DecisionReason"]
    for decision in rig.decisions:
        assert_valid(decision)
    assert read_ledger(rig.store).events[E1.lower()]["origin"] == "granted"

    rig.fleet.advance(5)
    rig.consumer.process([rig.fleet.drain(N0, E1, "Draining")])
    rig.fleet.advance(20)
    rig.consumer.process([rig.fleet.drain(N0, E1, "Drained", exit_code=0)])
    assert names(rig, sent(rig, "Approve")) == [N0]
    approved = rig.decisions[-1]
    assert f"the drain finished on {N0}" in str(approved["DecisionExplanation"])
    rig.consumer.process([rig.fleet.approval(sent(rig, "Approve")[0])])
    rig.fleet.advance(5)
    rig.consumer.process([rig.fleet.event(N0, E1, transition="Started")])
    rig.consumer.tick()
    assert names(rig, sent(rig, "Prepare")) == [N0]  # the pool's one slot is E1's

    rig.fleet.advance(300)
    rig.consumer.process([rig.fleet.event(N0, E1, transition="Completed"),
                          *(rig.fleet.node(n, "pool1") for n in (N0, N1))])  # fmt: skip
    rig.consumer.tick()
    assert names(rig, sent(rig, "Prepare")) == [N0, N1]


def test_an_event_of_two_nodes_is_approved_only_once_both_drains_finished(tmp_path: Path) -> None:
    rig = nodes_rig(tmp_path / "fleet.db", Action("approve"), Budget("two", "fleet", max_vms=2))
    both = [N0, N1]
    rig.consumer.process([rig.fleet.event(n, E1, resources=both) for n in both])
    assert sorted(names(rig, sent(rig, "Prepare"))) == both
    rig.fleet.advance(10)
    rig.consumer.process([rig.fleet.drain(N0, E1, "Drained", exit_code=0),
                          rig.fleet.drain(N1, E1, "Draining")])  # fmt: skip
    rig.consumer.tick()
    assert sent(rig, "Approve") == []
    rig.fleet.advance(10)
    rig.consumer.process([rig.fleet.drain(N1, E1, "Drained", exit_code=0)])
    assert len(sent(rig, "Approve")) == 1
    # The slot taken for the drains became the approval's: the event counts once.
    entries = read_ledger(rig.store).events
    assert list(entries) == [E1.lower()]
    assert entries[E1.lower()]["origin"] == "approved"
    assert sorted(entries[E1.lower()]["vms"]) == sorted(rig.fleet.vm_id(n) for n in both)
    assert len(sent(rig, "Prepare")) == 2  # never granted again


def test_a_node_cordoned_by_someone_else_fills_its_pools_budget(tmp_path: Path) -> None:
    rig = nodes_rig(tmp_path / "fleet.db", Action("approve"), ONE_PER_POOL)
    rig.fleet.advance(10)
    rig.consumer.process([rig.fleet.node(N1, "pool1", cordoned=True)])
    rig.consumer.process([rig.fleet.event(N0, E1)])
    assert rig.sender.sent == []
    found = rig.consumer.explain(E1)
    assert found is not None
    assert found.verdict is not None
    assert found.verdict.kind == "Defer"
    assert any(f"{N1} cordoned by someone else" in line for line in found.verdict.explanation)
    rig.fleet.advance(30)
    rig.consumer.process([rig.fleet.node(N1, "pool1", cordoned=False)])
    rig.consumer.tick()
    assert names(rig, sent(rig, "Prepare")) == [N0]


def test_a_blocked_drain_shows_in_policy_explain_and_the_decision(
    pool: Rig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rig = pool
    records = [rig.fleet.node(n, "pool1") for n in (N0, N1)]
    rig.consumer.process([rig.fleet.event(N0, E1)])
    records.append(rig.fleet.event(N0, E1))
    blocker: dict[str, str | None] = {
        "Namespace": "shop",
        "Pod": "web-1",
        "Reason": "EvictionRefused",
        "PodDisruptionBudget": "web-pdb",
    }
    for seconds in (10, 240):
        rig.fleet.advance(seconds)
        records.append(rig.fleet.drain(N0, E1, "Blocked", blockers=[blocker]))
        rig.consumer.process(records[-1:])
    line = f"drain on {N0} blocked 4 min: pod shop/web-1 (PDB web-pdb refused eviction)"
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nbudgets: [{name: one-node-per-pool, group: node_pool, "
                      "max_vms: 1}]\nrules: [{name: nodes, action: {approve_when_ready: "
                      "{deadline: 30m}}}]\n", encoding="utf-8")  # fmt: skip
    found = rig.consumer.explain(E1)
    assert found is not None
    assert found.verdict is not None
    assert line in found.verdict.explanation
    # From the fleet state (on this machine's clock: only what does not depend on it).
    state = f"sqlite:{tmp_path / 'fleet.db'}"
    said = json.loads(explain("--policy", str(policy), "--state", state, "--event", E1, "--json",
                              capsys=capsys))  # fmt: skip
    assert said["Drains"][0]["DrainStatus"] == "Blocked"
    assert said["Drains"][0]["DrainBlockers"] == [blocker]
    # From the agent's own records (its jsonl sink), as of the newest.
    sink = tmp_path / "records.jsonl"
    sink.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert line in explain("--policy", str(policy), "--records", str(sink), capsys=capsys)
    decision = rig.decisions[-1]
    assert decision["DecisionAction"] == "Defer"
    assert "blocked" in decision["DecisionReason"]
    # Said as the drain got blocked.
    assert f"drain on {N0} blocked 0 s: pod shop/web-1 (PDB web-pdb refused eviction)" in str(
        decision["DecisionExplanation"]
    )
    assert sent(rig, "Approve") == []


def test_an_agent_that_refuses_prepare_does_not_stall_its_event(tmp_path: Path) -> None:
    rig = nodes_rig(tmp_path / "fleet.db", Action("approve"), ONE_PER_POOL)
    rig.consumer.process([rig.fleet.event(N0, E1)])
    prepare = sent(rig, "Prepare")
    assert names(rig, prepare) == [N0]
    rig.fleet.advance(2)
    # A resent Prepare the agent is already acting on is refused as a replay: still drained.
    replayed = rig.fleet.approval(prepare[0], "Refused", detail="Replayed: command was ...")
    rig.consumer.process([{**replayed, "RecordId": "replayed"}])
    rig.consumer.tick()
    assert sent(rig, "Approve") == []
    rig.fleet.advance(2)
    refused = rig.fleet.approval(prepare[0], "Refused", detail="Prepare: this agent does not drain")
    rig.consumer.process([refused])
    for _ in range(3):
        rig.fleet.advance(timedelta(minutes=1).total_seconds())
        rig.consumer.tick()
    assert names(rig, sent(rig, "Approve")) == [N0]
    assert len(sent(rig, "Prepare")) == 1


def test_a_grant_whose_prepare_failed_to_send_is_sent_again_without_a_second_slot(
    pool: Rig,
) -> None:
    rig = pool
    rig.sender.failures = 1
    with pytest.raises(RetryableError):
        rig.consumer.process([rig.fleet.event(N0, E1)])
    assert read_ledger(rig.store).events[E1.lower()].get("prepared") is False
    rig.fleet.advance(5)
    rig.consumer.tick()
    assert names(rig, sent(rig, "Prepare")) == [N0]
    entry = read_ledger(rig.store).events[E1.lower()]
    assert (entry["origin"], entry.get("prepared")) == ("granted", True)
    rig.consumer.tick()
    assert len(sent(rig, "Prepare")) == 1
    granted = [d for d in rig.decisions if "drain granted" in d["DecisionReason"]]
    assert len(granted) == 1


def test_a_grant_by_another_consumer_fills_the_pool_for_this_one(tmp_path: Path) -> None:
    rig = nodes_rig(tmp_path / "fleet.db", Action("approve"), ONE_PER_POOL)
    store = InterleavingStore(tmp_path / "fleet.db")
    late = Consumer(store, rig.sender, rig.consumer.policy, rig.decisions.extend,
                    ConsumerSettings(), now=lambda: rig.fleet.now)  # fmt: skip
    rig.fleet.advance(1)
    store.between.append(lambda: rig.consumer.process([rig.fleet.event(N0, E1)]))
    late.process([rig.fleet.event(N1, E2)])
    assert names(rig, sent(rig, "Prepare")) == [N0]
    assert [d["DecisionAction"] for d in rig.decisions] == ["Defer", "Defer"]
    assert "would exceed 1" in rig.decisions[-1]["DecisionReason"]
    store.close()


def test_a_drain_that_gave_up_with_hold_holds_its_event_and_keeps_the_slot(pool: Rig) -> None:
    rig = pool
    rig.consumer.process([rig.fleet.event(N0, E1)])
    rig.fleet.advance(600)
    rig.consumer.process([rig.fleet.drain(N0, E1, "GaveUp", exit_code=1),
                          *(rig.fleet.node(n, "pool1") for n in (N0, N1))])  # fmt: skip
    assert sent(rig, "Approve") == []
    held = rig.decisions[-1]
    assert held["DecisionAction"] == "Hold"
    assert held["DecisionReason"].startswith(f"the drain on {N0} ended without the node ready")
    # The node was drained and stays cordoned until its event ends: the pool's slot is taken.
    rig.fleet.advance(1)
    rig.consumer.process([rig.fleet.event(N1, E2)])
    rig.consumer.tick()
    assert names(rig, sent(rig, "Prepare")) == [N0]
    assert E1.lower() in read_ledger(rig.store).events


def test_an_agent_restarted_before_it_read_its_node_keeps_its_pool(pool: Rig) -> None:
    """Found by the drain chaos run: the heartbeat an agent sends at start names its node but
    not yet its pool (it has not read the node) nor whether someone cordoned it. Taken as "no
    pool", the node left its pool's budget group, the other node's drain was granted too, and
    each drained node then waited for the other's slot until NotBefore."""
    rig = pool
    rig.consumer.process([rig.fleet.event(N0, E1)])
    assert names(rig, sent(rig, "Prepare")) == [N0]
    rig.fleet.advance(2)
    restarted = rig.fleet.heartbeat(N0, prepare_hook=True, node=N0, pool=None, cordoned=None)
    rig.consumer.process([restarted])
    rig.fleet.advance(1)
    rig.consumer.process([rig.fleet.event(N1, E2)])
    rig.consumer.tick()
    assert names(rig, sent(rig, "Prepare")) == [N0]
    waiting = [d for d in rig.decisions if d["EventId"] == E2][-1]
    assert "budget one-node-per-pool" in str(waiting["DecisionExplanation"])


def test_a_node_still_cordoned_after_its_event_holds_its_pools_slot(pool: Rig) -> None:
    # The event's slot is freed when it completes; the node comes back only when its agent
    # has uncordoned it, which its heartbeat says (NodeDraining cleared). Until then the
    # next node of the pool waits.
    rig = pool
    held = {"node": N0, "pool": "pool1", "prepare_hook": True, "cordoned": False}
    rig.consumer.process([rig.fleet.event(N0, E1)])
    rig.fleet.advance(1)
    rig.consumer.process([rig.fleet.heartbeat(N0, draining=E1, **held),  # type: ignore[arg-type]
                          rig.fleet.drain(N0, E1, "Drained", exit_code=0)])  # fmt: skip
    rig.consumer.process([rig.fleet.approval(sent(rig, "Approve")[0])])
    rig.fleet.advance(300)
    rig.consumer.process([rig.fleet.event(N0, E1, transition="Completed"),
                          rig.fleet.event(N1, E2)])  # fmt: skip
    rig.consumer.tick()
    assert names(rig, sent(rig, "Prepare")) == [N0]
    said = rig.consumer.explain(E2)
    assert said is not None
    assert said.verdict is not None
    assert any(f"{N0} still cordoned by se-bridge" in line for line in said.verdict.explanation)

    rig.fleet.advance(5)
    rig.consumer.process([rig.fleet.heartbeat(N0, "Node", draining=None, **held)])  # type: ignore[arg-type]
    rig.consumer.tick()
    assert names(rig, sent(rig, "Prepare")) == [N0, N1]
