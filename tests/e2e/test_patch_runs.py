"""A Tuesday patch run within the budgets, end to end (issue 40, item 1): a scale set of 4
(agents on web_0 and web_1) under a `max_vms: 1` budget; Update Manager's maintenance
configuration "tuesday" is assigned to the whole set. Its pre-maintenance event reaches
`se-bridge consume` (a real process) through Event Grid's event hub (a local hub), the run's
VMs are read from the Resource Graph double over HTTPS, and the run, which would patch every
VM of the set at once, is cancelled through the ARM double's applyUpdates over HTTPS, with the
consumer's managed-identity token from the simulator's identity endpoint, before its cut-off:
one PUT, a Decision record Cancel, a notice and the metric."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from bridge.commands import signing
from bridge.config import CommandsSettings, IdentitySettings
from bridge.consumer.state.sqlite import SqliteStore
from bridge.localhub import LocalHub
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import Fleet
from bridge.simulator.vms import vms_from_spec
from tests.doubles.arm import ArmDouble, issued_for_arm
from tests.doubles.resourcegraph import ResourceGraphDouble
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


class Rig:
    def __init__(self, root: Path, graph: ResourceGraphDouble) -> None:
        self.root, self.graph = root, graph
        self.procs = Processes(root)
        self.sim = Simulator(Fleet(vms_from_spec({"scaleSets": [{"name": "web", "count": 4}]},
                                                 seed=40)))  # fmt: skip
        self.server = SimulatorServer(self.sim)
        self.hub, self.grid_hub = root / "hub", root / "eventgrid"
        self.commands, self.decisions = root / "commands", root / "decisions.jsonl"
        self.arm = ArmDouble(accept_token=issued_for_arm(self.sim.issued))
        self.consumer: Proc | None = None
        # What other end-to-end tests of Azure's planned maintenance add to this rig (the
        # week ahead's, tests/e2e/test_week_ahead.py): settings, sinks, certificates to trust.
        self.more_config = ""
        self.more_env: dict[str, str] = {}
        self.more_args: tuple[str, ...] = ()
        self.more_cas: list[Path] = []
        self.key = root / "signing.pem"
        vm = self.sim.fleet.vm("web_0")
        self.subscription, self.group = vm.subscription_id, vm.resource_group
        self.configuration = (
            f"/subscriptions/{self.subscription}/resourceGroups/rg-patch/providers/"
            "Microsoft.Maintenance/maintenanceConfigurations/tuesday"
        )
        scale_set = (f"/subscriptions/{self.subscription}/resourceGroups/{self.group}/providers/"
                     "Microsoft.Compute/virtualMachineScaleSets/web")  # fmt: skip
        graph.tables["maintenanceresources"].append({
            "id": f"{scale_set}/providers/Microsoft.Maintenance/configurationAssignments/tuesday",
            "name": "tuesday", "type": "microsoft.maintenance/configurationassignments",
            "subscriptionId": self.subscription, "resourceGroup": self.group,
            "properties": {"maintenanceConfigurationId": self.configuration,
                           "resourceId": scale_set},
        })  # fmt: skip

    def start(self) -> Rig:
        self.server.start()
        self.arm.start()
        key = self.key
        signing.keygen(key)
        signer = signing.load_signer(CommandsSettings(signing_key=f"file:{key}"),
                                     IdentitySettings())  # fmt: skip
        verify = {"SE_BRIDGE_COMMANDS_VERIFY_KEY": signing.verify_key_text(signer.public_key()),
                  "SE_BRIDGE_AGENT_HEARTBEAT_INTERVAL": "5"}  # fmt: skip
        for vm in AGENTS:
            args = ("--sink", f"hub:{self.hub}", "--commands", f"local:{self.commands}")
            Agent(self.procs, vm, self.server.vm_url(vm), args=args, env=verify).start()
        policy = self.root / "policy.yaml"
        policy.write_text(POLICY, encoding="utf-8")
        return self.start_consumer()

    def start_consumer(self) -> Rig:
        """`se-bridge consume` (again, after a stop), reading the fleet state it left."""
        config, policy = self.root / "consumer.toml", self.root / "policy.yaml"
        config.write_text(
            "[consumer]\nreevaluate_interval = 0.5\n\n[eventgrid]\nenabled = true\n"
            f'hub = "{self.grid_hub}"\nsubscriptions = ["{self.subscription}"]\n'
            f'arm_endpoint = "{self.arm.endpoint}"\nresource_graph_url = "{self.graph.url}"\n\n'
            '[patchruns]\nenabled = true\non_breach = "cancel"\ncancel = true\n'
            f"{self.more_config}",
            encoding="utf-8",
        )
        bundle = self.root / "ca-bundle.pem"
        cas = [Path(self.arm.ca_bundle), Path(self.graph.ca_bundle), *self.more_cas]
        bundle.write_bytes(b"".join(ca.read_bytes() for ca in cas))
        env = {"SE_BRIDGE_COMMANDS_SIGNING_KEY": f"file:{self.key}",
               "SE_BRIDGE_IDENTITY_KIND": "managed",
               **self.arm.client_environment(self.server.vm_url("web_0")),
               "REQUESTS_CA_BUNDLE": str(bundle), "CURL_CA_BUNDLE": str(bundle),
               **self.more_env}  # fmt: skip
        self.consumer = self.procs.bridge(
            "consumer", "consume", "--hub", str(self.hub), "--commands", f"local:{self.commands}",
            "--state", f"sqlite:{self.root / 'fleet.db'}", "--policy", str(policy),
            "--state-dir", str(self.root / "consumer"), "--sink", f"jsonl:{self.decisions}",
            "--config", str(config), "--metrics-address", "0", *self.more_args, env=env,
        )  # fmt: skip
        return self

    def close(self) -> None:
        self.procs.close()
        self.arm.stop()
        self.server.stop()

    def deliver(self, body: str) -> None:
        """Event Grid's event subscription delivers `body` into its event hub."""
        with LocalHub(self.grid_hub) as hub:
            hub.append([(str(uuid.uuid4()), body)])

    def records(self) -> list[dict[str, Any]]:
        if not self.decisions.exists():
            return []
        return [json.loads(line) for line in self.decisions.read_text().splitlines() if line]

    def heard(self) -> bool:
        """The consumer knows both agents' VMs (their heartbeats came)."""
        path = self.root / "fleet.db"
        return path.exists() and len(SqliteStore(path).scan("vm")) >= len(AGENTS)

    def outcome(self, name: str) -> float:
        assert self.consumer is not None
        samples = scrape(self.consumer.output)
        return samples.get(f'se_bridge_consumer_patch_runs_total{{outcome="{name}"}}', 0.0)

    def details(self) -> str:
        assert self.consumer is not None
        return (f"arm: {self.arm.requests}\ngraph: {self.graph.requests}\n"
                f"{self.consumer.output()[-4000:]}")  # fmt: skip


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    with ResourceGraphDouble() as graph:
        started = Rig(tmp_path, graph)
        try:
            yield started.start()
        finally:
            started.close()


