"""The chaos rig: a simulated fleet, its agents, one consumer and every sink, on one machine.

In this process: the IMDS simulator (so faults and events change without a round trip), the
Event Hubs test broker and the Logs Ingestion double (so outages are a method call). As child
processes: one `se-bridge agent` per VM, shipping to four sinks (the local hub the consumer
reads, a jsonl file, Event Hubs and Log Analytics) with a local command channel, and one
`se-bridge consume` over the hub with a policy whose allowed set is known by construction.
Commands are signed: the consumer holds the private key, agents the public one.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bridge import schema
from bridge.commands import signing
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.eventgrid import EventGridDouble, GridFaults
from bridge.simulator.fleet import EventSpec, Fleet
from bridge.simulator.vms import vms_from_spec
from tests.chaos.twins import Twins
from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.doubles.logs_ingestion import LogsIngestionDouble
from tests.support.cloud import RULE, cloud_env
from tests.support.processes import Agent, Proc, Processes

SCALE_SETS = {"web": ("web_0", "web_1"), "app": ("app_0", "app_1")}
VMS = tuple(vm for members in SCALE_SETS.values() for vm in members)
FLEET_SPEC = {"scaleSets": [{"name": name, "count": len(m)} for name, m in SCALE_SETS.items()]}
BUDGET = 1  # VMs per scale set, the policy's only budget

# Allowed by construction: a user's Reboot of one VM (approve, within the budget). Held: any
# Platform event (hold), and a user's Reboot of a whole scale set (two VMs can never fit in a
# budget of one, so it is held and would start at NotBefore).
POLICY_YAML = f"""\
version: 1
budgets:
  - {{name: one-per-scale-set, group: scale_set, max_vms: {BUDGET}}}
rules:
  - name: user-reboots
    match: {{event_source: User, event_type: Reboot}}
    action: approve
  - name: everything-else
    action: hold
