"""Azure's view as a second source, end to end (issue 36): a scale set of 4 where only web_0
and web_1 have agents. Their events reach the consumer through IMDS (the agents, real
processes, over the local hub) and through Event Grid (the simulator's Event Grid double,
delivering with delay, duplicates and reordering into a local hub of its own); `se-bridge
consume` (a real process) holds a `max_vms: 1` budget across all 4: a VM resource health
reports Unavailable holds the slot until Available; an agent-less VM's event is carried by a
neighbour's agent while one lives (Azure lets any VM of the placement group approve, and a live
agent is always preferred to ARM); once no agent is left, the agent-less VMs' events are
approved through ARM's acknowledge (the simulator's, over HTTPS, with the consumer's
managed-identity token from the simulator's identity endpoint), each when the slot is free, and
hold it until Event Grid says they are over.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from bridge.commands import signing
from bridge.config import CommandsSettings, IdentitySettings
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.arm import ArmServer
from bridge.simulator.eventgrid import EventGridDouble, GridFaults
from bridge.simulator.fleet import EventSpec, Fleet
from bridge.simulator.vms import vms_from_spec
from tests.doubles.resourcegraph import ResourceGraphDouble, row_of
from tests.support import eventgrid as eg
from tests.support.processes import Agent, Proc, Processes, scrape
from tests.support.wait import eventually

pytestmark = pytest.mark.e2e

AGENTS = ("web_0", "web_1")
POLICY = """\
version: 1
budgets:
  - {name: one-at-a-time, group: scale_set, max_vms: 1}
rules:
  - name: user-reboots
    match: {event_source: User, event_type: Reboot}
    action: approve
