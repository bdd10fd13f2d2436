"""The drain case of the chaos run (issue 30): Kubernetes nodes drained under kills and an API
server that comes and goes, with a consumer granting the drains.

    report = run_drain_chaos(Path("/tmp/chaos-drains"), cycles=20, seed=7)

In this process: the IMDS simulator and the Kubernetes API double. As child processes: one
`se-bridge agent` per node with `[kubernetes]` on (the nodes of one pool; the first gives up
with `on_deadline = approve`, the second with `hold`), and one `se-bridge consume` with
`approve_when_ready` and a one-node-per-pool budget, over the local hub and command channel,
commands signed. Each cycle gives one or two nodes an event, most with a pod that a
PodDisruptionBudget keeps on the node for a while (a blocked drain), some with a NotBefore so
close that the drain gives up; meanwhile agents are killed -9 and the API server goes down and
up at random. Then the budgets let the pods go, every event of the cycle must end, and at the
end of every cycle:

- no node is cordoned or tainted by se-bridge once its events ended (its `Uncordoned` record
  follows within a time limit);
- no approval reaches IMDS before that node's drain finished: a `Drained` Hook record, or a
  `GaveUp` with exit code 0 (`on_deadline = approve`) whose output says so, written before it.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bridge.commands import signing
from bridge.config import CommandsSettings, IdentitySettings
from bridge.kubernetes.drain import CORDONED_FOR, TAINT_KEY
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import EventSpec, Fleet
from bridge.simulator.vms import vms_from_spec
from tests.chaos.invariants import Report, read_jsonl
from tests.doubles.kubeapi import KubeApiDouble, Request
from tests.support.processes import Agent, Proc, Processes
from tests.support.wait import within

log = logging.getLogger(__name__)

NODES = ("aks-pool1-0", "aks-pool1-1")
APPROVES_ON_DEADLINE = NODES[0]  # kubernetes.on_deadline = approve; the other holds
GIVE_UP_BEFORE = 60.0
SHORT_NOTICE = GIVE_UP_BEFORE + 5  # five seconds to drain, then the deadline
CYCLE_LIMIT = 120.0  # seconds for every event of a cycle to end and its node to be back
POLICY_YAML = """\
version: 1
budgets:
  - {name: one-node-per-pool, group: node_pool, max_vms: 1}
rules:
  - name: drain-first
    action: {approve_when_ready: {deadline: 1h, on_deadline: hold}}
