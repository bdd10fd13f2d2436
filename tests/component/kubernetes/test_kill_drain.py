"""kill -9 of a real agent process mid-drain and mid-uncordon: the drain is taken up again from
the spool after the restart and written once, and the node is never left cordoned by the agent
after its event ended, even when the API server was down when the event ended."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import EventSpec
from tests.doubles.kubeapi import KubeApiDouble
from tests.support.agentharness import VM
from tests.support.processes import Proc, Processes
from tests.support.wait import eventually

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="kill -9 and a POSIX agent")
NODE = "aks-pool1-0"


def hooks(out: Path, status: str) -> list[dict[str, Any]]:
    lines = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
    records = [json.loads(line) for line in lines]
    return [r for r in records if r["RecordType"] == "Hook" and r.get("DrainStatus") == status]


def events(out: Path, transition: str) -> list[dict[str, Any]]:
    lines = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
    return [r for r in map(json.loads, lines)
            if r["RecordType"] == "Event" and r["Transition"] == transition]  # fmt: skip


def test_a_kill_mid_drain_and_mid_uncordon_leaves_no_node_cordoned(
    sim: tuple[Simulator, SimulatorServer], procs: Processes, tmp_path: Path
) -> None:
    simulator, server = sim
    out = tmp_path / "out.jsonl"
    with KubeApiDouble() as kube:
        kube.add_node(NODE)
        kube.add_pod("shop", "web-1", NODE, labels={"app": "web"}, owner="ReplicaSet")
        kube.add_budget("shop", "web-pdb", {"app": "web"}, allowed=0)
        config = tmp_path / "agent.toml"
        config.write_text(
            f'[agent]\nstate_dir = "{tmp_path / "state"}"\nsinks = ["jsonl:{out}"]\n'
            'poll_interval = 0.2\n'
            f'[imds]\nurl = "{server.vm_url(VM)}"\n'
            f'[kubernetes]\nenabled = true\nnode_name = "{NODE}"\n'
            f'kubeconfig = "{kube.kubeconfig(tmp_path)}"\neviction_retry = 0.2\n',
            encoding="utf-8",
        )  # fmt: skip

        def agent(name: str) -> Proc:
            return procs.bridge(name, "agent", "--config", str(config))

        event = simulator.add_event(EventSpec("Reboot", (VM,)))
        first = agent("agent-1")
        eventually(lambda: hooks(out, "Blocked"), what="the blocked drain",
                   details=first.output)  # fmt: skip
        first.kill()  # kill -9 mid-drain
        assert kube.node(NODE)["spec"]["unschedulable"] is True
        kube.allow("web-pdb", 1)
        second = agent("agent-2")
        eventually(lambda: hooks(out, "Drained"), what="the drain, resumed", details=second.output)
        assert kube.pods(NODE) == []
        kube.down()  # the API server is gone when the event ends ...
        simulator.cancel_event(event)
        eventually(lambda: events(out, "Canceled"), what="the Canceled record",
                   details=second.output)  # fmt: skip
        second.kill()  # ... and the agent is killed before it could uncordon
        kube.up()
        third = agent("agent-3")
        eventually(lambda: hooks(out, "Uncordoned"), what="the uncordon", details=third.output)
        assert third.stop() == 0
        node = kube.node(NODE)
    assert node["spec"]["unschedulable"] is False
    assert node["spec"]["taints"] == []
    assert len(hooks(out, "Drained")) == 1
    assert len(hooks(out, "Uncordoned")) == 1
