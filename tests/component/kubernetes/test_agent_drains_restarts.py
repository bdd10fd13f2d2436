"""A real agent with [kubernetes] on, stopped and started again: a drain taken up again, a node
still said to be held until its uncordon, and two events on one node whose marks pass from one to
the other, across a restart too."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.kubernetes.drain import CORDONED_FOR, TAINT_KEY
from bridge.simulator.fleet import EventSpec
from tests.component.kubernetes.drainrig import (
    NODE,
    Sim,
    beats,
    hooks,
    settings,
    two_drained_events,
    until,
)
from tests.doubles.kubeapi import KubeApiDouble
from tests.support.agentharness import VM
from tests.support.approvals import Harness


def test_a_restarted_agent_says_its_node_is_held_until_it_uncordoned_it(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    # The consumer frees the pool's slot when the node is back (NodeDraining cleared), not when
    # its event ended: an agent restarted before its uncordon must still say the node is held.
    simulator, _ = sim
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    harness.start(channel=None, kubernetes=settings(kube, tmp_path))
    until(harness, lambda: hooks(harness, "Drained"), "the drain")
    kube.down()
    simulator.cancel_event(event)
    until(harness, lambda: any(e["Transition"] == "Canceled" for e in harness.records("Event")),
          "the Canceled record")  # fmt: skip
    harness.stop()
    harness.start(channel=None, kubernetes=settings(kube, tmp_path))
    [start] = until(harness, lambda: beats(harness, "Start")[1:], "the restart")
    assert start["NodeDraining"] == event
    kube.up()
    until(harness, lambda: hooks(harness, "Uncordoned"), "the uncordon once the API answers")
    node = until(harness, lambda: beats(harness, "Node"), "a Node heartbeat")
    assert node[-1]["NodeDraining"] is None


def test_a_restart_mid_drain_takes_the_drain_up_again(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    simulator, _ = sim
    kube.add_budget("shop", "web-pdb", {"app": "web"}, allowed=0)
    simulator.add_event(EventSpec("Reboot", (VM,)))
    harness.start(channel=None, kubernetes=settings(kube, tmp_path))
    until(harness, lambda: hooks(harness, "Blocked"), "the blocked drain")
    harness.stop()
    kube.allow("web-pdb", 1)
    harness.start(channel=None, kubernetes=settings(kube, tmp_path))
    until(harness, lambda: hooks(harness, "Drained"), "the drain, resumed")
    assert len(hooks(harness, "Drained")) == 1
    assert kube.pods(NODE) == ["kube-system/proxy"]


@pytest.mark.parametrize("first_to_end", [0, 1])
def test_two_events_on_one_node_keep_it_cordoned_until_both_ended(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path, first_to_end: int
) -> None:
    """One taint key per node (Kubernetes allows one taint per key and effect), so the second
    event's drain finds the node marked for the first: the end of either must not uncordon the
    node while the other's drain holds it, and the end of both leaves none of their marks."""
    simulator, _ = sim
    marked, second = two_drained_events(simulator, harness, kube, tmp_path)
    events = (marked, second)
    ending, staying = events[first_to_end], events[1 - first_to_end]
    assert harness.agent is not None
    assert harness.agent.drains is not None
    drains = harness.agent.drains
    simulator.cancel_event(ending)
    until(harness, lambda: [e for e in harness.records("Event")
                            if (e["EventId"], e["Transition"]) == (ending, "Canceled")],
          "the first Canceled record")  # fmt: skip
    until(harness, lambda: drains.active() == 0, "the first event's recover step")
    node = kube.node(NODE)
    assert node["spec"]["unschedulable"] is True, node
    assert [(t["key"], t["value"]) for t in node["spec"]["taints"]] == [(TAINT_KEY, staying)]
    assert node["metadata"]["annotations"][CORDONED_FOR] == staying
    handed = [h for h in hooks(harness) if h["HookPhase"] == "recover"]
    if ending == marked:  # its marks now name the other event, which its record says
        [record] = handed
        assert (record["DrainStatus"], record["HookExitCode"]) == ("LeftCordoned", 0)
        assert f"stays cordoned for event {staying}" in record["HookOutput"]
    else:  # nothing of it was on the node: no record
        assert handed == []
    simulator.cancel_event(staying)
    until(harness, lambda: [h for h in hooks(harness, "Uncordoned") if h["EventId"] == staying],
          "the uncordon once both ended")  # fmt: skip
    node = kube.node(NODE)
    assert node["spec"]["unschedulable"] is False
    assert node["spec"]["taints"] == []
    assert CORDONED_FOR not in node["metadata"]["annotations"]


def test_after_a_restart_the_other_events_drain_still_holds_the_node(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    """Which events' drains hold the node outlives the agent: both drains finished before the
    restart, so no job is left in the spool to say so, and the end of the event the marks name
    must hand them to the other, not uncordon a node whose next maintenance was approved."""
    simulator, _ = sim
    marked, second = two_drained_events(simulator, harness, kube, tmp_path)
    harness.stop()
    harness.start(channel=None, kubernetes=settings(kube, tmp_path))
    until(harness, lambda: beats(harness, "Start")[1:], "the restart")
    simulator.cancel_event(marked)
    [record] = until(harness, lambda: [h for h in hooks(harness) if h["HookPhase"] == "recover"],
                     "the recover step of the event the marks name")  # fmt: skip
    assert (record["DrainStatus"], record["EventId"]) == ("LeftCordoned", marked)
    node = kube.node(NODE)
    assert node["spec"]["unschedulable"] is True, node
    assert [(t["key"], t["value"]) for t in node["spec"]["taints"]] == [(TAINT_KEY, second)]
    simulator.cancel_event(second)
    until(harness, lambda: [h for h in hooks(harness, "Uncordoned") if h["EventId"] == second],
          "the uncordon once both ended")  # fmt: skip
    assert kube.node(NODE)["spec"]["unschedulable"] is False


def test_a_resumed_uncordon_never_hands_the_node_to_an_event_that_ended_meanwhile(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    """The end of the event the marks name is seen with the API server down, so its uncordon
    waits in the spool; the other event ends while the agent is stopped. After the restart the
    uncordon looks at which events are open before it passes the node on: it uncordons."""
    simulator, _ = sim
    marked, second = two_drained_events(simulator, harness, kube, tmp_path)
    kube.down()
    simulator.cancel_event(marked)
    until(harness, lambda: [e for e in harness.records("Event")
                            if (e["EventId"], e["Transition"]) == (marked, "Canceled")],
          "the Canceled record")  # fmt: skip
    harness.stop()
    simulator.cancel_event(second)
    kube.up()
    harness.start(channel=None, kubernetes=settings(kube, tmp_path))
    until(harness, lambda: not kube.node(NODE)["spec"]["unschedulable"], "the uncordon")
    harness.poll(3)
    recovers = [(h["EventId"], h["DrainStatus"]) for h in hooks(harness)
                if h["HookPhase"] == "recover"]  # fmt: skip
    assert recovers == [(marked, "Uncordoned")]
    node = kube.node(NODE)
    assert node["spec"]["taints"] == []
    assert CORDONED_FOR not in node["metadata"]["annotations"]
