"""The in-process agent harness (tests/support/agentharness.py) reads its jsonl sink while the
agent may still be appending to it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

from bridge.simulator import SimulatorServer
from tests.support.agentharness import AgentHarness
from tests.support.records import event_record


def test_a_line_the_agent_is_halfway_through_writing_is_not_read_yet(tmp_path: Path) -> None:
    harness = AgentHarness(cast(SimulatorServer, None), tmp_path)
    whole = json.dumps(event_record(rid="whole"))
    half = json.dumps(event_record(rid="half"))[:211]
    harness.out.write_text(f"{whole}\n{half}", encoding="utf-8")
    assert [r["RecordId"] for r in harness.records()] == ["whole"]

    harness.out.write_text(f"{whole}\n{json.dumps(event_record(rid='half'))}\n", encoding="utf-8")
    assert [r["RecordId"] for r in harness.records()] == ["whole", "half"]
