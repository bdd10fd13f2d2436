"""Central approvals on one machine: simulator → agents → local hub → consumer → command
channel → agents → the simulator receives the approval. Every part is a real process."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.storage.queue import QueueClient

from bridge.commands import signing
from bridge.commands.message import Command, approve, command_id
from bridge.config import CommandsSettings, IdentitySettings
from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.support.azurite import Azurite
from tests.support.processes import (
    Agent,
    Proc,
    Processes,
    Record,
    Simulator,
    read_records,
    run_bridge,
    scrape,
)
from tests.support.wait import eventually

pytestmark = pytest.mark.e2e

FLEET = {"availabilitySets": [{"name": "app", "count": 2}]}
VMS = ("app-0", "app-1")


class Transport:
    """Local files (hub directory, command directories, SQLite state) for the loop."""

    name = "local"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.hub, self.commands = root / "hub", root / "commands"

    def agent_args(self, listen: bool) -> list[str]:
        hub = ["--sink", f"hub:{self.hub}"]
        return hub + (["--commands", f"local:{self.commands}"] if listen else [])

    def consumer_args(self) -> list[str]:
        return ["--hub", str(self.hub), "--commands", f"local:{self.commands}",
                "--state", f"sqlite:{self.root / 'fleet.db'}"]  # fmt: skip

    def env(self) -> dict[str, str]:
        return {}

    def forge(self, vm_id: str, text: str, name: str) -> None:
        folder = self.commands / vm_id.lower()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.json").write_text(text, encoding="utf-8")

    def pending(self, vm_id: str) -> int:
        return len(list((self.commands / vm_id.lower()).glob("*.json")))


class AzureTransport(Transport):
    """Event Hubs (the test broker) and Azure Storage (Azurite): tables, queues, checkpoints."""

    name = "azure"

    def __init__(self, root: Path, broker: EventHubsBroker, azurite: Azurite) -> None:
        super().__init__(root)
        self.broker, self.azurite = broker, azurite
        self.tag = uuid.uuid4().hex[:8]

    def agent_args(self, listen: bool) -> list[str]:
        return ["--sink", "eventhubs"] + (["--commands", "storagequeue"] if listen else [])

    def consumer_args(self) -> list[str]:
        return ["--commands", "storagequeue", "--state", "tables"]

    def env(self) -> dict[str, str]:
        return {
            "SE_BRIDGE_EVENTHUBS_CONNECTION_STRING": self.broker.connection_string,
            "SE_BRIDGE_STORAGE_CONNECTION_STRING": self.azurite.connection_string,
            "SE_BRIDGE_COMMANDS_QUEUE_PREFIX": f"t{self.tag}-",
            "SE_BRIDGE_CONSUMER_TABLE_NAME": f"fleet{self.tag}",
            "SE_BRIDGE_CONSUMER_CHECKPOINT_CONTAINER": f"checkpoints-{self.tag}",
            "SE_BRIDGE_CONSUMER_LOAD_BALANCING_INTERVAL": "2",
            "NO_PROXY": "127.0.0.1,localhost",
        }

    def _queue(self, vm_id: str) -> QueueClient:
        name = f"t{self.tag}-{vm_id.lower()}"
        return QueueClient.from_connection_string(self.azurite.connection_string, name)

    def forge(self, vm_id: str, text: str, name: str) -> None:
        with self._queue(vm_id) as queue:
            with contextlib.suppress(ResourceExistsError):
                queue.create_queue()
            queue.send_message(text)

    def pending(self, vm_id: str) -> int:
        with self._queue(vm_id) as queue:
            try:
                return int(queue.get_queue_properties().approximate_message_count or 0)
            except ResourceNotFoundError:
                return 0


AZURE = pytest.param("azure", marks=[pytest.mark.broker, pytest.mark.azurite])


@pytest.fixture(params=["local", AZURE])
def transport(request: pytest.FixtureRequest, procs: Processes) -> Transport:
    if request.param == "local":
        return Transport(procs.workdir)
    broker: EventHubsBroker = request.getfixturevalue("broker")
    azurite: Azurite = request.getfixturevalue("azurite")
    return AzureTransport(procs.workdir, broker, azurite)


class Loop:
    """The simulator, an agent per VM and one consumer, over one transport."""

    def __init__(
        self,
        procs: Processes,
        transport: Transport,
        consumer_args: Sequence[str] = (),
        deaf: Sequence[str] = (),
        fleet_spec: Mapping[str, Any] = FLEET,
    ) -> None:
        self.procs, self.transport = procs, transport
        root = procs.workdir
        # Signed commands, as in production: the consumer holds the key, agents its public half.
        key = root / "signing.pem"
        if not key.exists():
            signing.keygen(key)
        settings = CommandsSettings(signing_key=f"file:{key}")
        self.signer = signing.load_signer(settings, IdentitySettings())
        self.env = {
            **transport.env(),
            "SE_BRIDGE_COMMANDS_SIGNING_KEY": f"file:{key}",
            "SE_BRIDGE_COMMANDS_VERIFY_KEY": signing.verify_key_text(self.signer.public_key()),
        }
        fleet = root / "fleet.json"
        fleet.write_text(json.dumps(fleet_spec), encoding="utf-8")
        self.sim = Simulator.launch(procs, "sim", "--fleet", str(fleet))
        self.vms = tuple(self.sim.fleet())
        env = self.env
        # A deaf agent ships its records but never reads its commands: an approver that is
        # alive to the consumer and still never acts.
        self.agents = {
            vm: Agent(
                procs,
                vm,
                self.sim.vm_url(vm),
                env=env,
                args=transport.agent_args(listen=vm not in deaf),
            )
            for vm in self.vms
        }
        self.decisions = root / "decisions.jsonl"
        self.consumer_argv = [
            "consume", *transport.consumer_args(), "--state-dir", str(root / "consumer"),
            "--sink", f"jsonl:{self.decisions}", *consumer_args,
        ]  # fmt: skip
        self.consumer: Proc | None = None

    def start(self, agents: Sequence[str] | None = None) -> Loop:
        agents = self.vms if agents is None else agents
        for vm in agents:
            self.agents[vm].start()
        self.start_consumer()
        self.sim.wait_polls(dict.fromkeys(agents, 2))
        return self

    def start_consumer(self) -> None:
        self.consumer = self.procs.bridge("consumer", *self.consumer_argv, env=self.env)

    def vm_id(self, vm: str) -> str:
        return str(self.sim.fleet()[vm]["vmId"])

    def approvals(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.sim.call("GET", "/control/approvals")["approvals"]
        return found

    def wait_approved(self, event_id: str) -> dict[str, Any]:
        def approved() -> dict[str, Any] | None:
            return next((a for a in self.approvals() if a["eventId"] == event_id), None)

        return eventually(
            approved,
            what=f"the simulator to receive the approval of {event_id}",
            details=self.describe,
        )

    def approval_records(self, vm: str) -> list[Record]:
        return [r for r in self.agents[vm].records() if r["RecordType"] == "Approval"]

    def describe(self) -> str:
        parts = [a.describe() for a in self.agents.values() if a.runs]
        if self.consumer is not None:
            parts.append("--- consumer:\n" + self.consumer.output())
        parts.append("--- decisions:\n" + "\n".join(map(json.dumps, read_records(self.decisions))))
        return "\n".join(parts)


def test_user_reboot_is_approved_by_the_consumer(procs: Processes, transport: Transport) -> None:
    loop = Loop(procs, transport).start()
    event_id = loop.sim.add_event(EventType="Reboot", EventSource="User", Resources=["app-0"])
    approval = loop.wait_approved(event_id)
    assert approval["status"] == 200
    records = eventually(
        lambda: loop.approval_records(approval["vm"]),
        what="an Approval record",
        details=loop.describe,
    )
    assert records[0]["ApprovalOutcome"] == "Approved"
    assert records[0]["ApprovalSource"] == "Central"
    assert records[0]["ApprovalLatencyMs"] >= 0
    decisions = [d for d in read_records(loop.decisions) if d["EventId"] == event_id]
    assert [d["DecisionAction"] for d in decisions] == ["Approve"]
    assert decisions[0]["DecisionRule"] == "user-initiated"
    assert len([a for a in loop.approvals() if a["eventId"] == event_id]) == 1


def test_platform_reboot_is_held_and_never_approved(procs: Processes) -> None:
    loop = Loop(procs, Transport(procs.workdir)).start()
    event_id = loop.sim.add_event(EventType="Reboot", EventSource="Platform", Resources=["app-0"])

    def held() -> list[Record]:
        return [d for d in read_records(loop.decisions) if d["EventId"] == event_id]

    decisions = eventually(held, what="the Hold decision", details=loop.describe)
    assert decisions[0]["DecisionAction"] == "Hold"
    assert not [a for a in loop.approvals() if a["eventId"] == event_id]


def test_in_a_placement_group_the_vm_an_event_names_carries_its_approval(
    procs: Processes, transport: Transport
) -> None:
    # Reproduced (issue 27): every VM of a scale set sees each event and reports it; when a
    # neighbour's report was read first the approval went to the neighbour, which reads its
    # queue every commands.others_interval (10 s): 5 of 8 events approved after 10 s. How fast
    # is measured by `./dev bench --only 3` (3c), not asserted here.
    named = [f"web_{n}" for n in range(4)]
    loop = Loop(procs, transport, ["--metrics-address", "0"],
                fleet_spec={"scaleSets": [{"name": "web", "count": 4}]})  # fmt: skip
    assert sorted(loop.vms) == named
    loop.start()
    consumer = loop.consumer
    assert consumer is not None
    # As in a fleet that runs: the consumer has heard from every VM (their Start heartbeats).
    eventually(
        lambda: scrape(consumer.output)["se_bridge_consumer_records_total"] >= 4,
        what="every VM's first heartbeat folded",
        details=loop.describe,
    )
    carriers = {}
    for vm in [*named, *named]:
        event_id = loop.sim.add_event(EventType="Reboot", EventSource="User", Resources=[vm],
                                      notice=900.0)  # fmt: skip
        assert sorted(loop.sim.events()[event_id]["audience"]) == named
        carriers[event_id] = (vm, loop.wait_approved(event_id)["vm"])
        loop.sim.act(event_id, "complete")
    assert all(vm == carrier for vm, carrier in carriers.values()), carriers
    decisions = [d for d in read_records(loop.decisions) if d["DecisionAction"] == "Approve"]
    assert sorted(d["EventId"] for d in decisions) == sorted(carriers)


def _fast_fallback(workdir: Path) -> Path:
    config = workdir / "consumer.toml"
    config.write_text("[consumer]\napproval_timeout = 3\nreevaluate_interval = 0.5\n")
    return config


def test_fallback_when_the_chosen_vm_never_answers(procs: Processes, transport: Transport) -> None:
    config = ["--config", str(_fast_fallback(procs.workdir))]
    loop = Loop(procs, transport, config, deaf=["app-0"]).start(agents=("app-0",))
    event_id = loop.sim.add_event(EventType="Reboot", EventSource="User", Resources=VMS)

    def first_try() -> list[Record]:
        return [d for d in read_records(loop.decisions) if d["EventId"] == event_id]

    # app-1's agent starts only once the deaf app-0 holds the command, so the order of the
    # two VMs' reports cannot decide who is asked first.
    eventually(first_try, what="the approval sent to app-0", details=loop.describe)
    loop.agents["app-1"].start()
    approval = loop.wait_approved(event_id)
    assert approval["vm"] == "app-1"
    decisions = [d for d in read_records(loop.decisions) if d["EventId"] == event_id]
    approves = [d for d in decisions if d["DecisionAction"] == "Approve"]
    assert [(d["TargetVmName"], d["Attempt"]) for d in approves] == [("app-0", 1), ("app-1", 2)]
    assert len([a for a in loop.approvals() if a["eventId"] == event_id]) == 1


def test_forged_expired_and_misdirected_commands_are_refused(
    procs: Processes, transport: Transport
) -> None:
    loop = Loop(procs, transport).start(agents=("app-0",))
    assert loop.consumer is not None
    loop.consumer.stop()  # no central approvals: only the commands this test forges
    event_id = loop.sim.add_event(EventType="Reboot", EventSource="Platform", Resources=["app-0"])
    loop.agents["app-0"].wait_for(
        lambda rs: any(r.get("EventId") == event_id for r in rs), "the event"
    )
    vm0, vm1 = loop.vm_id("app-0"), loop.vm_id("app-1")
    now = time.time()
    expired = _command(vm0, event_id, issued=now - 600, expires=now - 60)
    elsewhere = _command(vm1, event_id, issued=now, expires=now + 600)
    unknown = _command(vm0, "00000000-0000-4000-8000-00000000dead", issued=now, expires=now + 600)
    # Signed with the consumer's own key: refused for what they say, not for who sent them.
    transport.forge(vm0, loop.signer.sign(expired).to_json(), "expired")
    transport.forge(vm0, loop.signer.sign(elsewhere).to_json(), "elsewhere")
    transport.forge(vm0, loop.signer.sign(unknown).to_json(), "unknown")
    transport.forge(vm0, '{"Type": "Approve", "EventId": 1}', "garbage")
    transport.forge(vm0, _command(vm0, event_id, issued=now, expires=now + 600).to_json(), "bare")

    def refusals(records: list[Record]) -> list[Record]:
        return [r for r in records if r["RecordType"] == "Approval"]

    records = loop.agents["app-0"].wait_for(lambda rs: len(refusals(rs)) >= 5, "5 refusals")
    outcomes = {r["ApprovalOutcome"] for r in refusals(records)}
    assert outcomes == {"Refused"}
    codes = {r["ApprovalDetail"].split(":")[0] for r in refusals(records)}
    assert {"Expired", "OtherVm", "Malformed", "Unsigned"} <= codes
    details = " | ".join(r["ApprovalDetail"] for r in refusals(records))
    assert vm1 in details
    assert not [a for a in loop.approvals() if a["eventId"] == event_id]
    eventually(lambda: transport.pending(vm0) == 0, what="the refused commands to be deleted")


def _command(vm_id: str, event_id: str, *, issued: float, expires: float) -> Command:
    def at(t: float) -> datetime:
        return datetime.fromtimestamp(t, timezone.utc)

    made = approve(vm_id=vm_id, event_id=event_id, document_incarnation=None,
                   issued_at=at(issued), expires_at=at(expires), rule="forged",
                   reason="written by the test")  # fmt: skip
    assert made.command_id == command_id(event_id, vm_id)
    return made


def test_policy_explain_on_the_consumers_state_and_an_agents_records(procs: Processes) -> None:
    transport = Transport(procs.workdir)
    loop = Loop(procs, transport).start()
    event_id = loop.sim.add_event(EventType="Reboot", EventSource="Platform", Resources=["app-0"])

    def held() -> list[Record]:
        return [d for d in read_records(loop.decisions) if d["EventId"] == event_id]

    [decision] = eventually(held, what="the Hold decision", details=loop.describe)
    state = f"sqlite:{transport.root / 'fleet.db'}"
    done = run_bridge("policy", "explain", "--state", state, "--event", event_id, "--json")
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert (said["DecisionAction"], said["DecisionRule"]) == ("Hold", "everything-else")
    assert said["DecisionExplanation"] == decision["DecisionExplanation"].splitlines()
    assert said["DecisionExplanation"][0].startswith(
        "rule user-initiated: does not match: EventSource Platform is not user"
    )
    # The same event from the records an agent wrote, with no consumer state at all.
    done = run_bridge("policy", "explain", "--records", str(loop.agents["app-0"].sink))
    assert done.returncode == 0, done.stderr
    assert f"event {event_id}: Reboot from Platform" in done.stdout
    assert "decision: Hold by everything-else" in done.stdout
    missing = run_bridge("policy", "explain", "--state", state, "--event", "no-such-event")
    assert missing.returncode == 2
    assert "holds no event no-such-event" in missing.stderr


def test_policy_check_says_what_is_wrong(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("version: 1\nrules:\n  - name: all\n    action: approve\n", encoding="utf-8")
    bad.write_text("version: 1\nrules:\n  - name: all\n    action: sometimes\n", encoding="utf-8")
    done = run_bridge("policy", "check", str(good))
    assert done.returncode == 0, done.stderr
    assert "all" in done.stdout
    done = run_bridge("policy", "check", str(bad))
    assert done.returncode == 2
    assert "sometimes" in done.stderr


def test_policy_check_counts_in_words(tmp_path: Path) -> None:
    one = tmp_path / "one.yaml"
    one.write_text("version: 1\nbudgets:\n  - {name: one, group: fleet, max_vms: 1}\n"
                   "rules:\n  - name: all\n    action: approve\n", encoding="utf-8")  # fmt: skip
    done = run_bridge("policy", "check", str(one))
    assert done.returncode == 0, done.stderr
    assert f"{one}: valid policy, 1 rule, 1 budget (first matching rule wins)" in done.stdout


def test_metrics_of_the_agent_and_the_consumer_count_an_approval(procs: Processes) -> None:
    loop = Loop(procs, Transport(procs.workdir), consumer_args=["--metrics-address", "0"])
    for agent in loop.agents.values():
        agent.env["SE_BRIDGE_AGENT_METRICS_ADDRESS"] = "0"
    loop.start()
    event_id = loop.sim.add_event(EventType="Reboot", EventSource="User", Resources=["app-0"])
    approval = loop.wait_approved(event_id)
    consumer = loop.consumer
    assert consumer is not None

    def counted() -> dict[str, float] | None:
        samples = scrape(consumer.output)
        key = ('se_bridge_consumer_decisions_total'
               '{action="Approve",mode="normal",rule="user-initiated"}')  # fmt: skip
        return samples if samples.get(key) == 1 else None

    samples = eventually(
        counted, what="the consumer to count its Approve decision", details=loop.describe
    )
    assert samples["se_bridge_consumer_commands_sent_total"] == 1
    assert samples["se_bridge_consumer_records_total"] >= 3
    assert samples["se_bridge_consumer_ledger_reads_total"] >= 1
    target = loop.agents[approval["vm"]]

    def approved() -> dict[str, float] | None:
        found = scrape(target.stderr)
        key = 'se_bridge_commands_total{outcome="Approved",source="Central"}'
        return found if found.get(key) == 1 else None

    found = eventually(approved, what="the agent to count its approval", details=loop.describe)
    assert found['se_bridge_records_total{transition="Scheduled",type="Event"}'] >= 1
    assert found["se_bridge_approval_latency_seconds_count"] == 1
