"""The agent with commands.verify_key: every refusal path, recorded, and none touches IMDS."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bridge.agent.loop import Agent
from bridge.agent.wiring import build_agent
from bridge.channels import Received, SigningSender
from bridge.channels.local import LocalSender
from bridge.commands import message as commands
from bridge.commands import signing
from bridge.config import CommandsSettings, Config
from bridge.records import utc_now
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import EventSpec
from tests.support.agentharness import VM
from tests.support.approvals import FakeInbox, Harness, command
from tests.support.wait import eventually

Sim = tuple[Simulator, SimulatorServer]
KEY = signing.Signer(Ed25519PrivateKey.generate())
OTHER_KEY = signing.Signer(Ed25519PrivateKey.generate())


class SignedHarness(Harness):
    """The agent of approval_support, trusting KEY only."""

    def start_signed(self, *, channel: str = "local:unused", fake_inbox: bool = True) -> Agent:
        config = Config(
            agent=self.agent_settings(),
            imds=self.imds_settings(),
            commands=CommandsSettings(
                channel=channel,
                poll_interval=0.2,
                verify_key=signing.verify_key_text(KEY.public_key()),
            ),
        )
        self.agent = build_agent(
            config,
            boot_id="b1",
            open_inbox=(lambda _vm_id: self.inbox) if fake_inbox else None,
            now=utc_now,
        )
        self.agent.start()
        return self.agent


class CountingInbox(FakeInbox):
    """Hands messages over with `dequeue_count`: above 1, as after a visibility timeout."""

    dequeue_count = 1

    def receive(self, max_messages: int) -> list[Received]:
        count = self.dequeue_count
        return [Received(m.text, m.handle, count) for m in super().receive(max_messages)]


@pytest.fixture
def harness(sim: Sim, tmp_path: Path) -> Iterator[SignedHarness]:
    h = SignedHarness(sim[1], tmp_path)
    yield h
    h.stop()


def setup(sim: Sim, harness: SignedHarness) -> tuple[Simulator, str, str]:
    simulator, _ = sim
    spec = EventSpec("Reboot", (VM,), event_source="User", approval_delay=300.0)
    event = simulator.add_event(spec)
    harness.start_signed()
    harness.poll()
    return simulator, event, simulator.fleet.vm(VM).vm_id


def posts(simulator: Simulator, event_id: str) -> list[int]:
    return [a.status for a in simulator.approvals() if a.event_id == event_id]


def refusal(harness: Harness, text: str) -> dict[str, Any]:
    """Send `text`, wait until it is deleted: the one Approval record it made."""
    before = len(harness.inbox.deleted)
    harness.inbox.put(text)
    eventually(lambda: len(harness.inbox.deleted) > before)
    (record,) = harness.records()
    assert record["ApprovalOutcome"] == "Refused"
    return record


def code(record: dict[str, Any]) -> str:
    return str(record["ApprovalDetail"].split(":")[0])


def test_a_signed_command_is_approved(sim: Sim, harness: SignedHarness) -> None:
    simulator, event, vm = setup(sim, harness)
    harness.inbox.put(KEY.sign(command(vm, event)).to_json())
    eventually(lambda: harness.inbox.deleted != [])
    assert posts(simulator, event) == [200]
    (record,) = harness.records()
    assert record["ApprovalOutcome"] == "Approved"
    assert record["CommandId"] == commands.command_id(event, vm)


def tampered(text: str, **changes: Any) -> str:
    body = json.loads(text)
    body.update(changes)
    return json.dumps(body)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("unsigned", "Unsigned"),
        ("other key", "UnknownKey"),
        ("forged with our key id", "BadSignature"),
        ("tampered reason", "BadSignature"),
        ("added field", "BadSignature"),
        ("signature not base64", "BadSignature"),
        ("malformed", "Malformed"),
        ("other vm", "OtherVm"),
    ],
)
def test_each_refusal_is_recorded_and_nothing_reaches_imds(
    sim: Sim, harness: SignedHarness, name: str, expected: str
) -> None:
    simulator, event, vm = setup(sim, harness)
    good = KEY.sign(command(vm, event)).to_json()
    texts = {
        "unsigned": command(vm, event).to_json(),
        "other key": OTHER_KEY.sign(command(vm, event)).to_json(),
        "forged with our key id": tampered(
            OTHER_KEY.sign(command(vm, event)).to_json(), KeyId=KEY.key_id
        ),
        "tampered reason": tampered(good, Reason="approve everything"),
        "added field": tampered(good, Extra=1),
        "signature not base64": tampered(good, Signature="!!"),
        "malformed": '{"Type": "Approve"',
        "other vm": KEY.sign(command("another-vm", event)).to_json(),
    }
    record = refusal(harness, texts[name])
    assert code(record) == expected
    # An unverified sender's ids are not the record's: the consumer's ledger ignores it.
    assert record["CommandId"] is None
    assert record["EventId"] is None
    assert posts(simulator, event) == []


def test_an_expired_signed_command_is_refused_with_its_ids(
    sim: Sim, harness: SignedHarness
) -> None:
    simulator, event, vm = setup(sim, harness)
    late = KEY.sign(command(vm, event, issued=timedelta(minutes=-20), expires=timedelta(-1)))
    record = refusal(harness, late.to_json())
    assert code(record) == "Expired"
    assert record["CommandId"] == late.command_id
    assert posts(simulator, event) == []


def test_a_replay_is_refused_and_recorded_a_redelivery_is_not(
    sim: Sim, harness: SignedHarness
) -> None:
    inbox = harness.inbox = CountingInbox()
    simulator, event, vm = setup(sim, harness)
    text = KEY.sign(command(vm, event)).to_json()
    inbox.put(text)
    eventually(lambda: len(inbox.deleted) == 1)
    inbox.dequeue_count = 2  # the same message again after a crash before its delete
    inbox.put(text)
    eventually(lambda: len(inbox.deleted) == 2)
    assert [r["ApprovalOutcome"] for r in harness.records()] == ["Approved"]
    inbox.dequeue_count = 1
    inbox.put(text)  # a fresh message with that CommandId: a replay
    eventually(lambda: len(inbox.deleted) == 3)
    replayed = harness.records()[-1]
    assert code(replayed) == "Replayed"
    assert replayed["ApprovalOutcome"] == "Refused"
    assert posts(simulator, event) == [200]


def test_a_refused_command_stays_refused_across_a_restart(sim: Sim, harness: SignedHarness) -> None:
    simulator, _, vm = setup(sim, harness)
    gone = "00000000-0000-0000-0000-000000000001"  # not in the document: refused by IMDS state
    text = KEY.sign(command(vm, gone)).to_json()
    harness.inbox.put(text)
    eventually(lambda: len(harness.inbox.deleted) == 1)
    harness.stop()
    harness.inbox = FakeInbox()
    harness.start_signed()
    harness.poll()
    harness.inbox.put(text)
    eventually(lambda: len(harness.inbox.deleted) == 1)
    first, again = harness.records()
    assert "is not in this VM's current Scheduled Events document" in first["ApprovalDetail"]
    assert code(again) == "Replayed"
    assert simulator.approvals() == []


def test_a_command_signed_with_another_key_on_the_real_local_channel(
    sim: Sim, harness: SignedHarness, tmp_path: Path
) -> None:
    simulator, _ = sim
    spec = EventSpec("Reboot", (VM,), event_source="User", approval_delay=300.0)
    event = simulator.add_event(spec)
    channel = tmp_path / "commands"
    harness.start_signed(channel=f"local:{channel}", fake_inbox=False)
    harness.poll()
    vm = simulator.fleet.vm(VM).vm_id
    sender = SigningSender(LocalSender(channel), OTHER_KEY)
    sender.send(command(vm, event), time_to_live=600)
    folder = channel / vm.lower()
    eventually(lambda: bool(harness.records()) and not any(folder.iterdir()))
    (record,) = harness.records()
    assert code(record) == "UnknownKey"
    assert record["ApprovalOutcome"] == "Refused"
    assert OTHER_KEY.key_id in record["ApprovalDetail"]
    assert posts(simulator, event) == []
