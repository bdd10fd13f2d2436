"""Local mode (`agent --policy`): the policy engine inside one agent, against the simulator."""

from __future__ import annotations

import logging
import sys
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import cast

import pytest

from bridge import host
from bridge.agent import localmode
from bridge.agent.normalise import NormaliserState
from bridge.commands.message import command_id
from bridge.config import HooksSettings
from bridge.policy.file import loads
from bridge.policy.model import DEFAULT_POLICY, Policy
from bridge.records import VmIdentity
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import EventSpec
from tests.support.agentharness import VM
from tests.support.approvals import Harness, command
from tests.support.processes import run_bridge
from tests.support.wait import eventually

Sim = tuple[Simulator, SimulatorServer]


def posts(simulator: Simulator, event_id: str) -> list[int]:
    return [a.status for a in simulator.approvals() if a.event_id == event_id]


def said(caplog: pytest.LogCaptureFixture, phrase: str) -> int:
    return sum(phrase in r.getMessage() for r in caplog.records)


def test_a_user_reboot_is_approved_at_once(sim: Sim, harness: Harness) -> None:
    simulator, _ = sim
    event = simulator.add_event(EventSpec("Reboot", (VM,), event_source="User"))
    harness.start(channel=None, policy=DEFAULT_POLICY)
    harness.poll(3)
    assert posts(simulator, event) == [200]
    [record] = harness.records()
    assert record["ApprovalOutcome"] == "Approved"
    assert record["ApprovalSource"] == "Local"
    assert record["CommandId"] == command_id(event, simulator.fleet.vm(VM).vm_id)
    assert record["DecisionRule"] == "user-initiated"
    assert record["EventType"] == "Reboot"
    assert isinstance(record["ApprovalLatencyMs"], int)