"""
CONSUMER_TOML = "[consumer]\nreevaluate_interval = 0.5\n"


@dataclass
class Cycle:
    number: int
    events: dict[str, str] = field(default_factory=dict)  # EventId: node
    short: set[str] = field(default_factory=set)  # the events given too little notice
    began: float = field(default_factory=time.time)


class DrainChaos:
    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.rng = random.Random(f"drain-chaos-{seed}")
        self.procs = Processes(root)
        fleet = vms_from_spec({"vms": [{"name": node} for node in NODES]}, seed)
        self.sim = Simulator(Fleet(fleet, time_scale=1.0, seed=seed))
        self.server = SimulatorServer(self.sim)
        self.kube = KubeApiDouble()
        self.agents: dict[str, Agent] = {}
        self.consumer: Proc | None = None
        self.counts: Counter[str] = Counter()
        self.api_down = False

    # --- the rig ---------------------------------------------------------------------------

    def start(self) -> DrainChaos:
        self.server.start()
        self.kube.start()
        for node in NODES:
            self.kube.add_node(node, labels={"kubernetes.azure.com/agentpool": "pool1"})
            self.kube.add_pod("kube-system", f"proxy-{node}", node, owner="DaemonSet")
        key = self.root / "signing.pem"
        signing.keygen(key)
        signer = signing.load_signer(
            CommandsSettings(signing_key=f"file:{key}"), IdentitySettings()
        )
        verify = signing.verify_key_text(signer.public_key())
        hub, commands = self.root / "hub", self.root / "commands"
        kubeconfig = self.kube.kubeconfig(self.root)
        for node in NODES:
            on_deadline = "approve" if node == APPROVES_ON_DEADLINE else "hold"
            env = {
                "SE_BRIDGE_COMMANDS_VERIFY_KEY": verify,
                "SE_BRIDGE_KUBERNETES_ENABLED": "true",
                "SE_BRIDGE_KUBERNETES_NODE_NAME": node,
                "SE_BRIDGE_KUBERNETES_KUBECONFIG": str(kubeconfig),
                "SE_BRIDGE_KUBERNETES_EVICTION_RETRY": "0.2",
                "SE_BRIDGE_KUBERNETES_BLOCKED_REPORT_INTERVAL": "1",
                "SE_BRIDGE_KUBERNETES_GIVE_UP_BEFORE": str(GIVE_UP_BEFORE),
                "SE_BRIDGE_KUBERNETES_ON_DEADLINE": on_deadline,
            }
            args = ("--sink", f"hub:{hub}", "--commands", f"local:{commands}")
            self.agents[node] = Agent(self.procs, node, self.server.vm_url(node), args=args,
                                      env=env).start()  # fmt: skip
        policy, config = self.root / "policy.yaml", self.root / "consumer.toml"
        policy.write_text(POLICY_YAML, encoding="utf-8")
        config.write_text(CONSUMER_TOML, encoding="utf-8")
        self.consumer = self.procs.bridge(
            "consumer", "consume", "--hub", str(hub), "--commands", f"local:{commands}",
            "--state", f"sqlite:{self.root / 'fleet.db'}", "--policy", str(policy),
            "--config", str(config), "--state-dir", str(self.root / "consumer"),
            "--sink", f"jsonl:{self.root / 'decisions.jsonl'}",
            env={"SE_BRIDGE_COMMANDS_SIGNING_KEY": f"file:{key}"},
        )  # fmt: skip
        # The consumer grants drains only to agents whose heartbeat names their node, and
        # counts a node in its pool's budget once one names its pool.
        for node in NODES:
            within(lambda n=node: self._heard(n), 60, f"{node}'s pool in a heartbeat")  # type: ignore[misc]
        return self

    def _heard(self, node: str) -> bool:
        return any(r.get("NodePool") == "pool1" for r in self.records(node))

    def close(self) -> None:
        self.procs.close()
        self.kube.stop()
        self.server.stop()

    def records(self, node: str) -> list[dict[str, Any]]:
        return read_jsonl(self.agents[node].sink)[1]

    # --- a cycle ---------------------------------------------------------------------------

    def cycle(self, number: int) -> Cycle:
        cycle = Cycle(number)
        nodes = self.rng.sample(NODES, self.rng.choice((1, 2)))
        guards = []
        for node in nodes:
            app = f"web-{number}-{node}"
            self.kube.add_pod("shop", app, node, labels={"app": app}, owner="ReplicaSet",
                              linger=self.rng.choice((0.0, 0.3)))  # fmt: skip
            self.kube.add_pod("shop", f"cache-{number}-{node}", node, owner="ReplicaSet")
            # Alone in its cycle: a drain that waited for the other node's slot would give up
            # before it even began. Guarded, so that it does give up.
            short = len(nodes) == 1 and node == APPROVES_ON_DEADLINE and self.rng.random() < 0.4
            if short or self.rng.random() < 0.7:
                self.kube.add_budget("shop", f"pdb-{app}", {"app": app}, allowed=0)
                guards.append(f"pdb-{app}")
            notice = SHORT_NOTICE if short else 3600.0
            event_id = self.sim.add_event(EventSpec("Reboot", (node,), notice=notice,
                                                    run_time=1.0))  # fmt: skip
            cycle.events[event_id] = node
            if short:
                cycle.short.add(event_id)
                self.counts["events given too little notice to drain"] += 1
        self.counts["events"] += len(nodes)
        for _ in range(self.rng.randint(1, 3)):
            time.sleep(self.rng.uniform(0.2, 2.5))  # the moment of the blow: random
            self.blow()
        if self.api_down:
            self.kube.up()
            self.api_down = False
        if cycle.short:  # left blocked until past their deadline
            within(lambda: self._over(cycle), 30, "the short drains to end")
        for name in guards:
            self.kube.allow(name, 1)
        return cycle

    def _over(self, cycle: Cycle) -> bool:
        """Whether the drain of each short event has its outcome (Drained, GaveUp, Failed)."""
        return all(any(r.get("HookName") == "drain" and r["EventId"] == e
                       and r.get("HookExitCode") is not None for r in self.records(n))
                   for e, n in cycle.events.items() if e in cycle.short)  # fmt: skip

    def blow(self) -> None:
        """Kill -9 an agent (mostly mid-drain) and restart it, or take the API server down or
        bring it back."""
        if self.rng.random() < 0.6:
            node = self.rng.choice(NODES)
            agent = self.agents[node]
            agent.proc.kill()
            self.counts["agent kills (SIGKILL)"] += 1
            if self._draining(node):
                self.counts["kills mid-drain"] += 1
            agent.start()
        elif self.api_down:
            self.kube.up()
            self.api_down = False
        else:
            self.kube.down()
            self.api_down = True
            self.counts["API server outages"] += 1

    def _draining(self, node: str) -> bool:
        """Whether `node`'s latest drain record is progress (Draining or Blocked)."""
        drains = [r["DrainStatus"] for r in self.records(node) if r.get("HookName") == "drain"]
        return bool(drains) and drains[-1] in ("Draining", "Blocked")

    # --- the checks at the end of a cycle --------------------------------------------------

    def settle(self, cycle: Cycle) -> list[str]:
        """Wait for the cycle's events to end and their nodes to be back; the problems."""

        def ended() -> bool:
            events = {e["eventId"]: e for e in self.sim.events()}
            return all(events[e]["endedAt"] is not None for e in cycle.events)

        def back() -> bool:
            return ended() and all(self.clean(node) for node in set(cycle.events.values()))

        if within(back, CYCLE_LIMIT, f"cycle {cycle.number} to end", interval=0.2):
            return []
        events = {e["eventId"]: e for e in self.sim.events()}
        problems = [f"cycle {cycle.number}: event {e} on {node} was still {events[e]['status']} "
                    f"{CYCLE_LIMIT:g} s on" for e, node in cycle.events.items()
                    if events[e]["endedAt"] is None]  # fmt: skip
        for e in cycle.events:
            if events[e]["endedAt"] is None:
                self.sim.cancel_event(e)  # so that the next cycles are not blocked by it
        return problems

    def clean(self, node: str) -> bool:
        """Whether nothing se-bridge sets is on `node` (no one else cordons in this run)."""
        found = self.kube.node(node)
        spec, notes = found["spec"], found["metadata"].get("annotations") or {}
        taints = [t for t in spec.get("taints") or [] if t["key"] == TAINT_KEY]
        return not spec.get("unschedulable") and not taints and CORDONED_FOR not in notes

    def check(self, cycle: Cycle) -> list[str]:
        problems = []
        events = {e["eventId"]: e for e in self.sim.events()}
        for node in NODES:
            mine = [e for e, n in cycle.events.items() if n == node]
            if all(events[e]["endedAt"] is not None for e in mine) and not self.clean(node):
                found = self.kube.node(node)
                problems.append(f"cycle {cycle.number}: node {node} left cordoned or tainted by "
                                f"se-bridge after its events ended: {found}")  # fmt: skip
        for approval in self.sim.approvals():
            event_id = approval.event_id or ""
            if event_id in cycle.events:
                self.counts["approvals"] += 1
                problems += self._approved_after_drain(cycle, cycle.events[event_id], event_id,
                                                       approval.at)  # fmt: skip
        return problems

    def _approved_after_drain(self, cycle: Cycle, node: str, event_id: str, at: float) -> list[str]:
        ready = [r for r in self.records(node) if r.get("HookName") == "drain"
                 and r["EventId"] == event_id and r.get("HookExitCode") == 0
                 and r["HookPhase"] == "prepare"]  # fmt: skip
        before = [r for r in ready if _when(r) <= at]
        if not before:
            said = _statuses(self.records(node), event_id)
            return [f"cycle {cycle.number}: event {event_id} approved on {node} at {at:.3f} with "
                    f"no finished drain before it (its drain records: {said})"]  # fmt: skip
        first = before[0]
        if first["DrainStatus"] == "Drained":
            return []
        if first["DrainStatus"] != "GaveUp" or "on_deadline = approve" not in (
            first.get("HookOutput") or ""
        ):
            return [f"cycle {cycle.number}: event {event_id} approved on {node} after a "
                    f"{first['DrainStatus']} record that does not say why: {first}"]  # fmt: skip
        self.counts["approved by on_deadline = approve"] += 1
        return []


