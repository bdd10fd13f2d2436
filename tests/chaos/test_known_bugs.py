"""Minimal reproductions of what the chaos suite found outside the files it may change.

Each was xfail(strict=True) until fixed, and stays as a regression test; the chaos report now
counts any of their symptoms as a violation.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge.agent.loop import Agent
from bridge.agent.wiring import build_agent
from bridge.config import Config
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import Fleet
from bridge.simulator.vms import numbered_vms
from tests.support.agentharness import AgentHarness


@pytest.fixture
def server() -> Iterator[tuple[Simulator, SimulatorServer]]:
    simulator = Simulator(Fleet(numbered_vms(2)))
    with SimulatorServer(simulator) as running:
        yield simulator, running


class Harness(AgentHarness):
    def start(self) -> Agent:
        config = Config(agent=self.agent_settings(), imds=self.imds_settings())
        self.agent = build_agent(config, boot_id="b1")
        self.agent.start()
        return self.agent

    def heartbeats(self, reason: str) -> list[dict[str, Any]]:
        return [r for r in self.records("Heartbeat") if r["HeartbeatReason"] == reason]


KNOWN_IDENTITY = (
    "bridge/agent/loop.py: a restarted agent forgets its VM identity until instance metadata "
    "answers "
    "again; meanwhile its records carry VmId null, and the consumer cannot attribute them (an "
    "event's Canceled from that VM is lost: the consumer's state keeps it Scheduled)"
)


def test_a_restarted_agent_keeps_its_identity_while_instance_metadata_fails(
    server: tuple[Simulator, SimulatorServer], tmp_path: Path
) -> None:
    sim, running = server
    harness = Harness(running, tmp_path)
    harness.start()
    harness.poll(2)
    harness.stop()
    first = harness.heartbeats("Start")[0]["VmId"]
    assert first is not None
    sim.set_faults({"rate503": 1.0})  # IMDS down just as the agent starts again
    harness.start()
    try:
        assert [h["VmId"] for h in harness.heartbeats("Start")] == [first, first]
    finally:
        sim.clear_faults()
        harness.stop()


@pytest.mark.slow
def test_an_answer_that_is_not_metadata_never_replaces_a_known_identity(
    server: tuple[Simulator, SimulatorServer], tmp_path: Path
) -> None:
    sim, running = server
    harness = Harness(running, tmp_path)
    agent = harness.start()
    try:
        harness.poll(2)
        known = agent.origin.identity
        assert known.vm_id is not None
        sim.set_faults({"rateNotDocument": 1.0})  # JSON, but not metadata: [], {"Events": null}..
        for _ in range(20):  # each answer is one of the simulator's samples, drawn at random
            agent._refresh_identity()
            assert agent.origin.identity == known
    finally:
        sim.clear_faults()
        harness.stop()
