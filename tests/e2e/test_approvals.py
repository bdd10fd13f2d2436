"""Central approvals on one machine: simulator → agents → local hub → consumer → command
channel → agents → the simulator receives the approval. Every part is a real process."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from bridge.commands import Command, approve, command_id
from tests.e2e.harness import Agent, Proc, Processes, Record, Simulator, read_records, wait_until

pytestmark = pytest.mark.e2e

FLEET = {"availabilitySets": [{"name": "app", "count": 2}]}
VMS = ("app-0", "app-1")


class Loop:
    """The simulator, an agent per VM and one consumer, sharing a hub and a command dir."""

    def __init__(
        self, procs: Processes, consumer_args: Sequence[str] = (), deaf: Sequence[str] = ()
    ) -> None:
        self.procs = procs
        root = procs.workdir
        self.hub, self.commands = root / "hub", root / "commands"
        fleet = root / "fleet.json"
        fleet.write_text(json.dumps(FLEET), encoding="utf-8")
        self.sim = Simulator.launch(procs, "sim", "--fleet", str(fleet))
        hub = ["--sink", f"hub:{self.hub}"]
        listen = ["--commands", f"local:{self.commands}"]
        # A deaf agent ships its records but never reads its commands: an approver that is
        # alive to the consumer and still never acts.
        self.agents = {
            vm: Agent(procs, vm, self.sim.vm_url(vm), args=hub + ([] if vm in deaf else listen))
            for vm in VMS
        }
        self.decisions = root / "decisions.jsonl"
        self.consumer_argv = [
            "consume", "--hub", str(self.hub), "--commands", f"local:{self.commands}",
            "--state", f"sqlite:{root / 'fleet.db'}", "--state-dir", str(root / "consumer"),
            "--sink", f"jsonl:{self.decisions}", *consumer_args,
        ]  # fmt: skip
        self.consumer: Proc | None = None

    def start(self, agents: Sequence[str] = VMS) -> Loop:
        for vm in agents:
            self.agents[vm].start()
        self.start_consumer()
        self.sim.wait_polls(dict.fromkeys(agents, 2))
        return self

    def start_consumer(self) -> None:
        self.consumer = self.procs.bridge("consumer", *self.consumer_argv)

    def vm_id(self, vm: str) -> str:
        return str(self.sim.fleet()[vm]["vmId"])

    def approvals(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.sim.call("GET", "/control/approvals")["approvals"]
        return found

    def wait_approved(self, event_id: str) -> dict[str, Any]:
        def approved() -> dict[str, Any] | None:
            return next((a for a in self.approvals() if a["eventId"] == event_id), None)

        return wait_until(approved, f"the simulator to receive the approval of {event_id}",
                          details=self.describe)  # fmt: skip

    def approval_records(self, vm: str) -> list[Record]:
        return [r for r in self.agents[vm].records() if r["RecordType"] == "Approval"]

    def describe(self) -> str:
        parts = [a.describe() for a in self.agents.values() if a.runs]
        if self.consumer is not None:
            parts.append("--- consumer:\n" + self.consumer.output())
        parts.append("--- decisions:\n" + "\n".join(map(json.dumps, read_records(self.decisions))))
        return "\n".join(parts)


def test_user_reboot_is_approved_by_the_consumer(procs: Processes) -> None:
    loop = Loop(procs).start()
    event_id = loop.sim.add_event(EventType="Reboot", EventSource="User", Resources=["app-0"])
    approval = loop.wait_approved(event_id)
    assert approval["status"] == 200
    records = wait_until(lambda: loop.approval_records(approval["vm"]), "an Approval record",
                         details=loop.describe)  # fmt: skip
    assert records[0]["ApprovalOutcome"] == "Approved"
    assert records[0]["ApprovalSource"] == "Central"
    assert records[0]["ApprovalLatencyMs"] >= 0
    decisions = [d for d in read_records(loop.decisions) if d["EventId"] == event_id]
    assert [d["DecisionAction"] for d in decisions] == ["Approve"]
    assert decisions[0]["DecisionRule"] == "user-initiated"
    assert len([a for a in loop.approvals() if a["eventId"] == event_id]) == 1


def test_platform_reboot_is_held_and_never_approved(procs: Processes) -> None:
    loop = Loop(procs).start()
    event_id = loop.sim.add_event(EventType="Reboot", EventSource="Platform", Resources=["app-0"])

    def held() -> list[Record]:
        return [d for d in read_records(loop.decisions) if d["EventId"] == event_id]

    decisions = wait_until(held, "the Hold decision", details=loop.describe)
    assert decisions[0]["DecisionAction"] == "Hold"
    assert not [a for a in loop.approvals() if a["eventId"] == event_id]


def _fast_fallback(workdir: Path) -> Path:
    config = workdir / "consumer.toml"
    config.write_text("[consumer]\napproval_timeout = 3\nreevaluate_interval = 0.5\n")
    return config


def test_fallback_when_the_chosen_vm_never_answers(procs: Processes) -> None:
    loop = Loop(procs, ["--config", str(_fast_fallback(procs.workdir))], deaf=["app-0"]).start()
    event_id = loop.sim.add_event(EventType="Reboot", EventSource="User", Resources=VMS)
    approval = loop.wait_approved(event_id)
    assert approval["vm"] == "app-1"
    decisions = [d for d in read_records(loop.decisions) if d["EventId"] == event_id]
    approves = [d for d in decisions if d["DecisionAction"] == "Approve"]
    assert [(d["TargetVmName"], d["Attempt"]) for d in approves] == [("app-0", 1), ("app-1", 2)]
    assert len([a for a in loop.approvals() if a["eventId"] == event_id]) == 1


def _write_command(commands: Path, vm_id: str, text: str, name: str) -> None:
    folder = commands / vm_id.lower()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(text, encoding="utf-8")


def test_forged_expired_and_misdirected_commands_are_refused(procs: Processes) -> None:
    loop = Loop(procs).start(agents=("app-0",))
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
    _write_command(loop.commands, vm0, expired.to_json(), "expired")
    _write_command(loop.commands, vm0, elsewhere.to_json(), "elsewhere")
    _write_command(loop.commands, vm0, unknown.to_json(), "unknown")
    _write_command(loop.commands, vm0, '{"Type": "Approve", "EventId": 1}', "garbage")

    def refusals(records: list[Record]) -> list[Record]:
        return [r for r in records if r["RecordType"] == "Approval"]

    records = loop.agents["app-0"].wait_for(lambda rs: len(refusals(rs)) >= 4, "4 refusals")
    outcomes = {r["ApprovalOutcome"] for r in refusals(records)}
    assert outcomes == {"Refused"}
    details = " | ".join(r["ApprovalDetail"] for r in refusals(records))
    assert "expired" in details
    assert vm1 in details
    assert not [a for a in loop.approvals() if a["eventId"] == event_id]
    assert not list((loop.commands / vm0.lower()).glob("*.json"))


def _command(vm_id: str, event_id: str, *, issued: float, expires: float) -> Command:
    def at(t: float) -> datetime:
        return datetime.fromtimestamp(t, timezone.utc)

    made = approve(vm_id=vm_id, event_id=event_id, document_incarnation=None,
                   issued_at=at(issued), expires_at=at(expires), rule="forged",
                   reason="written by the test")  # fmt: skip
    assert made.command_id == command_id(event_id, vm_id)
    return made
