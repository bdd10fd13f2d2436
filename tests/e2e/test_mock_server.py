"""An agent against an IMDS that serves no instance metadata, as Microsoft's Scheduled Events
mock server (Azure-Samples/scheduled-events-mock-server) and other emulators do (issue 39,
item 6): `--vm-name` tells it which VM it is, and `--policy default` approves with the built-in
policy in local mode, with no file to write. The simulator stands in for the mock server with
every instance metadata request answered 404, which is what the mock server answers."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.processes import Agent, Processes, Simulator, run_bridge

pytestmark = pytest.mark.e2e


def test_without_instance_metadata_two_flags_give_this_vms_events_and_local_approvals(
    procs: Processes,
) -> None:
    sim = Simulator.launch(procs, "sim", "--vms", "1", "--rate-no-instance", "1")
    agent = Agent(procs, "vm-0", sim.vm_url("vm-0"),
                  args=["--vm-name", "vm-0", "--policy", "default"]).start()  # fmt: skip
    sim.wait_polls({"vm-0": 2})
    user = sim.add_event(EventType="Reboot", EventSource="User", Resources=["vm-0"])
    platform = sim.add_event(EventType="Reboot", EventSource="Platform", Resources=["vm-0"])
    assert agent.wait_transition(user, "Scheduled")["AffectsThisVm"] is True
    assert agent.wait_transition(platform, "Scheduled")["AffectsThisVm"] is True

    def approval(records: list[dict[str, Any]]) -> bool:
        return any(r["RecordType"] == "Approval" and r["EventId"] == user for r in records)

    records = agent.wait_for(approval, "the local approval of the user's reboot")
    [approved] = [r for r in records if r["RecordType"] == "Approval"]
    assert (approved["ApprovalOutcome"], approved["ApprovalSource"]) == ("Approved", "Local")
    approvals = sim.call("GET", "/control/approvals")["approvals"]
    assert [a["eventId"] for a in approvals] == [user]  # the platform's waits: held


def test_the_default_policy_is_named_default_and_a_missing_file_still_an_error(
    tmp_path: Any,
) -> None:
    done = run_bridge("agent", "--policy", str(tmp_path / "nope.yaml"), "--imds-url",
                      "http://127.0.0.1:9", "--state-dir", str(tmp_path / "s"))  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "agent.policy" in done.stderr
    assert "--policy default" in done.stderr  # says how to name the built-in one
