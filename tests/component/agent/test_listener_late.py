"""A command that reaches the agent after its event started or ended (issue 27): refused as
`Late`, counted, and read at all even when nothing is Scheduled any more."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from bridge.agent import listener
from bridge.config import CommandsSettings, ImdsSettings
from bridge.records import utc_now
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import EventSpec
from tests.support.agentharness import VM
from tests.support.approvals import FakeInbox, Harness, command
from tests.support.wait import eventually

Sim = tuple[Simulator, SimulatorServer]
NEIGHBOUR, AFFECTED = "db-1", "db-0"  # one availability set: db-1 sees db-0's events


def late_count(harness: Harness, reason: str) -> float:
    assert harness.agent is not None
    value = harness.agent.metrics.registry.get_sample_value(
        "se_bridge_commands_late_total", {"reason": reason}
    )
    return value or 0.0


def reboot(simulator: Simulator, vm: str = VM) -> str:
    return simulator.add_event(EventSpec("Reboot", (vm,), event_source="User"))


def test_a_command_read_after_its_event_started_is_refused_as_late(
    sim: Sim, harness: Harness
) -> None:
    simulator, _ = sim
    event = reboot(simulator)
    harness.start()
    harness.poll()
    simulator.start_event(event)
    sent = command(simulator.fleet.vm(VM).vm_id, event)
    harness.inbox.put(sent.to_json())
    eventually(lambda: harness.inbox.deleted != [])
    [record] = harness.records()
    assert (record["ApprovalOutcome"], record["CommandId"]) == ("Refused", sent.command_id)
    assert record["ApprovalDetail"].startswith(f"Late: event {event} has already Started")
    assert "after the consumer issued it" in record["ApprovalDetail"]
    assert late_count(harness, "Started") == 1
    assert simulator.approvals() == []


def test_a_command_for_an_event_that_ended_here_is_late(sim: Sim, harness: Harness) -> None:
    simulator, _ = sim
    event = reboot(simulator)
    harness.start()
    harness.poll()  # the agent saw it Scheduled ...
    simulator.cancel_event(event)  # ... and IMDS dropped it before the command came
    harness.inbox.put(command(simulator.fleet.vm(VM).vm_id, event).to_json())
    eventually(lambda: harness.inbox.deleted != [])
    [record] = harness.records()
    assert record["ApprovalOutcome"] == "Refused"
    assert record["ApprovalDetail"].startswith(f"Late: event {event} has ended")
    assert late_count(harness, "Ended") == 1


def test_an_expired_command_for_an_event_seen_started_is_late(sim: Sim, harness: Harness) -> None:
    """A command expires at its event's NotBefore, when the platform starts the event: read
    after that, the event had gone ahead, which the agent's last look shows (no IMDS call)."""
    simulator, _ = sim
    event = reboot(simulator)
    harness.start()
    harness.poll()
    simulator.start_event(event)
    harness.poll()
    expired = command(simulator.fleet.vm(VM).vm_id, event, expires=timedelta(seconds=-1))
    harness.inbox.put(expired.to_json())
    eventually(lambda: harness.inbox.deleted != [])
    [record] = harness.records()
    assert record["ApprovalDetail"].startswith(f"Late: event {event} has already Started")
    assert record["CommandId"] == expired.command_id
    assert late_count(harness, "Started") == 1


def test_a_command_read_past_its_expiry_is_counted_late_and_says_how_late(
    sim: Sim, harness: Harness
) -> None:
    """The event is still Scheduled as far as the agent last looked, so the consumer may ask
    another VM (Expired, not Late); the command came too late all the same."""
    simulator, _ = sim
    event = reboot(simulator)
    harness.start()
    harness.poll()
    expired = command(simulator.fleet.vm(VM).vm_id, event, expires=timedelta(seconds=-1))
    harness.inbox.put(expired.to_json())
    eventually(lambda: harness.inbox.deleted != [])
    [record] = harness.records()
    assert record["ApprovalDetail"].startswith("Expired: it expired at ")
    assert "after the consumer issued it" in record["ApprovalDetail"]
    assert late_count(harness, "Expired") == 1


def test_an_event_this_vm_never_saw_is_not_late(sim: Sim, harness: Harness) -> None:
    """The consumer asks the next VM after such a refusal: the event may live elsewhere."""
    simulator, _ = sim
    reboot(simulator)
    harness.start()
    harness.poll()
    unknown = "00000000-0000-0000-0000-000000000001"
    harness.inbox.put(command(simulator.fleet.vm(VM).vm_id, unknown).to_json())
    eventually(lambda: harness.inbox.deleted != [])
    [record] = harness.records()
    assert record["ApprovalOutcome"] == "Refused"
    assert not record["ApprovalDetail"].startswith("Late")
    assert "is not in this VM's current Scheduled Events document" in record["ApprovalDetail"]
    assert late_count(harness, "Ended") == late_count(harness, "Started") == 0
    assert late_count(harness, "Expired") == 0


class NeighbourHarness(Harness):
    """The agent of a VM that sees its neighbour's events (read every others_interval)."""

    def imds_settings(self, **imds: Any) -> ImdsSettings:
        url = self.server.vm_url(NEIGHBOUR)
        return ImdsSettings(url=url, first_call_timeout=5, timeout=2, **imds)


def test_a_command_queued_before_the_last_event_started_is_still_read(
    sim: Sim, tmp_path: Path
) -> None:
    """A neighbour reads every commands.others_interval (10 s), and not at all once nothing is
    Scheduled: a command queued in between was never read, and no record said it came late
    (the demo: 2 of 6 approvals)."""
    simulator, _ = sim
    event = reboot(simulator, AFFECTED)
    harness = NeighbourHarness(sim[1], tmp_path)
    try:
        harness.start()
        harness.poll()
        eventually(lambda: harness.inbox.receives == 1)  # the next read is 10 s away
        harness.inbox.put(command(simulator.fleet.vm(NEIGHBOUR).vm_id, event).to_json())
        simulator.start_event(event)
        harness.poll()  # nothing Scheduled any more: one last read
        eventually(lambda: harness.inbox.deleted != [], timeout=5)
        [record] = harness.records()
        assert record["ApprovalDetail"].startswith(f"Late: event {event} has already Started")
        assert late_count(harness, "Started") == 1
        reads = harness.inbox.receives
        harness.poll(3)
        assert harness.inbox.receives == reads  # only the one: each read is billed
    finally:
        harness.stop()


def test_the_last_read_is_owed_until_it_succeeds() -> None:
    settings = CommandsSettings(channel="local:unused", poll_interval=1.0)
    inbox = FakeInbox(failures=1)
    reader = listener.CommandListener(settings, lambda _vm: inbox, cast(Any, None), utc_now)
    reader.update("vm-id", scheduled=True, affects=True)
    reader.update("vm-id", scheduled=False, affects=False)
    assert reader.read_once() is not None  # failed: a backoff, then the read again
    assert reader.read_once() is None  # read, and nothing more until an event comes
    assert reader.read_once() is None
    assert inbox.receives == 2
