"""An agent against a misbehaving IMDS: throttling, outages, garbage bodies, slow answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import pytest

from bridge.simulator.faults import FaultPlan, Faults
from tests.support.processes import Agent, Processes, Record, Simulator, assert_all_valid
from tests.support.wait import eventually

pytestmark = pytest.mark.e2e

VM = "vm-0"
FAULTS = Faults(
    latency=0.05,
    rate_503=0.3,
    rate_429=0.1,
    retry_after=1.0,
    first_call_delay=3.0,
    rate_not_json=0.15,
    rate_not_document=0.15,
)
# The same faults as command-line flags (--rate-503 0.3, --first-call-delay 3, ...).
FAULT_FLAGS = tuple(
    part
    for name, value in asdict(FAULTS).items()
    for part in (f"--{name.replace('_', '-')}", str(value))
)


def clean_first_call_seed() -> int:
    """A seed whose first IMDS answer is clean.

    Only the agent draws from the simulator's seeded fault dice, and its first request is
    for instance metadata. A fault there would leave the VM's name unknown for a minute
    (the agent's retry interval), and every record's VM fields null: legitimate, but not
    what this test is about.
    """
    for seed in range(100):
        first = FaultPlan(FAULTS, seed=seed).decide(VM, first_call=False)
        if first.status is None and first.corrupt_body is None:
            return seed
    raise AssertionError("no seed in 0..99 gives a clean first answer")


def heartbeat_seen(incarnation: int) -> Callable[[list[Record]], bool]:
    def seen(records: list[Record]) -> bool:
        return any(
            r["RecordType"] == "Heartbeat" and r["DocumentIncarnation"] == incarnation
            for r in records
        )

    return seen


def test_agent_rides_out_imds_faults(procs: Processes) -> None:
    seed = clean_first_call_seed()
    sim = Simulator.launch(procs, "sim", "--vms", "1", "--seed", str(seed), *FAULT_FLAGS)
    base = sim.incarnation(VM)
    # Heartbeats every second show when the agent has read a document despite the faults.
    agent = Agent(
        procs, VM, sim.vm_url(VM), env={"SE_BRIDGE_AGENT_HEARTBEAT_INTERVAL": "1"}
    ).start()
    agent.wait_for(heartbeat_seen(base), "a heartbeat after the first document")

    # Scripted: each step waits until the agent has recorded the previous one.
    event_id = sim.add_event(EventType="Reboot", Resources=[VM], notice=3600.0)
    agent.wait_transition(event_id, "Scheduled")
    sim.act(event_id, "start")
    agent.wait_transition(event_id, "Started")

    def every_fault_hit() -> bool:
        counters, log = sim.counters()[VM], agent.stderr()
        return (
            counters.get("status 503", 0) > 0
            and counters.get("status 429", 0) > 0
            and "not JSON" in log
            and "not a Scheduled Events document" in log
        )

    eventually(every_fault_hit, what="every kind of fault", details=agent.describe)
    sim.act(event_id, "complete")
    agent.wait_transition(event_id, "Completed")
    assert agent.proc.alive
    assert agent.stop() == 0

    records = agent.records()
    assert_all_valid(records)
    events = [r for r in records if r["RecordType"] == "Event"]
    by_id: dict[str, Record] = {}
    for record in events:
        # At-least-once: a repeat is allowed, but only as the very same record.
        by_id.setdefault(record["RecordId"], record)
        assert record == by_id[record["RecordId"]]
    unique = list(by_id.values())
    assert [(r["EventId"], r["Transition"]) for r in unique] == [
        (event_id, "Scheduled"),
        (event_id, "Started"),
        (event_id, "Completed"),
    ], agent.describe()
    incarnations = [(r["PreviousIncarnation"], r["DocumentIncarnation"]) for r in unique]
    assert incarnations == [(base, base + 1), (base + 1, base + 2), (base + 2, base + 3)]
    assert all(r["Inferred"] is False and r["AffectsThisVm"] is True for r in unique)
    assert {r["VmName"] for r in records} == {VM}
    reasons = [r["HeartbeatReason"] for r in records if r["RecordType"] == "Heartbeat"]
    assert (reasons[0], reasons[-1]) == ("Start", "Stop")

    log = agent.stderr()
    assert " WARNING " in log
    assert " ERROR " not in log, log
    assert "Traceback" not in log, log


def test_wrong_api_version_is_an_error_with_imds_own_words(procs: Processes) -> None:
    sim = Simulator.launch(procs, "sim", "--vms", "1")
    agent = Agent(
        procs, VM, sim.vm_url(VM), env={"SE_BRIDGE_IMDS_API_VERSION": "1999-01-01"}
    ).start()
    # It keeps asking (with backoff) rather than giving up or crashing.
    eventually(
        lambda: sim.counters()[VM].get("status 400", 0) >= 3,
        what="three refused polls",
        details=agent.describe,
    )
    assert agent.proc.alive
    errors = [line for line in agent.stderr().splitlines() if " ERROR " in line]
    assert errors, agent.stderr()
    # IMDS's 400 body lists the versions it accepts: the operator needs exactly that.
    assert "400" in errors[0]
    assert "newest-versions" in errors[0]
    assert "2020-07-01" in errors[0]
    assert agent.stop() == 0

    records = agent.records()
    assert_all_valid(records)
    assert [r["HeartbeatReason"] for r in records] == ["Start", "Stop"]
    stop = records[-1]
    assert (stop["ImdsHealthy"], stop["LastImdsSuccess"], stop["DocumentIncarnation"]) == (
        False,
        None,
        None,
    )


def test_slow_first_scheduled_events_call_gets_the_first_call_timeout(procs: Processes) -> None:
    """After a day idle, IMDS may take minutes to answer the first Scheduled Events call.

    imds.first_call_timeout exists for that call; imds.timeout is for every call after the
    first answer. Here the first Scheduled Events call takes 3 s and imds.timeout is 1 s:
    the agent must wait for it, not time out and log a warning.
    """
    sim = Simulator.launch(procs, "sim", "--vms", "1", "--first-call-delay", "3")
    agent = Agent(procs, VM, sim.vm_url(VM), env={"SE_BRIDGE_IMDS_TIMEOUT": "1"}).start()
    sim.wait_polls({VM: 2}, "the slow first poll and the next one")
    assert agent.stop() == 0
    assert " WARNING " not in agent.stderr(), agent.stderr()
    records = agent.records()
    assert records[-1]["ImdsHealthy"] is True


def test_stop_signal_is_honoured_while_imds_is_slow_to_answer(procs: Processes) -> None:
    """IMDS may hold a call for minutes; a service manager waits far less for a stop.

    systemd sends SIGKILL 90 s after SIGTERM by default, Windows gives services less, and
    imds.first_call_timeout is 120 s: the agent must not sit out the request before stopping.
    """
    sim = Simulator.launch(procs, "sim", "--vms", "1", "--first-call-delay", "60")
    agent = Agent(procs, VM, sim.vm_url(VM)).start()
    agent.wait_polling()
    agent.proc.interrupt()
    assert agent.proc.wait(timeout=5) == 0
    records = agent.records()
    assert_all_valid(records)
    assert [r["HeartbeatReason"] for r in records] == ["Start", "Stop"]