"""
# VMs are alive while heard from within 20 s (agents heartbeat every 5 s): a twin deleted
# after its Preempt started has its budget slot released within the run (tests/chaos/twins).
CONSUMER_TOML = "[consumer]\napproval_timeout = 4\nreevaluate_interval = 0.5\nalive_within = 20\n"
# Azure's view beside the agents' (issue 36): every event also comes through the Event Grid
# double, late, twice, out of order or never; the budgets must hold all the same.
GRID_FAULTS = GridFaults(delay=0.5, duplicate=0.2, reorder=0.2, reorder_by=2.0, loss=0.1)
HEARTBEAT_INTERVAL = "5"
POLL_INTERVAL = "0.25"


def allowed(spec: EventSpec) -> bool:
    """Whether the policy above lets se-bridge approve an event of this shape, ever."""
    return spec.event_source == "User" and spec.event_type == "Reboot" and len(spec.resources) == 1


def scale_set_of(vm: str) -> str:
    return next(name for name, members in SCALE_SETS.items() if vm in members)


@dataclass
class Kinds:
    """What the script made, by EventId: the spec, so the checks know what was allowed."""

    specs: dict[str, EventSpec] = field(default_factory=dict)


class Rig:
    """Everything started; `close` stops whatever still runs."""

    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.rng = random.Random(f"chaos-{seed}")
        self.procs = Processes(root)
        self.sim = Simulator(Fleet(vms_from_spec(FLEET_SPEC, seed), time_scale=1.0, seed=seed))
        self.server = SimulatorServer(self.sim)
        self.broker = EventHubsBroker(hub="records", partitions=4)
        self.logs = LogsIngestionDouble(RULE, schema.DCR_STREAM, schema.dcr_stream_declaration())
        self.hub, self.commands = root / "hub", root / "commands"
        self.fleet_db, self.decisions = root / "fleet.db", root / "decisions.jsonl"
        self.kinds = Kinds()
        self.victim = root / "victim"  # what a planted link points at: never to be touched
        self.planted: list[Path] = []
        self.agents: dict[str, Agent] = {}
        self.consumer_runs: list[Proc] = []
        subscription = self.sim.fleet.vm(VMS[0]).subscription_id
        self.twins = Twins(self.hub, subscription, random.Random(f"twins-{seed}"))
        self.subscription, self.grid_hub = subscription, root / "eventgrid"
        self.grid = EventGridDouble(self.sim, self.grid_hub, GRID_FAULTS, seed=seed)

    def plant_hostile(self, vm: str, n: int) -> list[Path]:
        """Entries a hostile local user could put in `vm`'s command channel: a link to a
        victim file, a named pipe and a directory, each named like a command."""
        if not self.victim.exists():
            self.victim.mkdir()
            (self.victim / "precious.json").write_text('{"keep": true}', encoding="utf-8")
        folder = self.commands / self.sim.fleet.vm(vm).vm_id.lower()
        folder.mkdir(parents=True, exist_ok=True)
        link, pipe, sub = (folder / f"hostile-{n}-{kind}.json" for kind in ("link", "pipe", "dir"))
        link.symlink_to(self.victim / "precious.json")
        os.mkfifo(pipe)
        sub.mkdir()
        self.planted += [link, pipe, sub]
        return [link, pipe, sub]

    def start(self) -> Rig:
        self.server.start()
        self.grid.start()
        self.broker.start()
        self.logs.start()
        signing_key, verify_key = self._keys()
        for vm in VMS:
            env = cloud_env(self.broker, self.logs, self.server.vm_url(vm))
            env["SE_BRIDGE_COMMANDS_VERIFY_KEY"] = verify_key
            env["SE_BRIDGE_AGENT_HEARTBEAT_INTERVAL"] = HEARTBEAT_INTERVAL
            args = ("--sink", f"hub:{self.hub}", "--sink", "eventhubs", "--sink", "loganalytics",
                    "--commands", f"local:{self.commands}")  # fmt: skip
            self.agents[vm] = Agent(self.procs, vm, self.server.vm_url(vm), args=args, env=env)
            self.agents[vm].start()
        self.consumer_env = {"SE_BRIDGE_COMMANDS_SIGNING_KEY": f"file:{signing_key}"}
        self.start_consumer()
        return self

    def _keys(self) -> tuple[Path, str]:
        path = self.root / "signing.pem"
        signing.keygen(path)
        private = serialization.load_pem_private_key(path.read_bytes(), password=None)
        assert isinstance(private, Ed25519PrivateKey)
        return path, signing.verify_key_text(private.public_key())

    def consumer_argv(self) -> list[str]:
        policy, config = self.root / "policy.yaml", self.root / "consumer.toml"
        policy.write_text(POLICY_YAML, encoding="utf-8")
        grid = (f'\n[eventgrid]\nenabled = true\nhub = "{self.grid_hub}"\n'
                f'subscriptions = ["{self.subscription}"]\n')  # fmt: skip
        config.write_text(CONSUMER_TOML + grid, encoding="utf-8")
        return ["consume", "--hub", str(self.hub), "--commands", f"local:{self.commands}",
                "--state", f"sqlite:{self.fleet_db}", "--policy", str(policy),
                "--state-dir", str(self.root / "consumer"), "--sink", f"jsonl:{self.decisions}",
                "--config", str(config)]  # fmt: skip

    def start_consumer(self) -> Proc:
        name = f"consumer.{len(self.consumer_runs)}"
        proc = self.procs.bridge(name, *self.consumer_argv(), env=self.consumer_env)
        self.consumer_runs.append(proc)
        return proc

    @property
    def consumer(self) -> Proc:
        return self.consumer_runs[-1]

    def add_event(self, spec: EventSpec) -> str:
        event_id = self.sim.add_event(spec)
        self.kinds.specs[event_id] = spec
        return event_id

    def events(self) -> dict[str, dict[str, Any]]:
        """The simulator's view of every event made so far, finished ones included."""
        return {e["eventId"]: e for e in self.sim.events()}

    def approvals(self) -> list[dict[str, Any]]:
        return [a.to_json() for a in self.sim.approvals()]

    def decisions_written(self) -> list[dict[str, Any]]:
        if not self.decisions.exists():
            return []
        lines = self.decisions.read_bytes().split(b"\n")[:-1]
        return [json.loads(line) for line in lines if line.strip()]

    def close(self) -> None:
        self.procs.close()
        self.grid.stop()
        self.logs.stop()
        self.broker.stop()
        self.server.stop()
