"""An agent whose start waits is never silent: while instance metadata has not answered (its
first call may take two minutes after IMDS idled), the real agent process says in its log what
it waits for and writes heartbeats (issue 37, item 7)."""

from __future__ import annotations

from pathlib import Path

from bridge.simulator import Simulator, SimulatorServer
from tests.support.agentharness import VM
from tests.support.processes import Processes, read_records
from tests.support.wait import eventually

SLOW = 600.0  # seconds IMDS takes to answer: never, for this test


def test_an_agent_waiting_for_instance_metadata_says_so_and_writes_heartbeats(
    sim: tuple[Simulator, SimulatorServer], procs: Processes, tmp_path: Path
) -> None:
    simulator, server = sim
    simulator.faults.set({"latency": SLOW}, vm=VM)
    out = tmp_path / "out.jsonl"
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[agent]\nstate_dir = "{tmp_path / "state"}"\nsinks = ["jsonl:{out}"]\n'
        "poll_interval = 0.2\nheartbeat_interval = 1\n"
        f'[imds]\nurl = "{server.vm_url(VM)}"\n',
        encoding="utf-8",
    )
    agent = procs.bridge("agent", "agent", "--config", str(config))

    def heartbeats() -> list[str]:
        return [r["HeartbeatReason"] for r in read_records(out) if r["RecordType"] == "Heartbeat"]

    eventually(lambda: "waiting for instance metadata" in agent.stderr(),
               what="the log line that says what the agent waits for",
               details=agent.output, timeout=60)  # fmt: skip
    eventually(lambda: heartbeats().count("Periodic") >= 2,
               what="heartbeats while instance metadata is awaited",
               details=agent.output, timeout=60)  # fmt: skip
    assert heartbeats()[0] == "Start"
    assert "this VM is" not in agent.stderr()  # instance metadata has still not answered
    simulator.faults.clear(VM)
    assert agent.stop() == 0
