"""`se-bridge agent` with both cloud sinks, through a broker outage, a run of 429s and a restart.

Real processes (the simulator and two agents) against the Event Hubs test broker and the
Logs Ingestion double, which run in this test. Afterwards every record is in all three sinks
(jsonl, Event Hubs, Log Analytics), each VM's records are in order in Event Hubs, and the only
duplicates are identical records with the same RecordId.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.doubles.logs_ingestion import LogsIngestionDouble
from tests.support.cloud import cloud_env
from tests.support.processes import Agent, Processes, Record, Simulator, assert_all_valid
from tests.support.wait import eventually

pytestmark = pytest.mark.e2e

VMS = ("vm-0", "vm-1")
DELIVERY_WAIT = 90.0  # a sink's backoff after an outage can reach tens of seconds


def hub_records(broker: EventHubsBroker) -> list[tuple[str, Record, dict[str, Any]]]:
    """(partition, record, application properties) of every event, partition by partition."""
    out = []
    for event in broker.events():
        out.append((event.partition, json.loads(event.body), dict(event.application_properties)))
    return out


def ids(records: list[Record]) -> set[str]:
    return {r["RecordId"] for r in records}


@pytest.mark.slow
def test_every_record_reaches_both_clouds_through_outage_throttling_and_restart(
    procs: Processes, broker: EventHubsBroker, logs: LogsIngestionDouble
) -> None:
    sim = Simulator.launch(procs, "sim", "--vms", "2")
    agents = [
        Agent(procs, vm, sim.vm_url(vm), args=("--sink", "eventhubs", "--sink", "loganalytics"),
              env=cloud_env(broker, logs, sim.vm_url(vm))).start()
        for vm in VMS
    ]  # fmt: skip
    sim.wait_polls(dict.fromkeys(VMS, 2))
    first = sim.add_event(EventType="Reboot", Resources=list(VMS), notice=3600.0)
    for agent in agents:
        agent.wait_transition(first, "Scheduled")

    broker.stop()  # outage: jsonl and Log Analytics go on, Event Hubs waits in the spool
    logs.script(429, retry_after=1, count=4)
    sim.act(first, "start")
    for agent in agents:
        agent.wait_transition(first, "Started")
    for agent in agents:  # restart while the broker is still down
        assert agent.stop() == 0
        agent.start()
    sim.act(first, "complete")
    second = sim.add_event(EventType="Freeze", Resources=["vm-0"], notice=3600.0)
    for agent in agents:
        agent.wait_transition(first, "Completed")
    agents[0].wait_transition(second, "Scheduled")  # a standalone VM's event: only vm-0 sees it
    broker.start()

    expected = set().union(*(ids(a.records()) for a in agents))

    def in_hub() -> bool:
        return expected <= {r["RecordId"] for _, r, _ in hub_records(broker)}

    def in_analytics() -> bool:
        return expected <= ids(logs.records())

    eventually(in_hub, what="every record in Event Hubs", timeout=DELIVERY_WAIT)
    eventually(in_analytics, what="every record in Log Analytics", timeout=DELIVERY_WAIT)
    for agent in agents:
        assert agent.stop() == 0

    check_everything_arrived(agents, broker, logs)
    assert 429 in [r.status for r in logs.requests]
    for agent in agents:
        log = agent.stderr()
        assert "Traceback" not in log
        assert "SharedAccessKey=" not in log
        for secret in (broker.key, *logs.tokens_seen):
            assert secret not in log, f"{agent.name} logged a secret"


def check_everything_arrived(
    agents: list[Agent], broker: EventHubsBroker, logs: LogsIngestionDouble
) -> None:
    local = [r for a in agents for r in a.records()]
    hub = hub_records(broker)
    analytics = logs.records()
    assert_all_valid(local)
    assert_all_valid(analytics)
    assert ids(local) == {r["RecordId"] for _, r, _ in hub} == ids(analytics)
    for copies in (local, [r for _, r, _ in hub], analytics):
        assert_duplicates_identical(copies)
    for partition, record, properties in hub:
        assert properties == {
            "RecordType": record["RecordType"],
            "SchemaVersion": 1,
            "VmId": record["VmId"],
            "RecordId": record["RecordId"],
        }, f"partition {partition}"
    for agent in agents:
        assert_in_order_on_one_partition(agent, hub)


def assert_duplicates_identical(records: list[Record]) -> None:
    seen: dict[str, Record] = {}
    for record in records:
        assert seen.setdefault(record["RecordId"], record) == record


def assert_in_order_on_one_partition(
    agent: Agent, hub: list[tuple[str, Record, dict[str, Any]]]
) -> None:
    mine = [(p, r) for p, r, _ in hub if r["VmName"] == agent.name]
    assert len({p for p, _ in mine}) == 1, f"{agent.name}'s records are on several partitions"
    order = list(dict.fromkeys(r["RecordId"] for _, r in mine))
    assert order == list(dict.fromkeys(r["RecordId"] for r in agent.records()))
