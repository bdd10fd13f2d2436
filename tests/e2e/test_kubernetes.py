"""Kubernetes nodes end to end (issue 30): the IMDS simulator, a real agent per node with
`[kubernetes]` on against the Kubernetes API double, and a real consumer with
`approve_when_ready` and a one-node-per-pool budget, over the local hub and command channel
with signed commands. Two nodes of one pool get an event each: the second is not drained until
the first is back, each approval follows its node's drain, and the drain a PodDisruptionBudget
blocks is visible in the records and in `policy explain`."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from datetime import datetime

import pytest

from tests.doubles.kubeapi import KubeApiDouble
from tests.e2e.test_approvals import Loop, Transport
from tests.support.processes import Processes, Record, read_records, run_bridge
from tests.support.wait import eventually

pytestmark = pytest.mark.e2e

NODES = ("aks-pool1-0", "aks-pool1-1")
FLEET = {"vms": [{"name": node} for node in NODES]}
POLICY = """\
version: 1
budgets:
  - name: one-node-per-pool
    group: node_pool
    max_vms: 1
rules:
  - name: drain-first
    action: {approve_when_ready: {deadline: 1h, on_deadline: hold}}
"""


@pytest.fixture
def kube() -> Iterator[KubeApiDouble]:
    """One pool of two nodes, three pods each beside a DaemonSet's; the first node's web pod
    is guarded by a PodDisruptionBudget that allows no disruption until the test says so."""
    with KubeApiDouble() as double:
        for n, node in enumerate(NODES):
            double.add_node(node, labels={"kubernetes.azure.com/agentpool": "pool1"})
            double.add_pod("kube-system", f"proxy-{n}", node, owner="DaemonSet")
            for pod in ("web", "cache", "worker"):
                double.add_pod("shop", f"{pod}-{n}", node, labels={"app": f"{pod}-{n}"},
                               owner="ReplicaSet", linger=0.2)  # fmt: skip
        double.add_budget("shop", "web-pdb", {"app": "web-0"}, allowed=0)
        yield double


def node_loop(procs: Processes, kube: KubeApiDouble, more: dict[str, str] | None = None) -> Loop:
    root = procs.workdir
    policy = root / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    loop = Loop(procs, Transport(root), ["--policy", str(policy)], fleet_spec=FLEET)
    kubeconfig = kube.kubeconfig(root)
    for node in NODES:
        loop.agents[node].env.update({
            "SE_BRIDGE_KUBERNETES_ENABLED": "true",
            "SE_BRIDGE_KUBERNETES_NODE_NAME": node,
            "SE_BRIDGE_KUBERNETES_KUBECONFIG": str(kubeconfig),
            "SE_BRIDGE_KUBERNETES_EVICTION_RETRY": "0.2",
            "SE_BRIDGE_KUBERNETES_BLOCKED_REPORT_INTERVAL": "1",
            **(more or {}),
        })  # fmt: skip
    return loop.start()


def drains(loop: Loop, node: str, status: str | None = None) -> list[Record]:
    return [r for r in loop.agents[node].records() if r["RecordType"] == "Hook"
            and r.get("HookName") == "drain" and status in (None, r["DrainStatus"])]  # fmt: skip


def patches(kube: KubeApiDouble, node: str) -> list[int]:
    """Where in the double's request log the PATCHes of `node` are."""
    path = f"/api/v1/nodes/{node}"
    return [n for n, r in enumerate(kube.requests) if r.verb == f"PATCH {path}"]


def uncordoned(records: list[Record], event_id: str) -> bool:
    return any(r["RecordType"] == "Hook" and r.get("DrainStatus") == "Uncordoned"
               and r["EventId"] == event_id for r in records)  # fmt: skip


def step(record: Record) -> tuple[str, str | None]:
    """A record of an event's life as (type, what it says): ("Hook", "Drained"), ..."""
    said = record.get("DrainStatus") or record.get("ApprovalOutcome") or record.get("Transition")
    return record["RecordType"], said


def decisions(loop: Loop, event_id: str) -> list[Record]:
    return [d for d in read_records(loop.decisions) if d["EventId"] == event_id]