"""
WAIT = 90.0  # a loaded machine: a timeout only costs time when something is already wrong
# Simulated seconds at time scale 60: an hour's notice is a real minute.
LONG_NOTICE, SHORT_NOTICE = 3600.0, 300.0


class Rig:
    def __init__(
        self, root: Path, faults: GridFaults | None = None, graph: ResourceGraphDouble | None = None
    ) -> None:
        self.root = root
        self.procs = Processes(root)
        self.sim = Simulator(Fleet(vms_from_spec({"scaleSets": [{"name": "web", "count": 4}]},
                                                 seed=36), time_scale=60))  # fmt: skip
        self.server = SimulatorServer(self.sim)
        self.hub, self.grid_hub = root / "hub", root / "eventgrid"
        self.commands, self.decisions = root / "commands", root / "decisions.jsonl"
        faults = faults or GridFaults(delay=0.3, duplicate=0.3, reorder=0.3, reorder_by=1.0)
        self.grid = EventGridDouble(self.sim, self.grid_hub, faults, seed=36)
        self.arm = ArmServer.for_simulator(self.sim)
        self.graph = graph
        self.consumer: Proc | None = None
        self.agents: list[Agent] = []

    def start(self) -> Rig:
        self.server.start()
        self.grid.start()
        self.arm.start()
        key = self.root / "signing.pem"
        signing.keygen(key)
        signer = signing.load_signer(CommandsSettings(signing_key=f"file:{key}"),
                                     IdentitySettings())  # fmt: skip
        verify = {"SE_BRIDGE_COMMANDS_VERIFY_KEY": signing.verify_key_text(signer.public_key()),
                  "SE_BRIDGE_AGENT_HEARTBEAT_INTERVAL": "5"}  # fmt: skip
        for vm in AGENTS:
            args = ("--sink", f"hub:{self.hub}", "--commands", f"local:{self.commands}")
            agent = Agent(self.procs, vm, self.server.vm_url(vm), args=args, env=verify)
            self.agents.append(agent)
            agent.start()
        policy, config = self.root / "policy.yaml", self.root / "consumer.toml"
        policy.write_text(POLICY, encoding="utf-8")
        subscription = self.sim.fleet.vm("web_0").subscription_id
        toml = (
            "[consumer]\nreevaluate_interval = 0.5\n\n[eventgrid]\nenabled = true\n"
            f'health = true\nhub = "{self.grid_hub}"\nsubscriptions = ["{subscription}"]\n'
            f'acknowledge = true\narm_endpoint = "{self.arm.endpoint}"\n'
        )
        # ARM (and the reconciler's Resource Graph) are asked as the consumer's managed
        # identity, whose token the simulator's identity endpoint issues, over HTTPS.
        env = {"SE_BRIDGE_COMMANDS_SIGNING_KEY": f"file:{key}",
               "SE_BRIDGE_IDENTITY_KIND": "managed",
               **self.arm.client_environment(self.server.vm_url("web_0"))}  # fmt: skip
        if self.graph is not None:
            toml += f'reconcile_interval = 60\nresource_graph_url = "{self.graph.url}"\n'
            bundle = self.root / "ca-bundle.pem"
            bundle.write_bytes(Path(self.arm.ca_bundle).read_bytes()
                               + Path(self.graph.ca_bundle).read_bytes())  # fmt: skip
            env |= {"REQUESTS_CA_BUNDLE": str(bundle), "CURL_CA_BUNDLE": str(bundle)}
        config.write_text(toml, encoding="utf-8")
        self.consumer = self.procs.bridge(
            "consumer", "consume", "--hub", str(self.hub), "--commands", f"local:{self.commands}",
            "--state", f"sqlite:{self.root / 'fleet.db'}", "--policy", str(policy),
            "--state-dir", str(self.root / "consumer"), "--sink", f"jsonl:{self.decisions}",
            "--config", str(config), "--metrics-address", "0", env=env,
        )  # fmt: skip
        return self

    def close(self) -> None:
        self.procs.close()
        self.grid.stop()
        self.arm.stop()
        self.server.stop()

    def reboot(self, vm: str, notice: float, run_time: float = 120.0) -> str:
        spec = EventSpec("Reboot", (vm,), event_source="User", notice=notice, run_time=run_time)
        return self.sim.add_event(spec)

    def event(self, event_id: str) -> dict[str, Any]:
        return next(e for e in self.sim.events() if e["eventId"] == event_id)

    def approved_at(self, event_id: str, via: str = "IMDS") -> float | None:
        """When `event_id` was approved through IMDS (an agent) or ARM."""
        return next((a.at for a in self.sim.approvals()
                     if a.event_id == event_id and a.via == via), None)  # fmt: skip

    def records(self) -> list[dict[str, Any]]:
        """What the consumer wrote to its sink: decisions, Event Grid's events, ARM approvals."""
        if not self.decisions.exists():
            return []
        return [json.loads(line) for line in self.decisions.read_text().splitlines() if line]

    def impacted_at_once(self) -> int:
        """The most VMs of the set that were down for an event at the same moment."""
        spans = [(e["startedAt"], e["endedAt"] or float("inf"), len(e["resources"]))
                 for e in self.sim.events() if e["startedAt"] is not None]  # fmt: skip
        return max((sum(n for start, end, n in spans if start <= at < end)
                    for at, _, _ in spans), default=0)  # fmt: skip

    def decided(self, event_id: str, action: str) -> bool:
        return any(d.get("EventId") == event_id and d.get("DecisionAction") == action
                   for d in self.records())  # fmt: skip

    def azure_named(self) -> set[str]:
        """The VMs the Event records from Event Grid in the consumer's sinks name."""
        return {name for r in self.records() if r.get("Source") == "EventGrid"
                for name in r.get("Resources") or []}  # fmt: skip

    def carried_by_arm(self, event_id: str) -> bool:
        """The consumer's Approval record says ARM carried `event_id`'s approval."""
        return any(r.get("EventId") == event_id and r.get("ApprovalSource") == "ARM"
                   and r.get("ApprovalOutcome") == "Approved" for r in self.records())  # fmt: skip

    def taken(self, kind: str) -> float:
        """How many Event Grid messages of `kind` (event, health) the consumer folded in."""
        assert self.consumer is not None
        samples = scrape(self.consumer.output)
        return samples.get(f'se_bridge_consumer_eventgrid_total{{kind="{kind}"}}', 0.0)

    def details(self) -> str:
        assert self.consumer is not None
        return (f"events: {self.sim.events()}\napprovals: {self.sim.approvals()}\n"
                f"grid: {dict(self.grid.counts)}\n{self.consumer.output()[-4000:]}")  # fmt: skip


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    started = Rig(tmp_path)
    try:
        yield started.start()
    finally:
        started.close()


