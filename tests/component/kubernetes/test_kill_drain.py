"""kill -9 of a real agent process mid-drain and mid-uncordon: the drain is taken up again from
the spool after the restart and written once, and the node is never left cordoned by the agent
after its event ended, even when the API server was down when the event ended."""

from __future__ import annotations

import functools
import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import EventSpec
from tests.doubles.kubeapi import KubeApiDouble
from tests.support.agentharness import VM
from tests.support.processes import Proc, Processes, read_records
from tests.support.wait import eventually

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="kill -9 and a POSIX agent")
NODE = "aks-pool1-0"
# A fresh agent process on a loaded 2-core CI machine (four test workers, the chaos run's own
# processes) was once seen saying nothing for 30 s after a kill -9; a timeout only costs time
# when something is already wrong.
RESTART_WAIT = 90.0


def hooks(out: Path, status: str, event: str | None = None) -> list[dict[str, Any]]:
    return [r for r in read_records(out) if r["RecordType"] == "Hook"
            and r.get("DrainStatus") == status and event in (None, r["EventId"])]  # fmt: skip


def events(out: Path, transition: str, event: str | None = None) -> list[dict[str, Any]]:
    return [r for r in read_records(out) if r["RecordType"] == "Event"
            and r["Transition"] == transition and event in (None, r["EventId"])]  # fmt: skip


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

        def seen(proc: Proc) -> Any:
            """What tells why a wait failed: the agent's log, its records, the API's calls."""

            def said() -> str:
                text = out.read_text("utf-8", errors="replace") if out.exists() else ""
                calls = [f"{r.method} {r.path}" for r in kube.requests[-12:]]
                return "\n".join([proc.output(), f"--- {out}:", *text.splitlines()[-8:],
                                  "--- Kubernetes API calls:", *calls])  # fmt: skip

            return said

        event = simulator.add_event(EventSpec("Reboot", (VM,)))
        first = agent("agent-1")
        eventually(lambda: hooks(out, "Blocked"), what="the blocked drain",
                   details=seen(first), timeout=RESTART_WAIT)  # fmt: skip
        first.kill()  # kill -9 mid-drain
        assert kube.node(NODE)["spec"]["unschedulable"] is True
        kube.allow("web-pdb", 1)
        second = agent("agent-2")
        eventually(lambda: hooks(out, "Drained"), what="the drain, resumed",
                   details=seen(second), timeout=RESTART_WAIT)  # fmt: skip
        assert kube.pods(NODE) == []
        kube.down()  # the API server is gone when the event ends ...
        simulator.cancel_event(event)
        eventually(lambda: events(out, "Canceled"), what="the Canceled record",
                   details=seen(second), timeout=RESTART_WAIT)  # fmt: skip
        second.kill()  # ... and the agent is killed before it could uncordon
        kube.up()
        third = agent("agent-3")
        eventually(lambda: hooks(out, "Uncordoned"), what="the uncordon",
                   details=seen(third), timeout=RESTART_WAIT)  # fmt: skip
        assert third.stop() == 0
        node = kube.node(NODE)
    assert node["spec"]["unschedulable"] is False
    assert node["spec"]["taints"] == []
    assert len(hooks(out, "Drained")) == 1
    assert len(hooks(out, "Uncordoned")) == 1


POLICY = """\
version: 1
rules:
  - name: drain-first
    action: {approve_when_ready: {deadline: 1h, on_deadline: hold}}
"""


@pytest.mark.slow  # about 25 s: nine kills and restarts over three events
def test_kills_and_an_api_server_that_comes_and_goes_never_approve_early_or_leave_a_cordon(
    sim: tuple[Simulator, SimulatorServer], procs: Processes, tmp_path: Path
) -> None:
    """Local mode: three events one after another, each blocked by a budget for a while; the
    agent is killed -9 at random moments and the API server goes down and up between kills.
    Every approval comes after its event's drain, and at the end the node is clean."""
    rng = random.Random(30)
    simulator, server = sim
    out = tmp_path / "out.jsonl"
    with KubeApiDouble() as kube:
        kube.add_node(NODE)
        (tmp_path / "policy.yaml").write_text(POLICY, encoding="utf-8")
        config = tmp_path / "agent.toml"
        config.write_text(
            f'[agent]\nstate_dir = "{tmp_path / "state"}"\nsinks = ["jsonl:{out}"]\n'
            f'poll_interval = 0.2\npolicy = "{tmp_path / "policy.yaml"}"\n'
            f'[imds]\nurl = "{server.vm_url(VM)}"\n'
            f'[kubernetes]\nenabled = true\nnode_name = "{NODE}"\n'
            f'kubeconfig = "{kube.kubeconfig(tmp_path)}"\neviction_retry = 0.2\n',
            encoding="utf-8",
        )  # fmt: skip
        lives = 0

        def agent() -> Proc:
            nonlocal lives
            lives += 1
            return procs.bridge(f"agent-{lives}", "agent", "--config", str(config))

        current = agent()
        for round_ in range(3):
            app = {"app": f"web-{round_}"}
            kube.add_pod("shop", f"web-{round_}", NODE, labels=app, linger=0.3)
            kube.add_budget("shop", f"pdb-{round_}", app, allowed=0)
            event = simulator.add_event(EventSpec("Reboot", (VM,), run_time=1.0))
            for _ in range(3):  # kills while the drain is blocked, the API flapping
                time.sleep(rng.uniform(0.3, 1.5))  # the moment of the kill: random
                current.kill()
                if rng.random() < 0.5:
                    kube.down()
                current = agent()
                time.sleep(rng.uniform(0.0, 1.0))
                kube.up()
            kube.allow(f"pdb-{round_}", 1)
            done = functools.partial(events, out, "Completed", event)
            # The agent was started at most a second ago, so this wait holds a fresh agent's
            # start as well as the drain, the approval and the event's run: 12 to 22 s beside
            # four CPU hogs, up to 24 s beside ten, where it had 30 s.
            eventually(
                done, what=f"event {round_} done", details=current.output, timeout=RESTART_WAIT
            )
            undone = functools.partial(hooks, out, "Uncordoned", event)
            eventually(undone, what=f"the uncordon after event {round_}", details=current.output)
        assert current.stop() == 0
        node = kube.node(NODE)
    assert node["spec"]["unschedulable"] is False
    assert node["spec"]["taints"] == []
    records = read_records(out)
    for event_id in {r["EventId"] for r in records if r["RecordType"] == "Approval"}:
        mine = [r for r in records if r.get("EventId") == event_id]
        order = [(r["RecordType"], r.get("DrainStatus")) for r in mine
                 if r["RecordType"] in ("Hook", "Approval")]  # fmt: skip
        assert order.index(("Hook", "Drained")) < order.index(("Approval", None)), order
