"""What the tests of a real agent with [kubernetes] on share: the node, its settings, and
reading what the agent wrote (the Kubernetes API double is the `kube` fixture, conftest.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from bridge.commands import message as commands
from bridge.config import KubernetesSettings
from bridge.policy.file import loads
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


def settings(kube: KubeApiDouble, root: Path, **more: Any) -> KubernetesSettings:
    return KubernetesSettings(enabled=True, node_name=NODE, kubeconfig=kube.kubeconfig(root),
                              eviction_retry=0.1, blocked_report_interval=1,
                              pod_poll_interval=0.2, **more)  # fmt: skip


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


def central(simulator: Simulator, harness: Harness, kube: KubeApiDouble, tmp_path: Path) -> str:
    """An agent with a command channel (a central policy) and a Reboot it has seen."""
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    harness.start(kubernetes=settings(kube, tmp_path))
    harness.poll(2)
    return event


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
