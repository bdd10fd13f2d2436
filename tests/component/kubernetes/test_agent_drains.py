"""A real agent with [kubernetes] on, against the IMDS simulator and the Kubernetes API double
through the real lightkube client: local mode and a Spot Preempt drain on sight, what the agent
writes (Hook records, heartbeats), the uncordon after, an admin's cordon, a stray taint, an API
server that does not answer, the deadline, and the settings that stop the start. Central
grants: test_agent_drains_central.py; restarts and two events: test_agent_drains_restarts.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bridge import cli
from bridge.config import ConfigError, HooksSettings, KubernetesSettings
from bridge.kubernetes.drain import CORDONED_FOR, TAINT_KEY
from bridge.policy.model import DEFAULT_POLICY
from bridge.simulator.fleet import EventSpec
from tests.component.kubernetes.drainrig import (
    NODE,
    WHEN_READY,
    Sim,
    hooks,
    posts,
    settings,
    until,
)
from tests.doubles.kubeapi import KubeApiDouble
from tests.support.agentharness import VM
from tests.support.approvals import Harness


def test_local_mode_drains_then_approves_when_drained(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    simulator, _ = sim
    kube.add_budget("shop", "web-pdb", {"app": "web"}, allowed=0)
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    harness.start(channel=None, policy=WHEN_READY, kubernetes=settings(kube, tmp_path))
    blocked = until(harness, lambda: hooks(harness, "Blocked"), "a Blocked Hook record")[0]
    assert blocked["HookName"] == "drain"
    assert blocked["HookPhase"] == "prepare"
    assert blocked["HookExitCode"] is None
    assert blocked["DrainBlockers"] == [{"Namespace": "shop", "Pod": "web-1",
                                         "Reason": "eviction refused",
                                         "PodDisruptionBudget": "web-pdb"}]  # fmt: skip
    assert hooks(harness)[0]["DrainStatus"] == "Draining"
    assert posts(simulator, event) == []  # not while the drain is blocked
    kube.allow("web-pdb", 1)
    until(harness, lambda: posts(simulator, event) == [200], "the approval after the drain")
    drained = hooks(harness, "Drained")
    assert [(h["HookExitCode"], h["EventId"]) for h in drained] == [(0, event)]
    assert kube.pods(NODE) == ["kube-system/proxy"]
    assert harness.agent is not None
    metric = harness.agent.metrics.registry.get_sample_value
    assert metric("se_bridge_agent_drains_total", {"outcome": "started"}) == 1
    assert metric("se_bridge_agent_drains_total", {"outcome": "drained"}) == 1
    assert (metric("se_bridge_agent_evictions_refused_total") or 0) >= 1
    assert (metric("se_bridge_agent_drain_blocked_total") or 0) >= 1
    beat = harness.records("Heartbeat")[0]
    assert (beat["HasPrepareHook"], beat["NodeName"]) == (True, NODE)

    def beats(field: str, value: object) -> list[dict[str, Any]]:
        return [b for b in harness.records("Heartbeat") if b[field] == value]

    node_beats = until(harness, lambda: beats("HeartbeatReason", "Node"), "a Node heartbeat")
    assert until(harness, lambda: beats("NodePool", "pool1"), "the node's pool")
    assert any(b["NodeDraining"] == event for b in node_beats)


def test_spot_preempt_drains_at_once_without_a_grant(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    simulator, _ = sim
    kube.add_budget("shop", "web-pdb", {"app": "web"}, allowed=0)
    simulator.add_event(EventSpec("Preempt", (VM,), notice=30))
    harness.start(kubernetes=settings(kube, tmp_path))
    until(harness, lambda: hooks(harness, "Drained"), "the Preempt's drain")
    assert kube.calls("POST", "/eviction") == []
    assert [r.path for r in kube.calls("DELETE")] == ["/api/v1/namespaces/shop/pods/web-1"]


def test_the_node_is_uncordoned_when_the_event_completes(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    simulator, _ = sim
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    harness.start(channel=None, kubernetes=settings(kube, tmp_path))
    until(harness, lambda: hooks(harness, "Drained"), "the drain")
    simulator.cancel_event(event)
    [undone] = until(harness, lambda: hooks(harness, "Uncordoned"), "the uncordon")
    assert (undone["HookPhase"], undone["HookExitCode"], undone["Transition"]) == (
        "recover", 0, "Canceled")  # fmt: skip
    node = kube.node(NODE)
    assert node["spec"]["unschedulable"] is False
    assert node["spec"]["taints"] == []
    assert CORDONED_FOR not in node["metadata"]["annotations"]


def test_a_node_an_admin_cordoned_stays_cordoned(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    simulator, _ = sim
    kube.set_node(NODE, {"spec": {"unschedulable": True}})
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    harness.start(channel=None, kubernetes=settings(kube, tmp_path))
    until(harness, lambda: hooks(harness, "Drained"), "the drain")
    simulator.start_event(event)
    simulator.complete_event(event)
    until(harness, lambda: hooks(harness, "LeftCordoned"), "the recover step")
    node = kube.node(NODE)
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == []
    beats = until(harness, lambda: [b for b in harness.records("Heartbeat")
                                    if b.get("NodeCordoned")], "a heartbeat saying so")  # fmt: skip
    assert beats[0]["NodeName"] == NODE


def test_a_stray_taint_is_removed_at_start(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    kube.set_node(NODE, {"spec": {"unschedulable": True, "taints": [
        {"key": TAINT_KEY, "value": "OLD-EVENT", "effect": "NoSchedule"}]},
        "metadata": {"annotations": {CORDONED_FOR: "OLD-EVENT"}}},
        manager="se-bridge")  # an earlier agent's marks  # fmt: skip
    harness.start(channel=None, kubernetes=settings(kube, tmp_path))
    [undone] = until(harness, lambda: hooks(harness, "Uncordoned"), "the stray's removal")
    assert undone["EventId"] == "OLD-EVENT"
    assert kube.node(NODE)["spec"]["unschedulable"] is False


def test_an_unreachable_api_server_blocks_nothing_and_the_node_is_uncordoned_after(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    simulator, _ = sim
    kube.add_budget("shop", "web-pdb", {"app": "web"}, allowed=0)
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    # A Freeze drains nothing here: it is ready at once.
    harness.start(channel=None, kubernetes=settings(kube, tmp_path, event_types=["Reboot"]))
    until(harness, lambda: hooks(harness, "Blocked"), "the blocked drain")
    kube.down()
    simulator.cancel_event(event)
    other = simulator.add_event(EventSpec("Freeze", (VM,)))
    # The poll loop goes on: the cancel and the next event are recorded while the API is down.
    until(harness, lambda: {(e["EventId"], e["Transition"]) for e in harness.records("Event")}
          >= {(event, "Canceled"), (other, "Scheduled")}, "the Event records")  # fmt: skip
    assert kube.node(NODE)["spec"]["unschedulable"] is True
    kube.up()
    until(harness, lambda: hooks(harness, "Uncordoned"), "the uncordon once the API answers")
    node = kube.node(NODE)
    assert node["spec"]["unschedulable"] is False
    assert node["spec"]["taints"] == []


@pytest.mark.parametrize("on_deadline", ["hold", "approve"])
def test_the_deadline_before_not_before_ends_a_blocked_drain(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path, on_deadline: str
) -> None:
    simulator, _ = sim
    kube.add_budget("shop", "web-pdb", {"app": "web"}, allowed=0)
    harness.start(channel=None, policy=WHEN_READY,
                  kubernetes=settings(kube, tmp_path, on_deadline=on_deadline))  # fmt: skip
    # NotBefore 62 s away, and the drain stops 60 s before it. The agent is up first, so
    # those 2 s hold the drain's first eviction, not the agent's start too: beside four CPU
    # hogs its start took them all, and the drain gave up before it had asked to evict (its
    # blocker was a pod "still on the node", no budget named).
    event = simulator.add_event(EventSpec("Reboot", (VM,), notice=62))
    [gave_up] = until(harness, lambda: hooks(harness, "GaveUp"), "the drain giving up")
    exit_code = 0 if on_deadline == "approve" else 1  # ready anyway, or not ready
    assert (gave_up["HookExitCode"], gave_up["HookTimedOut"]) == (exit_code, True)
    assert gave_up["DrainBlockers"][0]["PodDisruptionBudget"] == "web-pdb"
    assert f"kubernetes.on_deadline = {on_deadline}" in gave_up["HookOutput"]
    if on_deadline == "approve":
        until(harness, lambda: posts(simulator, event) == [200], "the approval anyway")


def test_settings_the_agent_cannot_drain_with_stop_it_at_start(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"kubernetes.event_types: Reboots is no event type"):
        harness.start(kubernetes=settings(kube, tmp_path, event_types=["Reboots"]))
    missing = KubernetesSettings(enabled=True, kubeconfig=tmp_path / "absent")
    with pytest.raises(ConfigError, match=r"cannot read the Kubernetes client configuration"):
        harness.start(kubernetes=missing)


def test_a_prepare_hook_beside_the_drain_starts_as_the_second_prepare_step(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    """Issue 38: the drain and the hook are one prepare step, the drain first (before, the
    agent refused to start: either's success counted the VM ready). A hooks.recover alone is
    no prepare step."""
    hooks = HooksSettings(prepare=["/bin/true"], recover=["/bin/true"])
    agent = harness.start(kubernetes=settings(kube, tmp_path), hooks=hooks)
    assert agent.prepare.names == ("drain", "hook")
    harness.stop()
    agent = harness.start(kubernetes=settings(kube, tmp_path), hooks=replace(hooks, prepare=None))
    assert agent.prepare.names == ("drain",)


def test_se_bridge_check_finds_what_would_stop_the_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "agent.toml"
    base = (f'[agent]\nstate_dir = "{tmp_path / "state"}"\nsinks = ["jsonl:{tmp_path / "o"}"]\n'
            '[kubernetes]\nenabled = true\nnode_name = "n1"\n')  # fmt: skip
    config.write_text(base + 'event_types = ["Reboots"]\n', encoding="utf-8")
    assert cli.main(["check", "--config", str(config)]) == 2
    assert "Reboots is no event type" in capsys.readouterr().err
    # A prepare hook beside the drain is the drain's next step (issue 38): nothing to stop.
    config.write_text(base + '[hooks]\nprepare = ["/bin/true"]\n', encoding="utf-8")
    cli.main(["check", "--config", str(config)])
    assert "prepare" not in capsys.readouterr().err


def test_in_local_mode_no_rule_approves_before_the_drain(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    simulator, _ = sim
    kube.add_budget("shop", "web-pdb", {"app": "web"}, allowed=0)
    # The default policy approves a user's reboot at once: with a drain, once it is drained.
    event = simulator.add_event(EventSpec("Reboot", (VM,), event_source="User"))
    harness.start(channel=None, policy=DEFAULT_POLICY, kubernetes=settings(kube, tmp_path))
    until(harness, lambda: hooks(harness, "Blocked"), "the blocked drain")
    harness.poll(3)
    assert posts(simulator, event) == []
    kube.allow("web-pdb", 1)
    until(harness, lambda: posts(simulator, event) == [200], "the approval after the drain")
    [approval] = harness.records("Approval")
    assert approval["DecisionRule"] == "user-initiated"


def test_an_event_first_seen_started_drains_nothing(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    simulator, _ = sim
    started = simulator.add_event(EventSpec("Freeze", (VM,), status="Started"))
    harness.start(channel=None, kubernetes=settings(kube, tmp_path))
    until(harness, lambda: [e for e in harness.records("Event") if e["EventId"] == started],
          "the Started event")  # fmt: skip
    # A drain would have been planned with that record: the node's look at start is all.
    until(harness, lambda: kube.calls("GET", f"/nodes/{NODE}"), "the node's first look")
    assert kube.calls("PATCH") == []
    assert hooks(harness) == []
