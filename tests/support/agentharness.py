"""One in-process agent against the IMDS simulator, polled a cycle at a time, with its
jsonl output readable at any time. Test modules subclass it to start the agent their way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridge.agent.loop import Agent
from bridge.config import AgentSettings, ImdsSettings
from bridge.simulator import SimulatorServer
from tests.support.processes import read_records
from tests.support.records import assert_valid

VM = "vm-0"


class AgentHarness:
    record_type = "Event"  # what records() returns unless told otherwise

    def __init__(self, server: SimulatorServer, root: Path) -> None:
        self.server, self.root = server, root
        self.out = root / "out.jsonl"
        self.agent: Agent | None = None

    def agent_settings(self) -> AgentSettings:
        return AgentSettings(
            poll_interval=0.2, state_dir=self.root / "state", sinks=[f"jsonl:{self.out}"]
        )

    def imds_settings(self, **imds: Any) -> ImdsSettings:
        return ImdsSettings(url=self.server.vm_url(VM), first_call_timeout=5, timeout=2, **imds)

    def poll(self, times: int = 1) -> None:
        assert self.agent is not None
        for _ in range(times):
            self.agent.cycle()

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.shutdown()
            self.agent = None

    def records(self, record_type: str | None = None) -> list[dict[str, Any]]:
        if self.agent is not None:
            assert self.agent.delivery.flush(5)
        records = read_records(self.out)
        for record in records:
            assert_valid(record)
        wanted = record_type or self.record_type
        return [r for r in records if r["RecordType"] == wanted]