def at(record: Record) -> float:
    return datetime.fromisoformat(record["TimeGenerated"]).timestamp()


def test_one_node_per_pool_drains_and_is_approved_only_once_drained(
    procs: Processes, kube: KubeApiDouble
) -> None:
    loop = node_loop(procs, kube)
    first, second = NODES
    # The consumer grants drains only to agents whose heartbeat names their node, and counts
    # a node in its pool's budget once a heartbeat names the pool (after the agent read it).
    for node in NODES:
        loop.agents[node].wait_for(
            lambda rs: any(r["RecordType"] == "Heartbeat" and r.get("NodePool") for r in rs),
            "a heartbeat naming the node's pool",
        )
    one = loop.sim.add_event(EventType="Reboot", Resources=[first], notice=3600.0, runTime=1.0)

    def granted(event_id: str) -> Record | None:
        return next((d for d in decisions(loop, event_id)
                     if "drain granted on" in d["DecisionExplanation"]), None)  # fmt: skip

    eventually(lambda: granted(one), what="the first node's drain granted", details=loop.describe)
    two = loop.sim.add_event(EventType="Reboot", Resources=[second], notice=3600.0, runTime=1.0)

    # The first drain is blocked by the PodDisruptionBudget, and says so.
    [blocked, *_] = eventually(lambda: drains(loop, first, "Blocked"), what="the blocked drain",
                               details=loop.describe)  # fmt: skip
    assert blocked["EventId"] == one
    assert {"Namespace": "shop", "Pod": "web-0", "Reason": "eviction refused",
            "PodDisruptionBudget": "web-pdb"} in blocked["DrainBlockers"]  # fmt: skip
    assert blocked["HookExitCode"] is None
    on_state = ["--state", f"sqlite:{loop.transport.root / 'fleet.db'}",
                "--policy", str(loop.transport.root / "policy.yaml")]  # fmt: skip

    def explain(event_id: str) -> str:
        done = run_bridge("policy", "explain", *on_state, "--event", event_id)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def names_the_blocker() -> str | None:  # once the consumer folded the Blocked record
        text = explain(one)
        return text if "web-pdb" in text else None

    said = eventually(names_the_blocker, details=lambda: explain(one))
    assert f"drain on {first} blocked" in said, said
    assert "pod shop/web-0 (PDB web-pdb refused eviction)" in said, said
    # The second event waits for the pool's one slot, which the first holds.
    eventually(lambda: decisions(loop, two), what="the second event's decision",
               details=loop.describe)  # fmt: skip
    waits = explain(two)
    assert "budget one-node-per-pool" in waits, waits
    assert "1 more would exceed 1" in waits, waits
    assert patches(kube, second) == []
    assert drains(loop, second) == []
    assert not loop.approvals()

    kube.allow("web-pdb", 1)
    for node, event_id in ((first, one), (second, two)):
        approval = loop.wait_approved(event_id)
        assert approval["vm"] == node
        [drained] = eventually(functools.partial(drains, loop, node, "Drained"),
                               what=f"{node}'s Drained record", details=loop.describe)  # fmt: skip
        assert drained["EventId"] == event_id
        assert at(drained) <= approval["timestamp"], (drained, approval)
        records = loop.agents[node].wait_for(
            functools.partial(uncordoned, event_id=event_id), "the uncordon after the event"
        )
        order = [step(r) for r in records if r.get("EventId") == event_id]
        assert order.index(("Hook", "Drained")) < order.index(("Approval", "Approved")), order
        assert order.index(("Event", "Completed")) < order.index(("Hook", "Uncordoned")), order
        assert kube.pods(node) == [f"kube-system/proxy-{NODES.index(node)}"]
    # The second node was first touched after the first node's last change, its uncordon.
    assert max(patches(kube, first)) < min(patches(kube, second))
    for node in NODES:
        spec = kube.node(node)["spec"]
        assert (spec["unschedulable"], spec["taints"]) == (False, []), spec
    assert [a["eventId"] for a in loop.approvals()] == [one, two]
