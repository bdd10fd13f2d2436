"""A real agent with [kubernetes] on and a command channel: a verified Prepare (the consumer's
grant) starts the drain and approves nothing; one for an event that started is refused; one
delivered again is a replay."""

from __future__ import annotations

from pathlib import Path

from tests.component.kubernetes.drainrig import (
    NODE,
    Sim,
    central,
    hooks,
    posts,
    prepare,
    until,
)
from tests.doubles.kubeapi import KubeApiDouble
from tests.support.approvals import Harness


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
