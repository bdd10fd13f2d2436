"""The command listener inside a real agent against the IMDS simulator, with a fake inbox."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from bridge.agent import listener
from bridge.agent.command import load_config
from bridge.channels.local import LocalSender
from bridge.config import CommandsSettings, ConfigError, load
from bridge.records import utc_now
from bridge.retry import PermanentError, RetryableError
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import EventSpec
from tests.support.agentharness import VM
from tests.support.approvals import FailingStart, FakeInbox, Harness, command
from tests.support.processes import run_bridge
from tests.support.wait import eventually

Sim = tuple[Simulator, SimulatorServer]


def vm_id(simulator: Simulator, name: str = VM) -> str:
    return simulator.fleet.vm(name).vm_id


def posts(simulator: Simulator, event_id: str) -> list[int]:
    return [a.status for a in simulator.approvals() if a.event_id == event_id]


def user_reboot(simulator: Simulator, approval_delay: float | None = None) -> str:
    spec = EventSpec("Reboot", (VM,), event_source="User", approval_delay=approval_delay)
    return simulator.add_event(spec)


def test_a_command_is_approved_recorded_and_deleted(sim: Sim, harness: Harness) -> None:
    simulator, _ = sim
    event = user_reboot(simulator)
    harness.start()
    harness.poll()
    sent = command(vm_id(simulator), event)
    harness.inbox.put(sent.to_json())
    eventually(lambda: harness.inbox.deleted != [])
    assert posts(simulator, event) == [200]
    [record] = harness.records()
    assert record["ApprovalOutcome"] == "Approved"
    assert record["ApprovalSource"] == "Central"
    assert record["CommandId"] == sent.command_id
    assert record["EventId"] == event
    assert record["EventType"] == "Reboot"
    assert record["DecisionRule"] == "user-initiated"
    assert record["CommandIssuedAt"] is not None
    assert record["ApprovalLatencyMs"] >= 400
    assert record["VmId"] == vm_id(simulator)


def refusal_cases(simulator: Simulator, me: str) -> dict[str, tuple[str, str]]:
    """Per reason: the message text and a phrase its ApprovalDetail must hold."""
    event = user_reboot(simulator)
    started = user_reboot(simulator)
    simulator.start_event(started)
    other_vm = vm_id(simulator, "vm-1")
    return {
        "malformed": ('{"SchemaVersion": 1, "Type": "Approve"', "not a valid command"),
        "other VM": (command(other_vm, event).to_json(), f"it is for VM {other_vm}"),
        "expired": (command(me, event, expires=timedelta(seconds=-1)).to_json(), "expired at"),
        "not in document": (
            command(me, "00000000-0000-0000-0000-000000000001").to_json(),
            "is not in this VM's current Scheduled Events document",
        ),
        "started": (command(me, started).to_json(), "has already Started"),
    }


@pytest.mark.parametrize(
    "reason", ["malformed", "other VM", "expired", "not in document", "started"]
)
def test_each_refusal_is_recorded_and_deleted(sim: Sim, harness: Harness, reason: str) -> None:
    simulator, _ = sim
    cases = refusal_cases(simulator, vm_id(simulator))
    harness.start()
    harness.poll()  # a Scheduled event: the listener reads
    text, phrase = cases[reason]
    harness.inbox.put(text)
    eventually(lambda: harness.inbox.deleted == [text])
    [record] = harness.records()
    assert record["ApprovalOutcome"] == "Refused"
    assert phrase in record["ApprovalDetail"]
    assert record["ApprovalLatencyMs"] is None
    assert [a for a in simulator.approvals() if a.status == 200] == []


def test_the_event_is_checked_against_a_fresh_document(sim: Sim, harness: Harness) -> None:
    simulator, _ = sim
    event = user_reboot(simulator)
    harness.start()
    harness.poll()  # the agent's own state: Scheduled
    simulator.start_event(event)  # ... but IMDS has moved on, unseen by the agent
    harness.inbox.put(command(vm_id(simulator), event).to_json())
    eventually(lambda: harness.inbox.deleted != [])
    [record] = harness.records()
    assert (record["ApprovalOutcome"], record["EventType"]) == ("Refused", "Reboot")
    assert "has already Started" in record["ApprovalDetail"]
    assert posts(simulator, event) == []


@pytest.mark.parametrize(
    ("resources", "outcome", "detail"),
    [
        ([VM, "vm-1"], "Refused", "ResourcesChanged: "),  # decided on other VMs than are named
        ([VM.upper()], "Approved", "IMDS accepted StartRequests"),  # the same VM, other case
    ],
)
def test_a_command_binds_the_resources_it_was_decided_on(
    sim: Sim, harness: Harness, resources: list[str], outcome: str, detail: str
) -> None:
    """The command carries the digest of the Resources the consumer decided on (signed)."""
    simulator, _ = sim
    event = user_reboot(simulator)
    harness.start()
    harness.poll()
    harness.inbox.put(command(vm_id(simulator), event, resources=resources).to_json())
    eventually(lambda: harness.inbox.deleted != [])
    [record] = harness.records()
    assert record["ApprovalOutcome"] == outcome
    assert record["ApprovalDetail"].startswith(detail)
    assert posts(simulator, event) == ([200] if outcome == "Approved" else [])


def test_a_retryable_imds_failure_leaves_the_command(
    sim: Sim, harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    simulator, server = sim
    event = user_reboot(simulator)
    client = FailingStart(server.vm_url(VM), RetryableError("IMDS answered 503"))
    harness.start(client=client)
    harness.poll()
    harness.inbox.put(command(vm_id(simulator), event).to_json())
    eventually(lambda: client.posts >= 2)  # read again: the message stayed
    assert harness.inbox.deleted == []
    assert harness.inbox.pending() == 1
    assert harness.records() == []
    assert any(
        r.levelno == logging.WARNING and "left in the channel" in r.getMessage()
        for r in caplog.records
    )


def test_an_imds_400_is_a_failed_approval(
    sim: Sim, harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    simulator, server = sim
    event = user_reboot(simulator)
    client = FailingStart(server.vm_url(VM), PermanentError("IMDS answered 400 to POST"))
    harness.start(client=client)
    harness.poll()
    harness.inbox.put(command(vm_id(simulator), event).to_json())
    eventually(lambda: harness.inbox.deleted != [])
    [record] = harness.records()
    assert record["ApprovalOutcome"] == "Failed"
    assert "IMDS answered 400" in record["ApprovalDetail"]
    assert client.posts == 1
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [event in r.getMessage() for r in errors] == [True]


def test_duplicate_commands_post_once(sim: Sim, harness: Harness) -> None:
    simulator, _ = sim
    # Approved but not started for a while, so the agent keeps reading commands.
    event = user_reboot(simulator, approval_delay=300.0)
    harness.start()
    harness.poll()
    sent = command(vm_id(simulator), event).to_json()
    harness.inbox.put(sent)
    harness.inbox.put(sent)
    eventually(lambda: len(harness.inbox.deleted) == 2)
    harness.inbox.put(sent)  # a late resend: a fresh message (dequeue count 1), so a replay
    eventually(lambda: len(harness.inbox.deleted) == 3)
    assert posts(simulator, event) == [200]
    outcomes = [(r["ApprovalOutcome"], r["ApprovalDetail"].split(":")[0])
                for r in harness.records()]  # fmt: skip
    assert outcomes[0][0] == "Approved"
    assert outcomes[1:] == [("Refused", "Replayed")] * 2


def test_no_reads_while_nothing_is_scheduled(sim: Sim, harness: Harness) -> None:
    simulator, _ = sim
    started = simulator.add_event(EventSpec("Freeze", (VM,), status="Started"))
    harness.start()
    harness.poll(3)
    time.sleep(0.5)  # several poll intervals: reading now would be a billed transaction
    assert harness.inbox.receives == 0
    event = user_reboot(simulator)
    harness.poll()
    eventually(lambda: harness.inbox.receives >= 3)  # repeated reads while it is Scheduled
    simulator.cancel_event(event)
    simulator.complete_event(started)
    harness.poll()
    time.sleep(0.3)  # a read already under way may still finish
    reads = harness.inbox.receives
    time.sleep(0.6)
    assert harness.inbox.receives == reads


def test_idle_interval_reads_with_nothing_scheduled(harness: Harness) -> None:
    harness.start(idle_interval=0.2)
    harness.poll()
    eventually(lambda: harness.inbox.receives >= 2)


def test_read_failures_warn_once_and_back_off(
    sim: Sim, harness: Harness, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listener, "FIRST_BACKOFF", 0.05)
    simulator, _ = sim
    event = user_reboot(simulator)
    harness.inbox = FakeInbox(failures=3)
    harness.start()
    harness.poll()
    harness.inbox.put(command(vm_id(simulator), event).to_json())
    eventually(lambda: harness.inbox.deleted != [])  # it recovered and acted
    warnings = [r for r in caplog.records if "cannot read the command channel" in r.getMessage()]
    assert len(warnings) == 1
    assert posts(simulator, event) == [200]


def test_the_real_local_channel(sim: Sim, harness: Harness, tmp_path: Path) -> None:
    simulator, _ = sim
    event = user_reboot(simulator)
    channel = tmp_path / "commands"
    harness.start(channel=f"local:{channel}", fake_inbox=False)
    harness.poll()
    LocalSender(channel).send(command(vm_id(simulator), event), time_to_live=600)
    folder = channel / vm_id(simulator).lower()
    eventually(lambda: posts(simulator, event) == [200] and not any(folder.iterdir()))
    assert [r["ApprovalOutcome"] for r in harness.records()] == ["Approved"]


def test_scheduled_here() -> None:
    assert listener.scheduled_here(None) == (False, False)
    assert listener.scheduled_here({"events": {"a": {"EventStatus": "Started"}}}) == (False, False)
    mine = {"EventStatus": "Scheduled", "AffectsThisVm": True}
    unknown = {"EventStatus": "Scheduled", "AffectsThisVm": None}  # no instance metadata
    others = {"EventStatus": "Scheduled", "AffectsThisVm": False}
    assert listener.scheduled_here({"events": {"a": mine}}) == (True, True)
    assert listener.scheduled_here({"events": {"a": unknown}}) == (True, True)
    assert listener.scheduled_here({"events": {"a": others}}) == (True, False)
    assert listener.scheduled_here({"events": {"a": others, "b": mine}}) == (True, True)


def test_events_of_other_vms_alone_are_read_for_at_the_slower_interval() -> None:
    """Azure shows an event to every VM of its availability set or placement group (up to 200):
    each of them reading its queue every second while one VM's event waits would put the
    whole scope's reads on the storage account. A command comes to a VM an event does not
    affect only when no affected VM can carry it (issue 15)."""
    settings = CommandsSettings(channel="local:unused", poll_interval=1.0, others_interval=10.0)
    reader = listener.CommandListener(settings, lambda _vm: FakeInbox(), cast(Any, None), utc_now)
    assert reader.interval() is None
    reader.update("vm-id", scheduled=True, affects=False)
    assert reader.interval() == 10.0
    reader.update("vm-id", scheduled=True, affects=True)
    assert reader.interval() == 1.0
    reader.update("vm-id", scheduled=False, affects=False)
    assert reader.interval() is None


def test_an_event_of_this_vm_is_read_for_often_just_after_it_appears() -> None:
    """The consumer's command lands 0.2 to 0.6 s after the agent's record of the event: a
    second read a whole poll_interval after the first waited about 0.8 s for nothing
    (issue 27, benchmark 3)."""
    clock = [utc_now()]
    settings = CommandsSettings(channel="local:unused", poll_interval=1.0, others_interval=10.0)
    reader = listener.CommandListener(settings, lambda _vm: FakeInbox(), cast(Any, None),
                                      lambda: clock[0])  # fmt: skip
    reader.update("vm-id", scheduled=True, affects=True, own=frozenset({"e1"}))
    assert reader.interval() == listener.FIRST_READS_EVERY
    clock[0] += listener.FIRST_READS_FOR
    assert reader.interval() == 1.0
    reader._wake.clear()
    reader.update("vm-id", scheduled=True, affects=True, own=frozenset({"e1"}))
    assert not reader._wake.is_set()
    assert reader.interval() == 1.0
    reader.update("vm-id", scheduled=True, affects=True, own=frozenset({"e1", "e2"}))
    assert reader._wake.is_set()
    assert reader.interval() == listener.FIRST_READS_EVERY
    # Never faster than poll_interval asks, and never for a neighbour's event.
    slow = CommandsSettings(channel="local:unused", poll_interval=0.2)
    fast = listener.CommandListener(slow, lambda _vm: FakeInbox(), cast(Any, None), utc_now)
    fast.update("vm-id", scheduled=True, affects=True, own=frozenset({"e1"}))
    assert fast.interval() == 0.2
    neighbour = listener.CommandListener(settings, lambda _vm: FakeInbox(), cast(Any, None),
                                         utc_now)  # fmt: skip
    neighbour.update("vm-id", scheduled=True, affects=False, own=frozenset())
    assert neighbour.interval() == 10.0


def test_own_events() -> None:
    mine = {"EventStatus": "Scheduled", "AffectsThisVm": True}
    unknown = {"EventStatus": "Scheduled", "AffectsThisVm": None}
    others = {"EventStatus": "Scheduled", "AffectsThisVm": False}
    started = {"EventStatus": "Started", "AffectsThisVm": True}
    state = {"events": {"a": mine, "b": unknown, "c": others, "d": started}}
    assert listener.own_events(state) == {"a", "b"}
    assert listener.own_events(None) == frozenset()


def test_an_event_that_comes_to_affect_this_vm_wakes_the_reader() -> None:
    settings = CommandsSettings(channel="local:unused", poll_interval=1.0, others_interval=10.0)
    reader = listener.CommandListener(settings, lambda _vm: FakeInbox(), cast(Any, None), utc_now)
    reader.update("vm-id", scheduled=True, affects=False)
    reader._wake.clear()
    reader.update("vm-id", scheduled=True, affects=True)
    assert reader._wake.is_set()


def test_a_bad_channel_spec_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match=r"commands\.channel: unknown command channel"):
        load_config(environ={}, flags={"commands.channel": "kafka:x"})
    with pytest.raises(ConfigError, match=r"commands\.verify_key"):
        load_config(environ={}, flags={"commands.channel": "local:/tmp/c"})
    unsigned = {"commands.channel": "local:/tmp/c", "commands.allow_unsigned": "true"}
    assert load(environ={}, flags=unsigned).commands.allow_unsigned


def test_the_agent_refuses_a_bad_commands_flag(tmp_path: Path) -> None:
    done = run_bridge("agent", "--state-dir", str(tmp_path / "state"), "--commands", "local:")
    assert done.returncode == 2
    assert "commands.channel" in done.stderr
    assert "Traceback" not in done.stderr