def overlaps(requests: list[Request]) -> int:
    """How many times a node was marked (tainted) by se-bridge while another node of the pool
    still was, from the PATCHes the API server received in order. The pool's budget is one
    node, but its slot is freed when the event ends, and the node is uncordoned just after:
    a count above 0 says a grant overtook an uncordon (reported, not a violation)."""
    marked: dict[str, bool] = {}
    count = 0
    for request in requests:
        spec = (request.body or {}).get("spec") if request.method == "PATCH" else None
        if not isinstance(spec, dict) or "taints" not in spec:
            continue
        node = request.path.rsplit("/", 1)[-1]
        ours = any(t.get("key") == TAINT_KEY for t in spec["taints"] or [])
        if ours and not marked.get(node) and any(v for n, v in marked.items() if n != node):
            count += 1
        marked[node] = ours
    return count


def _when(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(record["TimeGenerated"]).timestamp()


def _statuses(records: list[dict[str, Any]], event_id: str) -> list[str]:
    return [r["DrainStatus"] for r in records if r.get("HookName") == "drain"
            and r["EventId"] == event_id]  # fmt: skip


def run_drain_chaos(root: Path, *, cycles: int, seed: int) -> Report:
    began = time.monotonic()
    chaos = DrainChaos(root, seed)
    report = Report()
    try:
        chaos.start()
        for number in range(1, cycles + 1):
            cycle = chaos.cycle(number)
            report.add(chaos.settle(cycle))
            report.add(chaos.check(cycle))
            log.info("drain chaos: cycle %d of %d, %s", number, cycles, dict(chaos.counts))
        for node in NODES:
            code = chaos.agents[node].stop()
            if code != 0:
                report.problems.append(f"agent {node} exited with {code} on SIGTERM, not 0")
        assert chaos.consumer is not None
        if (code := chaos.consumer.stop()) != 0:
            report.problems.append(f"the consumer exited with {code} on SIGTERM, not 0")
    finally:
        chaos.close()
    drains = [r for node in NODES for r in chaos.records(node) if r.get("HookName") == "drain"]
    statuses = Counter(r["DrainStatus"] for r in drains)
    report.numbers = {
        "case": "drains (Kubernetes nodes)",
        "seed": seed,
        "cycles": cycles,
        **dict(sorted(chaos.counts.items())),
        "drain records": dict(sorted(statuses.items())),
        "drains begun while another node of the pool was still marked": overlaps(
            chaos.kube.requests
        ),
        "process starts": len(chaos.procs._procs),
        "duration": f"{time.monotonic() - began:.0f} s",
    }
    return report