def test_a_platform_reboot_is_held_and_said_once(
    sim: Sim, harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bridge")
    simulator, _ = sim
    event = simulator.add_event(EventSpec("Reboot", (VM,), event_source="Platform"))
    harness.start(channel=None, policy=DEFAULT_POLICY)
    harness.poll(5)
    assert posts(simulator, event) == []
    assert harness.records() == []
    assert said(caplog, "hold: rule everything-else holds") == 1


def window_policy(opens: datetime) -> Policy:
    start, end = opens, opens + timedelta(hours=1)
    return loads(
        f"""
version: 1
rules:
  - name: nightly
    action:
      approve_in_window:
        windows: [{{days: daily, start: "{start:%H:%M}", end: "{end:%H:%M}"}}]
""",
        "window.yaml",
    )


def test_outside_the_window_an_event_is_deferred_then_approved_when_it_opens(
    sim: Sim, harness: Harness, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="bridge")
    monkeypatch.setattr(localmode, "RECHECK_SECONDS", 0.0)
    simulator, _ = sim
    real = datetime.now(timezone.utc)
    opens = (real + timedelta(hours=2)).replace(second=0, microsecond=0)
    skew = timedelta(0)
    event = simulator.add_event(EventSpec("Reboot", (VM,), notice=6 * 3600))
    harness.start(
        channel=None,
        policy=window_policy(opens),
        now=lambda: datetime.now(timezone.utc) + skew,
    )
    harness.poll(3)
    assert posts(simulator, event) == []
    assert said(caplog, "defer: outside the maintenance window") == 1
    skew = opens - real + timedelta(minutes=1)  # the window is open now, for the agent
    harness.poll()
    assert posts(simulator, event) == [200]
    assert [r["DecisionRule"] for r in harness.records()] == ["nightly"]


def test_approve_when_ready_waits_for_the_prepare_hook(sim: Sim, harness: Harness) -> None:
    simulator, _ = sim
    policy = loads(
        "version: 1\nrules:\n  - name: drained\n    action: {approve_when_ready: {deadline: 10m}}\n"
    )
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    hook = [sys.executable, "-c", "import time; time.sleep(0.5)"]
    harness.start(channel=None, policy=policy, hooks=HooksSettings(prepare=hook))
    harness.poll()
    assert posts(simulator, event) == []  # the hook is still running
    eventually(lambda: harness.records("Hook") != [])
    harness.poll()
    assert posts(simulator, event) == [200]


@pytest.mark.parametrize(("on_deadline", "approved"), [("approve", [200]), ("hold", [])])
def test_approve_when_ready_without_a_prepare_hook_decides_at_once(
    sim: Sim,
    harness: Harness,
    caplog: pytest.LogCaptureFixture,
    on_deadline: str,
    approved: list[int],
) -> None:
    # This VM can never be ready: the deadline's outcome now, not in 10 minutes (issue 27).
    caplog.set_level(logging.INFO, logger="bridge")
    simulator, _ = sim
    policy = loads(
        "version: 1\nrules:\n  - name: drained\n    action: {approve_when_ready: "
        f"{{deadline: 10m, on_deadline: {on_deadline}}}}}\n"
    )
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    harness.start(channel=None, policy=policy)
    harness.poll(2)
    assert posts(simulator, event) == approved
    if not approved:
        assert said(caplog, f"hold: no prepare hook on VM {VM}") == 1


def test_an_event_approved_locally_is_not_approved_again_by_a_command(
    sim: Sim, harness: Harness
) -> None:
    simulator, _ = sim
    event = simulator.add_event(
        EventSpec("Reboot", (VM,), event_source="User", approval_delay=300.0)
    )
    harness.start(policy=DEFAULT_POLICY)
    harness.poll()
    harness.inbox.put(command(simulator.fleet.vm(VM).vm_id, event).to_json())
    eventually(lambda: harness.inbox.deleted != [])
    harness.poll(2)
    assert posts(simulator, event) == [200]
    assert [r["ApprovalSource"] for r in harness.records()] == ["Local"]


def test_an_approval_is_remembered_across_a_restart(sim: Sim, harness: Harness) -> None:
    simulator, _ = sim
    event = simulator.add_event(
        EventSpec("Reboot", (VM,), event_source="User", approval_delay=300.0)
    )
    harness.start(channel=None, policy=DEFAULT_POLICY)
    harness.poll()
    harness.stop()
    harness.start(channel=None, policy=DEFAULT_POLICY)
    harness.poll(2)
    assert posts(simulator, event) == [200]


def test_an_event_of_other_vms_is_left_to_them(sim: Sim, harness: Harness) -> None:
    simulator, _ = sim
    event = simulator.add_event(
        EventSpec("Reboot", ("db-1",), audience=(VM, "db-1"), event_source="User")
    )
    harness.start(channel=None, policy=DEFAULT_POLICY)
    harness.poll(2)
    assert posts(simulator, event) == []


def test_local_views_know_only_this_vm() -> None:
    me = VmIdentity(vm_id="id-0", vm_name="web_0", tags=(("role", "db"),))
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    event = {
        "EventId": "E1",
        "EventType": "Freeze",
        "EventStatus": "Scheduled",
        "Resources": ["_web_0", "web_1"],
        "AffectsThisVm": True,
        "DurationInSeconds": 5,
        "NotBefore": None,
        "FirstSeen": "2026-01-01T00:00:00.000Z",
    }
    started = {**event, "EventId": "E2", "EventStatus": "Started"}
    state = {"incarnation": 3, "events": {"e1": event, "e2": started}}
    partial = cast(NormaliserState, state)  # only the fields local mode reads
    fleet, [view] = localmode.local_views(partial, me, frozenset({"e1"}), frozenset(), now)
    assert fleet.vms["id-0"].tags == {"role": "db"}
    assert fleet.impacted == {"E2": frozenset({"id-0"})}
    assert (view.affected, view.unresolved, view.ready) == (
        ("id-0",),
        ("web_1",),
        frozenset({"id-0"}),
    )


def test_the_agent_refuses_a_bad_policy_file(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nrules: []\n", encoding="utf-8")
    done = run_bridge("agent", "--state-dir", str(tmp_path / "state"), "--policy", str(policy))
    assert done.returncode == 2
    assert "agent.policy" in done.stderr
    assert "policy.yaml" in done.stderr
    assert "Traceback" not in done.stderr


# --- an IMDS that serves no instance metadata (some emulators) -------------------------------


def test_without_instance_metadata_a_user_reboot_naming_this_host_is_approved(
    sim: Sim, harness: Harness, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    simulator, _ = sim
    simulator.set_faults({"rateNoInstance": 1.0}, vm=VM)
    monkeypatch.setattr(host, "host_name", lambda: "VM-1")  # this machine's OS host name
    mine = simulator.add_event(EventSpec("Reboot", ("vm-1",), audience=(VM,),
                                         event_source="User"))  # fmt: skip
    other = simulator.add_event(EventSpec("Reboot", ("web_1",), audience=(VM,),
                                          event_source="User"))  # fmt: skip
    harness.start(channel=None, policy=DEFAULT_POLICY)
    harness.poll(4)
    assert posts(simulator, mine) == [200]
    assert posts(simulator, other) == []
    events = {r["EventId"]: r for r in harness.records("Event")}
    assert events[mine]["AffectsThisVm"] is True
    assert events[other]["AffectsThisVm"] is None  # a miss rules nothing out
    assert events[mine]["VmId"] is None  # the VmId is never guessed
    assert said(caplog, "agent.vm_name") == 1


def test_agent_vm_name_names_this_vm_when_instance_metadata_is_missing(
    sim: Sim, harness: Harness
) -> None:
    simulator, _ = sim
    simulator.set_faults({"rateNoInstance": 1.0}, vm=VM)
    mine = simulator.add_event(EventSpec("Reboot", (VM,), event_source="User"))
    other = simulator.add_event(EventSpec("Reboot", ("web_1",), audience=(VM,),
                                          event_source="User"))  # fmt: skip
    settings = harness.agent_settings()
    harness.agent_settings = lambda: replace(settings, vm_name=VM)  # type: ignore[method-assign]
    harness.start(channel=None, policy=DEFAULT_POLICY)
    harness.poll(4)
    assert posts(simulator, mine) == [200]
    events = {r["EventId"]: r for r in harness.records("Event")}
    assert (events[mine]["AffectsThisVm"], events[other]["AffectsThisVm"]) == (True, False)
    assert events[mine]["VmName"] == VM
