"""A drain and a prepare hook on the same nodes end to end (issue 38): real agents with
`[kubernetes]` on and hooks.prepare set, against the Kubernetes API double, and a real consumer
with `approve_when_ready` and a one-node-per-pool budget. Each node is drained, then its hook
runs, then it is approved; the second node's drain waits until the first is back."""

from __future__ import annotations

import functools
import shlex

import pytest

from tests.doubles.kubeapi import KubeApiDouble
from tests.e2e.test_kubernetes import NODES, at, drains, kube, node_loop, patches, uncordoned
from tests.support.processes import Processes, Record
from tests.support.wait import eventually

pytestmark = pytest.mark.e2e
__all__ = ["kube"]  # the fixture, from the drain's own end-to-end test


def prepared(records: list[Record], event_id: str) -> list[Record]:
    return [r for r in records if r["RecordType"] == "Hook" and r.get("HookName") is None
            and r["HookPhase"] == "prepare" and r["EventId"] == event_id]  # fmt: skip


def test_each_node_is_drained_then_hooked_then_approved_one_per_pool(
    procs: Processes, kube: KubeApiDouble
) -> None:
    kube.allow("web-pdb", 1)  # nothing blocks the drains here: the order is the point
    log = procs.workdir / "hook.log"
    script = f'echo "$SE_BRIDGE_EVENT_ID $SE_BRIDGE_VM_NAME" >> "{log}"'
    hook = shlex.join(["sh", "-c", script])
    loop = node_loop(procs, kube, more={"SE_BRIDGE_HOOKS_PREPARE": hook})
    first, second = NODES
    for node in NODES:
        beat = loop.agents[node].wait_for(
            lambda rs: [r for r in rs if r["RecordType"] == "Heartbeat" and r.get("NodePool")],
            "a heartbeat naming the node's pool",
        )[-1]
        assert beat["PrepareSteps"] == ["drain", "hook"], beat
    one = loop.sim.add_event(EventType="Reboot", Resources=[first], notice=3600.0, runTime=1.0)
    two = loop.sim.add_event(EventType="Reboot", Resources=[second], notice=3600.0, runTime=1.0)
    for node, event_id in ((first, one), (second, two)):
        approval = loop.wait_approved(event_id)
        assert approval["vm"] == node
        records = loop.agents[node].records()
        [drained] = eventually(functools.partial(drains, loop, node, "Drained"),
                               what=f"{node}'s Drained record", details=loop.describe)  # fmt: skip
        [hooked] = prepared(records, event_id)
        assert hooked["HookExitCode"] == 0, hooked
        assert at(drained) <= at(hooked) <= approval["timestamp"], (drained, hooked, approval)
        loop.agents[node].wait_for(functools.partial(uncordoned, event_id=event_id),
                                   "the uncordon after the event")  # fmt: skip
    # One node per pool: the node drained second was first touched after the other was back.
    # Which goes first is whichever event the consumer read first: both come at once.
    earlier, later = sorted(NODES, key=lambda node: min(patches(kube, node)))
    assert max(patches(kube, earlier)) < min(patches(kube, later))
    events = {first: one, second: two}
    assert [a["eventId"] for a in loop.approvals()] == [events[earlier], events[later]]
