"""An agent stopped while an event is Scheduled, and started again after the event ended."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from email.utils import formatdate

import pytest

from tests.support.processes import Agent, Processes, Record, Simulator, assert_all_valid
from tests.support.wait import eventually

pytestmark = pytest.mark.e2e

VM = "vm-0"


def scheduled_then_stopped(
    procs: Processes, not_before: str | None = None
) -> tuple[Simulator, Agent, str, int]:
    """A running agent records a Scheduled event, then stops cleanly."""
    sim = Simulator.launch(procs, "sim", "--vms", "1")
    base = sim.incarnation(VM)
    agent = Agent(procs, VM, sim.vm_url(VM)).start()
    sim.wait_polls({VM: 2})
    spec: dict[str, object] = {"EventType": "Reboot", "Resources": [VM], "notice": 3600.0}
    if not_before is not None:
        spec["NotBefore"] = not_before
    event_id = sim.add_event(**spec)
    agent.wait_transition(event_id, "Scheduled")
    assert agent.stop() == 0
    return sim, agent, event_id, base


def check_two_runs(records: list[Record], event_id: str) -> tuple[Record, Record, Record]:
    """Start, Scheduled, Stop, then Start, the end of the event, Stop; returns the middle three."""
    assert_all_valid(records)
    shape = [(r["RecordType"], r.get("HeartbeatReason") or r.get("Transition")) for r in records]
    assert shape[:3] == [("Heartbeat", "Start"), ("Event", "Scheduled"), ("Heartbeat", "Stop")]
    assert shape[3] == ("Heartbeat", "Start")
    assert shape[5] == ("Heartbeat", "Stop")
    assert len(shape) == 6
    assert {r["EventId"] for r in records if r["RecordType"] == "Event"} == {event_id}
    ids = [r["RecordId"] for r in records]
    assert len(ids) == len(set(ids))
    return records[1], records[3], records[4]


def test_event_canceled_while_the_agent_was_down(procs: Processes) -> None:
    sim, agent, event_id, base = scheduled_then_stopped(procs)
    sim.act(event_id, "cancel")
    agent.start()
    agent.wait_transition(event_id, "Canceled")
    assert agent.stop() == 0

    records = agent.records()
    scheduled, restart, canceled = check_two_runs(records, event_id)
    # The saved state carries over: the new run starts from what the old one saw.
    assert (restart["DocumentIncarnation"], restart["PendingEvents"]) == (base + 1, 1)
    assert canceled["Transition"] == "Canceled"
    assert (canceled["PreviousStatus"], canceled["EventStatus"]) == ("Scheduled", None)
    assert (canceled["PreviousIncarnation"], canceled["DocumentIncarnation"]) == (
        base + 1,
        base + 2,
    )
    # Down for seconds, no incarnation skipped, NotBefore an hour away: nothing to infer.
    assert canceled["Inferred"] is False
    assert canceled["NotBefore"] == scheduled["NotBefore"]


def test_event_ran_while_the_agent_was_down(procs: Processes) -> None:
    # NotBefore shown a few seconds ahead, while the simulator starts the event only when
    # told: it has certainly passed by the time the agent is back, however slow the machine.
    due = time.time() + 2
    sim, agent, event_id, base = scheduled_then_stopped(procs, formatdate(due, usegmt=True))
    sim.act(event_id, "start")
    sim.act(event_id, "complete")
    assert sim.incarnation(VM) == base + 3
    eventually(lambda: time.time() > due + 1, what="NotBefore to pass")
    agent.start()
    agent.wait_transition(event_id, "Completed")
    assert agent.stop() == 0

    records = agent.records()
    scheduled, restart, completed = check_two_runs(records, event_id)
    assert scheduled["NotBefore"] == datetime.fromtimestamp(int(due), timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S.000Z"
    )
    assert (restart["DocumentIncarnation"], restart["PendingEvents"]) == (base + 1, 1)
    # It vanished while Scheduled, but incarnations were skipped and NotBefore had passed.
    assert completed["Transition"] == "Completed"
    assert (completed["PreviousStatus"], completed["EventStatus"]) == ("Scheduled", None)
    assert (completed["PreviousIncarnation"], completed["DocumentIncarnation"]) == (
        base + 1,
        base + 3,
    )
    assert completed["Inferred"] is True
