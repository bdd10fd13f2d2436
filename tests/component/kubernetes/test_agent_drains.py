"""A real agent with [kubernetes] on, against the IMDS simulator and the Kubernetes API double
through the real lightkube client: when a drain starts (local mode, a Prepare, a Spot
Preempt), what it writes (Hook records, heartbeats), the uncordon after, a restart mid-drain,
a stray taint, and an API server that does not answer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from bridge import cli
from bridge.commands import message as commands
from bridge.config import ConfigError, HooksSettings, KubernetesSettings
from bridge.kubernetes.drain import CORDONED_FOR, TAINT_KEY
from bridge.policy.file import loads
from bridge.policy.model import DEFAULT_POLICY
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import EventSpec
from tests.doubles.kubeapi import KubeApiDouble
from tests.support.agentharness import VM
from tests.support.approvals import Harness
from tests.support.wait import eventually

Sim = tuple[Simulator, SimulatorServer]
NODE = "aks-pool1-0"
WHEN_READY = loads(
    """
version: 1
rules:
  - name: drain-first
    action: {approve_when_ready: {deadline: 1h, on_deadline: hold}}
""",
    "ready.yaml",
)


@pytest.fixture
def kube() -> Iterator[KubeApiDouble]:
    with KubeApiDouble() as double:
        double.add_node(NODE, labels={"kubernetes.azure.com/agentpool": "pool1"})
        double.add_pod("shop", "web-1", NODE, labels={"app": "web"}, owner="ReplicaSet")
        double.add_pod("kube-system", "proxy", NODE, owner="DaemonSet")
        yield double


def settings(kube: KubeApiDouble, root: Path, **more: Any) -> KubernetesSettings:
    return KubernetesSettings(enabled=True, node_name=NODE, kubeconfig=kube.kubeconfig(root),
                              eviction_retry=0.1, blocked_report_interval=1, **more)  # fmt: skip


def hooks(harness: Harness, status: str | None = None) -> list[dict[str, Any]]:
    return [h for h in harness.records("Hook") if status is None or h["DrainStatus"] == status]


def until(harness: Harness, condition: Any, what: str) -> Any:
    """Poll the agent until `condition()` holds (the drains run on threads of their own)."""

    def polled() -> Any:
        harness.poll()
        return condition()

    return eventually(polled, what=what)


def beats(harness: Harness, reason: str) -> list[dict[str, Any]]:
    return [b for b in harness.records("Heartbeat") if b["HeartbeatReason"] == reason]


def posts(simulator: Simulator, event_id: str) -> list[int]:
    return [a.status for a in simulator.approvals() if a.event_id == event_id]


def prepare(simulator: Simulator, event_id: str) -> str:
    now = datetime.now(timezone.utc)
    return commands.approve(
        vm_id=simulator.fleet.vm(VM).vm_id, event_id=event_id, document_incarnation=None,
        issued_at=now, expires_at=now + timedelta(minutes=10), rule="drain-first",
        reason="drain granted", kind="Prepare",
    ).to_json()  # fmt: skip


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


def central(simulator: Simulator, harness: Harness, kube: KubeApiDouble, tmp_path: Path) -> str:
    """An agent with a command channel (a central policy) and a Reboot it has seen."""
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    harness.start(kubernetes=settings(kube, tmp_path))
    harness.poll(2)
    return event


def test_a_prepare_starts_the_drain_and_writes_no_approval(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    simulator, _ = sim
    event = central(simulator, harness, kube, tmp_path)
    assert hooks(harness) == []  # under a central policy: no drain without a grant
    harness.inbox.put(prepare(simulator, event))
    until(harness, lambda: hooks(harness, "Drained"), "the drain the Prepare granted")
    assert harness.records("Approval") == []
    assert posts(simulator, event) == []
    assert kube.node(NODE)["spec"]["unschedulable"] is True
    [drained] = hooks(harness, "Drained")
    assert drained["Transition"] == "Scheduled"


def test_a_prepare_for_an_event_that_started_is_refused(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    simulator, _ = sim
    event = central(simulator, harness, kube, tmp_path)
    simulator.start_event(event)
    harness.inbox.put(prepare(simulator, event))
    [refused] = until(harness, lambda: harness.records("Approval"), "the refusal")
    assert refused["ApprovalOutcome"] == "Refused"
    assert "(a Prepare)" in refused["ApprovalDetail"]
    assert hooks(harness) == []
    assert kube.calls("PATCH") == []


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
        "metadata": {"annotations": {CORDONED_FOR: "OLD-EVENT"}}})  # fmt: skip
    harness.start(channel=None, kubernetes=settings(kube, tmp_path))
    [undone] = until(harness, lambda: hooks(harness, "Uncordoned"), "the stray's removal")
    assert undone["EventId"] == "OLD-EVENT"
    assert kube.node(NODE)["spec"]["unschedulable"] is False


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
    # NotBefore 62 s away, and the drain stops 60 s before it.
    event = simulator.add_event(EventSpec("Reboot", (VM,), notice=62))
    harness.start(channel=None, policy=WHEN_READY,
                  kubernetes=settings(kube, tmp_path, on_deadline=on_deadline))  # fmt: skip
    [gave_up] = until(harness, lambda: hooks(harness, "GaveUp"), "the drain giving up")
    exit_code = 0 if on_deadline == "approve" else 1  # ready anyway, or not ready
    assert (gave_up["HookExitCode"], gave_up["HookTimedOut"]) == (exit_code, True)
    assert gave_up["DrainBlockers"][0]["PodDisruptionBudget"] == "web-pdb"
    assert f"kubernetes.on_deadline = {on_deadline}" in gave_up["HookOutput"]
    if on_deadline == "approve":
        until(harness, lambda: posts(simulator, event) == [200], "the approval anyway")


def test_a_prepare_delivered_again_is_a_replay(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    simulator, _ = sim
    event = central(simulator, harness, kube, tmp_path)
    text = prepare(simulator, event)
    harness.inbox.put(text)
    until(harness, lambda: hooks(harness, "Drained"), "the drain the Prepare granted")
    harness.inbox.put(text)
    [replayed] = until(harness, lambda: harness.records("Approval"), "the replay's refusal")
    assert replayed["ApprovalDetail"].startswith("Replayed:")
    assert "prepared here already" in replayed["ApprovalDetail"]
    assert len(hooks(harness, "Drained")) == 1


def test_settings_the_agent_cannot_drain_with_stop_it_at_start(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"kubernetes.event_types: Reboots is no event type"):
        harness.start(kubernetes=settings(kube, tmp_path, event_types=["Reboots"]))
    missing = KubernetesSettings(enabled=True, kubeconfig=tmp_path / "absent")
    with pytest.raises(ConfigError, match=r"cannot read the Kubernetes client configuration"):
        harness.start(kubernetes=missing)


def test_a_prepare_hook_beside_the_drain_stops_it_at_start(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    """A VM is counted ready when a prepare step succeeds (a Hook record with exit code 0):
    with a hook beside the drain, the first of them to succeed would let the event be approved
    while the other still ran, the node's pods still on it."""
    hooks = HooksSettings(prepare=["/bin/true"], recover=["/bin/true"])
    with pytest.raises(ConfigError, match=r"hooks\.prepare and \[kubernetes\]"):
        harness.start(kubernetes=settings(kube, tmp_path), hooks=hooks)
    harness.start(kubernetes=settings(kube, tmp_path), hooks=replace(hooks, prepare=None))