def test_a_tuesday_patch_run_of_a_whole_max_vms_1_scale_set_is_cancelled_before_its_cut_off(
    rig: Rig,
) -> None:
    eventually(rig.heard, WAIT, "both agents heard", rig.details)
    # Update Manager's pre-event, 35 minutes ahead, its cut-off 10 minutes before the start.
    now = datetime.now(timezone.utc).replace(microsecond=0)
    start = now + timedelta(minutes=35)
    run = f"{start:%Y%m%d%H%M%S}"
    rig.arm.offer_run(rig.configuration, run, start - timedelta(minutes=10))
    rig.deliver(eg.maintenance("pre", start, now, configuration=rig.configuration))
    eventually(lambda: rig.arm.cancels(rig.configuration, run) >= 1, WAIT,
               "the run cancelled through applyUpdates", rig.details)  # fmt: skip
    eventually(lambda: rig.outcome("cancelled") == 1, WAIT, "the metric", rig.details)
    (cancel,) = [r for r in rig.records() if r.get("DecisionAction") == "Cancel"]
    assert cancel["EventId"] == f"(patch:tuesday/{run})"
    assert "on_breach cancel: cancelled before its cut-off" in cancel["DecisionReason"]
    assert "more than the 1 allowed" in cancel["DecisionExplanation"]
    # Delivered again (Event Grid delivers at least once): never cancelled twice.
    rig.deliver(eg.maintenance("pre", start, now, configuration=rig.configuration))
    eventually(lambda: rig.graph.requests, WAIT, "Resource Graph asked", rig.details)
    assert rig.arm.cancels(rig.configuration, run) == 1
    assert all(r.authorized for r in rig.graph.requests)
    (put,) = [r for r in rig.arm.requests if r.method == "PUT"]
    assert put.status == 200
    assert rig.arm.tokens_seen  # a real token the simulator's identity endpoint issued for ARM