def test_one_budget_holds_across_a_scale_set_of_four_with_two_agents(rig: Rig) -> None:
    # A VM resource health reports Unavailable holds the slot: web_0's reboot waits.
    rig.grid.health("web_3", "Unavailable")  # web_3 has no agent
    eventually(lambda: rig.taken("health") >= 1, WAIT, "the health change taken", rig.details)
    first = rig.reboot("web_0", LONG_NOTICE)
    eventually(lambda: rig.decided(first, "Defer"), WAIT, "web_0's reboot deferred",
               rig.details)  # fmt: skip
    assert rig.approved_at(first) is None
    rig.grid.health("web_3", "Available")
    eventually(lambda: rig.approved_at(first), WAIT, "web_0's reboot approved", rig.details)
    eventually(lambda: rig.event(first)["endedAt"], WAIT, "web_0's reboot over", rig.details)

    # An agent-less VM's event while its neighbours' agents live: one of them carries it (a
    # live agent always before ARM); it holds the slot until Event Grid says it is over.
    down = rig.reboot("web_2", LONG_NOTICE, run_time=1200.0)
    eventually(lambda: rig.approved_at(down), WAIT, "web_2's reboot approved by a neighbour",
               rig.details)  # fmt: skip
    assert rig.event(down)["approvedBy"] in AGENTS
    second = rig.reboot("web_1", LONG_NOTICE)
    eventually(lambda: rig.decided(second, "Defer"), WAIT, "web_1's reboot deferred",
               rig.details)  # fmt: skip
    approved = eventually(lambda: rig.approved_at(second), WAIT, "web_1's reboot approved",
                          rig.details)  # fmt: skip
    ended = rig.event(down)["endedAt"]
    assert ended is not None, rig.details()
    assert approved >= ended, rig.details()
    eventually(lambda: rig.event(second)["endedAt"], WAIT, "web_1's reboot over", rig.details)

    # The agents are gone: no agent sees the agent-less VMs' events any more, so ARM's
    # acknowledge carries their approvals, long before NotBefore, one at a time.
    for agent in rig.agents:
        agent.stop()
    third = rig.reboot("web_3", LONG_NOTICE, run_time=900.0)
    eventually(lambda: rig.approved_at(third, "ARM"), WAIT, "web_3's reboot approved through ARM",
               rig.details)  # fmt: skip
    fourth = rig.reboot("web_2", LONG_NOTICE, run_time=60.0)
    eventually(lambda: rig.decided(fourth, "Defer"), WAIT, "web_2's second reboot deferred",
               rig.details)  # fmt: skip
    arm_at = eventually(lambda: rig.approved_at(fourth, "ARM"), WAIT,
                        "web_2's second reboot approved through ARM", rig.details)  # fmt: skip
    assert arm_at >= rig.event(third)["endedAt"], rig.details()
    for event_id in (third, fourth):
        assert rig.event(event_id)["approvedBy"] == "ARM"
        assert rig.event(event_id)["startedAt"] < rig.event(event_id)["notBefore"]
        eventually(partial(rig.carried_by_arm, event_id), WAIT, "ARM's Approval record",
                   rig.details)  # fmt: skip
    # Every VM of the set was told of through Event Grid, whose records stand in the
    # consumer's sinks beside its decisions, and the budget held across all four.
    eventually(lambda: rig.azure_named() >= {"web_0", "web_1", "web_2", "web_3"}, WAIT,
               "Event Grid's records of all four VMs", rig.details)  # fmt: skip
    assert rig.impacted_at_once() == 1, rig.details()
    assert {a.vm for a in rig.sim.approvals() if a.via == "ARM"} == {"web_2", "web_3"}
    assert rig.arm.tokens_seen
    assert all(rig.sim.issued[t] == "https://management.azure.com" for t in rig.arm.tokens_seen)


def test_the_reconciler_catches_what_every_lost_delivery_missed(tmp_path: Path) -> None:
    """Event Grid loses every delivery; Resource Graph holds web_3 Unavailable: the consumer's
    first reconciler pass (at its start, as its managed identity, over HTTPS) holds the slot."""
    with ResourceGraphDouble() as graph:
        rig = Rig(tmp_path, GridFaults(loss=1.0), graph)
        subscription = rig.sim.fleet.vm("web_3").subscription_id
        row = row_of(eg.health("web_3", "Unavailable", datetime.now(timezone.utc),
                               resource_group=rig.sim.fleet.vm("web_3").resource_group,
                               subscription=subscription))  # fmt: skip
        graph.tables["healthresources"].append(row)
        try:
            rig.start()
            rig.grid.health("web_3", "Unavailable")  # lost, as every delivery here
            eventually(lambda: rig.taken("health") >= 1, WAIT, "the reconciler's health change",
                       rig.details)  # fmt: skip
            first = rig.reboot("web_0", LONG_NOTICE)
            eventually(lambda: rig.decided(first, "Defer"), WAIT, "web_0's reboot deferred",
                       rig.details)  # fmt: skip
            assert rig.approved_at(first) is None
            assert rig.grid.counts["sent"] == 0
            assert any(r.authorized and r.status == 200 for r in graph.requests)
        finally:
            rig.close()
