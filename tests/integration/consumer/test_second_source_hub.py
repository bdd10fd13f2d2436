"""Event Grid's deliveries through an event hub into the consumer (issue 36): the real
azure-eventhub SDK reads them from the Event Hubs test broker, with checkpoints in Azurite,
as `se-bridge consume` does with eventgrid.enabled.

A scale set of 4 where only web_0 and web_1 run an agent: with a `max_vms: 1` budget,
se-bridge approves nothing while an agent-less VM's event runs or Azure reports a VM
unavailable, and approves again once Azure says both are over; a delivery from a topic it
does not trust ends nothing.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubProducerClient

from bridge.config import (
    Config,
    ConsumerSettings,
    EventGridSettings,
    EventHubsSettings,
    StorageSettings,
)
from bridge.consumer.core import Consumer
from bridge.consumer.secondsource import EventGridIntake
from bridge.consumer.sources.eventgrid import Trust
from bridge.consumer.sources.eventhubs import eventgrid_hub, run_eventhubs
from bridge.consumer.state.sqlite import SqliteStore
from bridge.policy.model import Action, Budget, Match, Policy, Rule
from bridge.retry import Backoff
from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.support import eventgrid as eg
from tests.support.azurite import Azurite
from tests.support.consumer_cloud import CloudConsumers, PlannedEvent
from tests.support.fleetrecords import SUBSCRIPTION, FleetRecords
from tests.support.processes import Processes
from tests.support.records import T0, Sender
from tests.support.wait import eventually

E_A = "A0000000-0000-4000-8000-00000000000A"  # web_2's, no agent
E_B = "B0000000-0000-4000-8000-00000000000B"  # web_0's
E_C = "C0000000-0000-4000-8000-00000000000C"  # web_1's
POLICY = Policy(
    rules=(Rule("all", Match(), Action("approve")),),
    budgets=(Budget("one-of-four", "scale_set", max_vms=1),),
)


@pytest.fixture
def grid_broker() -> Iterator[EventHubsBroker]:
    """Event Grid's hub: what the system topics' event subscriptions deliver to."""
    with EventHubsBroker(hub="eventgrid", partitions=2) as running:
        yield running


class Fleet:
    """The consumer core, fed by its agents directly and by Event Grid through the hub."""

    def __init__(self, path: Path, broker: EventHubsBroker, azurite: Azurite) -> None:
        self.records = FleetRecords(T0)
        self.sender = Sender()
        self.decisions: list[Mapping[str, Any]] = []
        self.store = SqliteStore(path)
        self.consumer = Consumer(self.store, self.sender, POLICY, self.decisions.extend,
                                 ConsumerSettings(), now=lambda: self.records.now,
                                 health=True)  # fmt: skip
        self.config = Config(
            eventhubs=EventHubsSettings(connection_string="unused"),
            storage=StorageSettings(connection_string=azurite.connection_string),
            consumer=ConsumerSettings(checkpoint_container=f"cp-{uuid.uuid4().hex[:16]}"),
            eventgrid=EventGridSettings(
                enabled=True,
                health=True,
                hub="eventgrid",
                connection_string=broker.connection_string,
                subscriptions=[SUBSCRIPTION],
            ),
        )
        self.intake = EventGridIntake(self.consumer, Trust.of(self.config.eventgrid))
        self.broker = broker
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.reader = threading.Thread(target=self._read, name="test eventgrid reader")
        for name in ("web_0", "web_1"):
            self.records.vm(name, scale_set="web")
        self.agents = ("web_0", "web_1")
        self.consumer.process([self.records.heartbeat(name) for name in self.agents])

    def _read(self) -> None:
        try:
            run_eventhubs(eventgrid_hub(self.config), self.consumer.process, self.stop,
                          bodies=self.intake.handle, max_wait_time=0.2,
                          load_balancing_interval=1.0, checkpoint_interval=0.0,
                          backoff_factory=lambda: Backoff(initial=0.05, maximum=0.1))  # fmt: skip
        except BaseException as err:
            self.errors.append(err)

    def deliver(self, *bodies: str) -> None:
        deliver(self.broker, *bodies)

    def handled(self, count: int) -> None:
        """Wait until the intake has taken `count` deliveries in all (folded or refused)."""

        def taken() -> bool:
            intake = self.intake
            return intake.events + intake.health + sum(intake.refused.values()) >= count

        eventually(taken, timeout=60, what=f"{count} deliveries handled",
                   details=lambda: str(self.intake.counts()))  # fmt: skip

    def approved(self) -> list[str]:
        return [c.event_id for c in self.sender.sent]


@pytest.fixture
def fleet(tmp_path: Path, grid_broker: EventHubsBroker, azurite: Azurite) -> Iterator[Fleet]:
    made = Fleet(tmp_path / "fleet.db", grid_broker, azurite)
    made.reader.start()
    try:
        yield made
    finally:
        made.stop.set()
        made.reader.join(timeout=60)
        made.store.close()
    assert not made.errors


def test_a_budget_of_one_holds_across_a_scale_set_of_four_with_two_agents(fleet: Fleet) -> None:
    now = fleet.records.now
    # Azure starts web_2's event (no agent sees it) and reports web_3 down; a duplicate too.
    started = eg.scheduled(E_A, "Started", ["web_2"], now)
    fleet.deliver(started, started, eg.health("web_3", "Unavailable", now))
    fleet.handled(3)
    fleet.records.advance(1)
    # web_0's agent and Event Grid both report web_0's reboot: one event, and no slot for it.
    fleet.consumer.process([fleet.records.event("web_0", E_B, resources=["web_0"])])
    fleet.deliver(eg.scheduled(E_B, "Scheduled", ["web_0"], fleet.records.now, source="User"))
    fleet.handled(4)
    fleet.consumer.tick()
    assert fleet.approved() == []
    # A forged end of web_2's event from a topic not trusted frees nothing.
    fleet.records.advance(60)
    forged = "/subscriptions/00000000-0000-4000-8000-000000000000"
    fleet.deliver(eg.scheduled(E_A, "Completed", ["web_2"], fleet.records.now, topic=forged))
    fleet.handled(5)
    fleet.consumer.tick()
    assert fleet.approved() == []
    assert fleet.intake.refused == {"untrusted-topic": 1}
    # Azure ends web_2's event; web_3 is still down: still no slot.
    fleet.deliver(eg.scheduled(E_A, "Completed", ["web_2"], fleet.records.now))
    fleet.handled(6)
    fleet.consumer.tick()
    assert fleet.approved() == []
    explained = fleet.consumer.explain(E_B)
    assert explained is not None
    assert explained.verdict is not None
    assert any("web_3 unavailable since" in line for line in explained.verdict.explanation)
    # web_3 is back: web_0's reboot takes the one slot.
    fleet.records.advance(60)
    fleet.deliver(eg.health("web_3", "Available", fleet.records.now))
    eventually(
        lambda: fleet.approved() == [E_B], timeout=60, what="E_B approved once web_3 is back"
    )
    # web_1's event waits for it: one of four at a time, however the VMs report.
    fleet.records.advance(1)
    fleet.consumer.process([fleet.records.event("web_1", E_C, resources=["web_1"])])
    fleet.deliver(eg.scheduled(E_C, "Scheduled", ["web_1"], fleet.records.now, source="User"))
    fleet.handled(8)
    fleet.consumer.tick()
    assert fleet.approved() == [E_B]
    # web_0's reboot ends (its agent is rebooting: Azure says so first), and web_1's goes.
    fleet.records.advance(300)
    fleet.deliver(eg.scheduled(E_B, "Completed", ["web_0"], fleet.records.now, source="User"))
    fleet.handled(9)
    fleet.consumer.tick()
    assert fleet.approved() == [E_B, E_C]
    assert fleet.consumer.disagreements == {}  # both sources told each event alike


class GridConsumers(CloudConsumers):
    """`se-bridge consume` processes with the second source on, its hub on `grid`."""

    def __init__(
        self, procs: Processes, broker: EventHubsBroker, azurite: Azurite, grid: EventHubsBroker
    ) -> None:
        super().__init__(procs, broker, azurite)
        self.grid = grid

    def env(self) -> dict[str, str]:
        return {
            **super().env(),
            "SE_BRIDGE_EVENTGRID_ENABLED": "true",
            "SE_BRIDGE_EVENTGRID_HEALTH": "true",
            "SE_BRIDGE_EVENTGRID_HUB": "eventgrid",
            "SE_BRIDGE_EVENTGRID_CONNECTION_STRING": self.grid.connection_string,
            "SE_BRIDGE_EVENTGRID_SUBSCRIPTIONS": SUBSCRIPTION,
        }


def test_se_bridge_consume_reads_event_grids_hub_beside_the_records(
    procs: Processes, broker: EventHubsBroker, azurite: Azurite, grid_broker: EventHubsBroker
) -> None:
    rig = GridConsumers(procs, broker, azurite, grid_broker)
    try:
        rig.start("c1")
        for name in ("web_0", "web_1"):
            rig.fleet.vm(name, scale_set="web")
        rig.send(rig.heartbeats(["web_0", "web_1"]))
        deliver(grid_broker, eg.scheduled(E_A, "Started", ["web_2"], rig.now()))
        rig.wait(
            lambda: E_A.lower() in rig.ledger(), "web_2's event, from Event Grid alone, counted"
        )
        event = PlannedEvent(E_B, "web_0", "web", "User", "Reboot")
        rig.send(rig.scheduled([event]))
        rig.wait(lambda: any(d.get("EventId") == E_B and d.get("DecisionAction") == "Defer"
                             for d in rig.decisions("c1")), "web_0's event deferred")  # fmt: skip
        assert rig.commands() == []
        deliver(grid_broker, eg.scheduled(E_A, "Completed", ["web_2"], rig.now()))
        rig.wait(lambda: [c.event_id for c in rig.commands()] == [E_B], "web_0's event approved")
        rig.stop_all()
    finally:
        rig.close()


def deliver(broker: EventHubsBroker, *bodies: str) -> None:
    """As Event Grid delivers to an event hub: one event a message, no partition key."""
    producer = EventHubProducerClient.from_connection_string(broker.connection_string)
    try:
        batch = producer.create_batch()
        for body in bodies:
            batch.add(EventData(body))
        producer.send_batch(batch)
    finally:
        producer.close()
