"""A real agent with a drain and a prepare hook (issue 38): one prepare step, the drain first,
then the hook; the VM is ready when both succeeded, each writes its own Hook record, and the
heartbeats say which steps the VM has. In local mode and under a central policy, across a
restart between the two steps, and with a hook that fails after the drain succeeded."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from bridge.config import HooksSettings
from bridge.simulator.fleet import EventSpec
from tests.component.kubernetes.drainrig import (
    NODE,
    WHEN_READY,
    Sim,
    beats,
    hooks,
    posts,
    prepare,
    settings,
    until,
)
from tests.doubles.kubeapi import KubeApiDouble
from tests.support.agentharness import VM
from tests.support.approvals import Harness

STEPS = ["drain", "hook"]


def hook(tmp_path: Path, exit_code: int = 0, wait_for: Path | None = None) -> HooksSettings:
    """hooks.prepare: notes that it ran (and whether the node was cordoned is the drain's
    record, which comes first), waits for `wait_for` when given, then exits `exit_code`."""
    ran = tmp_path / "hook-ran"
    wait = f'while [ ! -e "{wait_for}" ]; do sleep 0.05; done; ' if wait_for else ""
    script = f'{wait}echo "$SE_BRIDGE_EVENT_ID" >> "{ran}"; exit {exit_code}'
    return HooksSettings(prepare=["sh", "-c", script], timeout=60)


def hook_records(harness: Harness) -> list[dict[str, Any]]:
    return [h for h in harness.records("Hook") if h.get("HookName") is None]


def order(harness: Harness) -> list[str]:
    """The prepare step's outcomes in the order the agent wrote them."""
    progress = ("Draining", "Blocked")
    return [h["DrainStatus"] or f"hook {h['HookExitCode']}" for h in harness.records("Hook")
            if h["HookPhase"] == "prepare" and h["DrainStatus"] not in progress]  # fmt: skip


def test_in_local_mode_the_hook_runs_after_the_drain_and_the_approval_after_both(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    simulator, _ = sim
    kube.add_budget("shop", "web-pdb", {"app": "web"}, allowed=0)
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    harness.start(channel=None, policy=WHEN_READY, kubernetes=settings(kube, tmp_path),
                  hooks=hook(tmp_path))  # fmt: skip
    until(harness, lambda: hooks(harness, "Blocked"), "the blocked drain")
    harness.poll(3)
    assert hook_records(harness) == []  # the hook waits for the drain
    assert posts(simulator, event) == []
    kube.allow("web-pdb", 1)
    until(harness, lambda: posts(simulator, event) == [200], "the approval after both steps")
    assert order(harness) == ["Drained", "hook 0"]
    for record in harness.records("Hook"):
        assert record["PrepareSteps"] == STEPS
    [start, *_] = beats(harness, "Start")
    assert (start["HasPrepareHook"], start["PrepareSteps"]) == (True, STEPS)
    assert (tmp_path / "hook-ran").read_text(encoding="utf-8").split() == [event]


def test_a_hook_that_fails_after_the_drain_leaves_the_vm_unready_and_the_node_is_uncordoned(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    simulator, _ = sim
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    harness.start(channel=None, policy=WHEN_READY, kubernetes=settings(kube, tmp_path),
                  hooks=hook(tmp_path, exit_code=3))  # fmt: skip
    until(harness, lambda: hook_records(harness), "the hook's record")
    assert order(harness) == ["Drained", "hook 3"]
    harness.poll(3)
    assert posts(simulator, event) == []  # not ready: the event starts at its NotBefore
    assert kube.node(NODE)["spec"]["unschedulable"] is True
    simulator.cancel_event(event)
    until(harness, lambda: hooks(harness, "Uncordoned"), "the uncordon after the event")
    assert kube.node(NODE)["spec"]["unschedulable"] is False


def test_under_a_central_policy_the_grant_starts_the_drain_and_the_hook_follows(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    simulator, _ = sim
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    harness.start(kubernetes=settings(kube, tmp_path), hooks=hook(tmp_path))
    harness.poll(3)
    assert harness.records("Hook") == []  # neither step runs before the consumer's grant
    harness.inbox.put(prepare(simulator, event))
    until(harness, lambda: hook_records(harness), "the hook after the granted drain")
    assert order(harness) == ["Drained", "hook 0"]
    assert harness.records("Approval") == []
    assert posts(simulator, event) == []


def test_a_restart_between_the_drain_and_the_hook_runs_the_hook_once_and_drains_once(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    simulator, _ = sim
    go = tmp_path / "go"
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    harness.start(channel=None, policy=WHEN_READY, kubernetes=settings(kube, tmp_path),
                  hooks=hook(tmp_path, wait_for=go))  # fmt: skip
    until(harness, lambda: hooks(harness, "Drained"), "the drain")
    harness.stop()  # the hook, waiting, is killed: it stays due
    assert hook_records(harness) == []
    assert posts(simulator, event) == []
    go.touch()
    harness.start(channel=None, policy=WHEN_READY, kubernetes=settings(kube, tmp_path),
                  hooks=hook(tmp_path, wait_for=go))  # fmt: skip
    until(harness, lambda: posts(simulator, event) == [200], "the approval after the restart")
    assert order(harness) == ["Drained", "hook 0"]
    assert kube.node(NODE)["spec"]["unschedulable"] is True  # drained once, still cordoned


def test_an_event_that_ends_before_its_drain_was_granted_drops_the_hook_unrun(
    sim: Sim, harness: Harness, kube: KubeApiDouble, tmp_path: Path
) -> None:
    simulator, _ = sim
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    recover = tmp_path / "recovered"
    hooks = replace(hook(tmp_path), recover=["touch", str(recover)])
    agent = harness.start(kubernetes=settings(kube, tmp_path), hooks=hooks)
    harness.poll(2)
    assert [p["phase"] for _, p in agent.spool.pending_jobs()] == ["prepare"]  # the held hook
    simulator.cancel_event(event)
    until(harness, recover.exists, "the recover hook after the event")
    until(harness, lambda: agent.spool.pending_jobs() == [], "no job left in the spool")
    assert [h["HookPhase"] for h in hook_records(harness)] == ["recover"]
    assert not (tmp_path / "hook-ran").exists()
