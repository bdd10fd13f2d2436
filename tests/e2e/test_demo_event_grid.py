"""`se-bridge demo --event-grid` (issue 36, item 5): web_2 runs no agent, and every event also
reaches the consumer through the simulator's Event Grid; the agent-less VM's events are
counted by the consumer (its Event records from Event Grid stand in the consumer's sinks)."""

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
