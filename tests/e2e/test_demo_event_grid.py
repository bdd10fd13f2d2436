"""`se-bridge demo --event-grid` (issue 36, item 5): web_2 and vm-0 run no agent, and every
event also reaches the consumer through the simulator's Event Grid; the agent-less VMs' events
are counted by the consumer (its Event records from Event Grid stand in the consumer's sinks),
and vm-0's user reboot, which no agent sees, is approved through the simulator's ARM
acknowledge over HTTPS (an Approval record with ApprovalSource ARM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.processes import read_records, run_bridge

pytestmark = pytest.mark.e2e


def test_the_demo_shows_a_vm_without_an_agent_through_event_grid(tmp_path: Path) -> None:
    state = tmp_path / "demo"
    done = run_bridge(
        "demo", "--event-grid", "--duration", "16", "--every", "2", "--state-dir", str(state),
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not (state / "web_2").exists()  # no agent ran for it
    assert (state / "web_0" / "records.jsonl").exists()
    central = read_records(state / "decisions.jsonl")
    from_azure = [r for r in central if r.get("Source") == "EventGrid"]
    assert any("web_2" in r["Resources"] for r in from_azure), done.stdout
    assert "web_2 ran no agent: the consumer heard of its events from Event Grid" in done.stdout
    # vm-0's user reboot (the second scenario): no agent sees it, ARM's acknowledge carries it.
    assert not (state / "vm-0").exists()
    by_arm = [r for r in central if r["RecordType"] == "Approval" and r["ApprovalSource"] == "ARM"]
    assert any(r["ApprovalOutcome"] == "Approved" for r in by_arm), done.stdout
    reboots = {r["EventId"] for r in from_azure if r["Resources"] == ["vm-0"]}
    assert {r["EventId"] for r in by_arm} <= reboots, done.stdout
    assert "vm-0 ran no agent and no agent sees its events: the consumer approved them through " \
        "ARM's acknowledge (" in done.stdout  # fmt: skip
    assert "approved through ARM" in done.stdout