def test_se_bridge_check_finds_what_would_stop_the_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "agent.toml"
    base = (f'[agent]\nstate_dir = "{tmp_path / "state"}"\nsinks = ["jsonl:{tmp_path / "o"}"]\n'
            '[kubernetes]\nenabled = true\nnode_name = "n1"\n')  # fmt: skip
    for extra, said in [('event_types = ["Reboots"]\n', "Reboots is no event type"),
                        ('[hooks]\nprepare = ["/bin/true"]\n', "both prepare steps")]:  # fmt: skip
        config.write_text(base + extra, encoding="utf-8")
        assert cli.main(["check", "--config", str(config)]) == 2
        assert said in capsys.readouterr().err


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


def two_drained_events(
    simulator: Simulator, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> tuple[str, str]:
    """A local-mode agent that drained its node for a Reboot, then for a Redeploy: the node's
    marks name the first (a node has one taint per key and effect)."""
    marked = simulator.add_event(EventSpec("Reboot", (VM,)))
    harness.start(channel=None, kubernetes=settings(kube, tmp_path))
    until(harness, lambda: hooks(harness, "Drained"), "the first drain")
    second = simulator.add_event(EventSpec("Redeploy", (VM,)))
    until(harness, lambda: len(hooks(harness, "Drained")) == 2, "the second drain")
    return marked, second


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
