"""The consumer on its cloud parts: Event Hubs (the test broker), Table Storage, Storage Queues
and blob checkpoints (Azurite), through the real SDKs.

Real `se-bridge consume` processes share the hub's four partitions, the fleet state table and
the approval ledger; records go in through the agent's own Event Hubs sink; the commands are
read back from the per-VM queues. Whatever the timing (rebalancing, a consumer killed
mid-batch, two decisions racing for one budget slot), no event gets two approvals and no
budget is exceeded or leaked.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from typing import Any

import pytest

from bridge import recordtypes as rt
from bridge.commands.message import Command
from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer.core import Consumer
from bridge.consumer.ledger import read_ledger
from bridge.consumer.state import Conflict, Doc
from bridge.consumer.state.kinds import table_store
from bridge.consumer.state.tables import TableStore
from bridge.policy.model import Action, Budget, Match, Policy, Rule
from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.support.azurite import Azurite
from tests.support.consumer_cloud import (
    CloudConsumers,
    PlannedEvent,
    assert_budget_held,
    assert_one_approval_per_event,
    by_event,
    scale_set_of,
)
from tests.support.fleetrecords import FleetRecords
from tests.support.processes import Processes, Record
from tests.support.state import DelegatingStore, tables_config, unique_table

EVENT_TYPES = ("Reboot", "Redeploy", "Freeze")


@pytest.fixture
def rig(procs: Processes, broker: EventHubsBroker, azurite: Azurite) -> Iterator[CloudConsumers]:
    made = CloudConsumers(procs, broker, azurite)
    try:
        yield made
    finally:
        made.close()


def plan(
    rig: CloudConsumers, scale_sets: int, vms_per_set: int, events_per_set: int, standalone: int
) -> tuple[list[str], list[PlannedEvent]]:
    """A fleet of scale sets and standalone VMs; events on distinct VMs: in each scale set
    `events_per_set` of them (the last from the user, the others from the platform), and a
    user event on every standalone VM."""
    names: list[str] = []
    events: list[PlannedEvent] = []
    for s in range(scale_sets):
        scale_set = f"vmss{s}"
        for v in range(vms_per_set):
            rig.fleet.vm(f"{scale_set}_{v}", scale_set=scale_set)
            names.append(f"{scale_set}_{v}")
        for e in range(events_per_set):
            source = "User" if e == events_per_set - 1 else "Platform"
            events.append(PlannedEvent(str(uuid.uuid4()).upper(), f"{scale_set}_{e}", scale_set,
                                       source, EVENT_TYPES[e % len(EVENT_TYPES)]))  # fmt: skip
    for v in range(standalone):
        name = f"solo{v}"
        rig.fleet.vm(name)
        names.append(name)
        events.append(PlannedEvent(str(uuid.uuid4()).upper(), name, None, "User", "Reboot"))
    return names, events


def approve_in_rounds(rig: CloudConsumers, events: list[PlannedEvent]) -> int:
    """Carry out every approval the consumers send, round after round, until each event has
    been approved and completed; the budget and the one-approval rule are checked at every
    look at the queues and the ledger. Returns how many rounds it took."""
    scale_sets = scale_set_of(events)
    planned = {fs.event_key(e.event_id): e for e in events}
    completed: set[str] = set()
    rounds = 0
    while len(completed) < len(events):
        remaining = [e for key, e in planned.items() if key not in completed]
        # Due now: every standalone event, and one event of each scale set with any left.
        solo = {fs.event_key(e.event_id) for e in remaining if e.scale_set is None}
        sets_left = {e.scale_set for e in remaining if e.scale_set is not None}

        def round_approved(
            completed: set[str] = completed, solo: set[str] = solo, sets_left: set[str] = sets_left
        ) -> dict[str, Command] | None:
            found = rig.commands()
            ledger = rig.ledger()
            assert_one_approval_per_event(found)
            assert_budget_held(ledger, found, completed, scale_sets)
            assert set(by_event(found)) <= set(planned)
            outstanding = {k: c[0] for k, c in by_event(found).items() if k not in completed}
            covered = {scale_sets[k] for k in outstanding}
            return outstanding if solo <= set(outstanding) and sets_left <= covered else None

        outstanding = rig.wait(round_approved, f"approvals of round {rounds + 1}")
        for key, command in outstanding.items():
            assert command.vm_id == rig.fleet.vm_id(planned[key].vm), "sent to the wrong VM"
        done = [planned[key] for key in outstanding]
        rig.send(rig.finished(done, {c.event_id: c for c in outstanding.values()}))
        completed |= set(outstanding)
        rounds += 1
    rig.wait(lambda: not rig.ledger(), "every completed event to leave the ledger")
    return rounds


def approve_decisions(decisions: list[Record]) -> dict[str, set[str]]:
    """The distinct Approve Decision records (by RecordId) of each event."""
    out: dict[str, set[str]] = {}
    for record in decisions:
        if record["DecisionAction"] == "Approve":
            out.setdefault(fs.event_key(record["EventId"]), set()).add(record["RecordId"])
    return out


@pytest.mark.slow
def test_two_consumers_share_the_partitions_and_never_approve_twice_or_break_a_budget(
    rig: CloudConsumers,
) -> None:
    names, events = plan(rig, scale_sets=4, vms_per_set=8, events_per_set=3, standalone=8)
    rig.start("consumer-a")
    rig.start("consumer-b")

    def split() -> bool:
        owners = rig.owners()
        return len(owners) == 4 and len(set(owners.values())) == 2

    rig.wait(split, "the two consumers to split the four partitions")

    rig.send(rig.heartbeats(names) + rig.scheduled(events))  # four producers at once
    rounds = approve_in_rounds(rig, events)
    assert rounds == 3  # one event per scale set at a time: three rounds for three events

    found = rig.commands()
    copies = assert_one_approval_per_event(found)
    assert set(by_event(found)) == {fs.event_key(e.event_id) for e in events}
    # Without a crash not even a copy: a consumer leaves another's unsent entry alone while
    # that one is still sending it.
    assert set(copies.values()) == {1}, copies
    rig.stop_all()  # flushes each consumer's Decision records
    per_process = {home: rig.decisions(home) for home in ("consumer-a", "consumer-b")}
    for home, decisions in per_process.items():
        assert decisions, f"{home} made no decision"
        assert "reading partition" in rig.procs.workdir.joinpath(f"{home}.stderr").read_text()
    approvals = approve_decisions([d for ds in per_process.values() for d in ds])
    assert {k: len(ids) for k, ids in approvals.items()} == dict.fromkeys(by_event(found), 1)
    print(f"{len(events)} events in {rounds} rounds; decisions per process: "
          f"{ {h: len(d) for h, d in per_process.items()} }")  # fmt: skip


def crash(rig: CloudConsumers, name: str, approvals: int) -> tuple[dict[str, Any], set[str]]:
    """SIGKILL `name` as soon as the ledger holds `approvals` entries: the ledger then, and the
    events whose command was sent but whose entry was not yet marked sent."""
    rig.wait(lambda: len(rig.ledger()) >= approvals, f"{approvals} approvals", interval=0.005)
    rig.kill(name)
    time.sleep(0.5)  # a request already on its way when the process died still lands
    ledger, queued = rig.ledger(), by_event(rig.commands())
    return ledger, {k for k, e in ledger.items() if not e.get("sent") and k in queued}


@pytest.mark.slow
def test_consumers_killed_mid_batch_leave_no_double_approval_and_no_budget_leak(
    rig: CloudConsumers,
) -> None:
    names, events = plan(rig, scale_sets=4, vms_per_set=4, events_per_set=2, standalone=8)
    first_round = 4 + 8  # one event of each scale set, and every standalone VM's
    rig.start("consumer-a")
    rig.wait(lambda: len(rig.owners()) == 4, "consumer-a to own every partition")
    rig.send(rig.heartbeats(names))
    rig.wait(lambda: rig.known_vms() == len(names), "consumer-a to know the fleet")

    rig.send(rig.scheduled(events))
    at_first, resent = crash(rig, "consumer-a", 1)
    assert len(at_first) < first_round, "the kill did not land while approvals were handled"
    # It comes back on its own state directory (its Decision spool), re-reads the batch that
    # was never checkpointed, and is killed again a little further on.
    rig.start("consumer-a.1", home="consumer-a")
    at_second, resent_too = crash(rig, "consumer-a.1", len(at_first) + 2)
    rig.start("consumer-a.2", home="consumer-a")
    rig.start("consumer-b")
    approve_in_rounds(rig, events)

    found = rig.commands()
    copies = assert_one_approval_per_event(found)
    assert set(by_event(found)) == {fs.event_key(e.event_id) for e in events}
    # Copies only of what a kill left unsent, resent by whoever found it (each recovering
    # consumer may), and surely of what was sent but not yet marked sent.
    left_unsent = {k for kill in (at_first, at_second) for k, e in kill.items() if not e["sent"]}
    copied = {fs.event_key(c.event_id) for c in found if copies[c.command_id] > 1}
    assert copied <= left_unsent, "a copy no crash explains"
    assert resent | resent_too <= copied, "a command sent before the kill was not resent"
    rig.stop_all()
    # The audit trail is whole: the restarted consumer delivered what its spool still held,
    # and a resend says the Decision again under the same RecordId.
    decisions = rig.decisions("consumer-a") + rig.decisions("consumer-b")
    approvals = approve_decisions(decisions)
    assert {k: len(ids) for k, ids in approvals.items()} == dict.fromkeys(by_event(found), 1)
    for at_kill in (at_first, at_second):
        unsent = sum(1 for e in at_kill.values() if not e.get("sent"))
        print(f"killed with {len(at_kill)} approvals in the ledger, {unsent} not marked sent")
    print(f"sent but not marked at a kill: {len(resent | resent_too)}; copied: {len(copied)}")


# --- two consumer cores racing on one table -----------------------------------------------------


class RacingStore(DelegatingStore):
    """A TableStore whose first ledger write in each thread waits until the other thread's
    first ledger write is due too: both decisions have then read the same ledger ETag."""

    def __init__(self, inner: TableStore, barrier: threading.Barrier) -> None:
        super().__init__(inner)
        self.barrier = barrier
        self.armed = False
        self.conflicts = 0
        self._waited = threading.local()

    def write_all(self, collection: str, docs: Sequence[Doc]) -> list[Doc]:
        if self.armed and collection == fs.LEDGER and not getattr(self._waited, "done", False):
            self._waited.done = True
            self.barrier.wait()
        try:
            return self.inner.write_all(collection, docs)
        except Conflict:
            self.conflicts += 1
            raise


class Sender:
    def __init__(self) -> None:
        self.sent: list[Command] = []
        self._lock = threading.Lock()

    def send(self, command: Command, time_to_live: float) -> None:
        with self._lock:
            self.sent.append(command)

    def close(self) -> None:
        pass


def test_two_consumers_racing_for_the_last_budget_slot_on_tables_one_wins(
    azurite: Azurite,
) -> None:
    policy = Policy(
        rules=(Rule("all", Match(), Action("approve")),),
        budgets=(Budget("two-web", "scale_set", max_vms=2),),
    )
    fleet = FleetRecords(datetime.now(timezone.utc))
    for n in range(4):
        fleet.vm(f"web_{n}", scale_set="web")
    table = unique_table()
    barrier = threading.Barrier(2, timeout=30)
    config = tables_config(azurite.connection_string)
    stores = [RacingStore(table_store(config, table, spread=fs.PARTITIONS), barrier)
              for _ in range(2)]  # fmt: skip
    sender = Sender()
    decisions: list[rt.Decision] = []
    consumers = [
        Consumer(store, sender, policy, decisions.extend, ConsumerSettings(), host_name=f"c{i}")
        for i, store in enumerate(stores)
    ]
    try:
        e0, e1, e2 = (str(uuid.uuid4()).upper() for _ in range(3))
        consumers[0].process([fleet.heartbeat(f"web_{n}") for n in range(4)])
        consumers[0].process([fleet.event("web_0", e0)])  # one of the two slots taken
        assert [c.event_id for c in sender.sent] == [e0]

        for store in stores:
            store.armed = True
        fleet.advance(1)
        racing = [fleet.event("web_1", e1), fleet.event("web_2", e2)]
        errors: list[BaseException] = []

        def run(consumer: Consumer, record: Record) -> None:
            try:
                consumer.process([record])
            except BaseException as err:
                errors.append(err)

        threads = [
            threading.Thread(target=run, args=(c, r))
            for c, r in zip(consumers, racing, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors, errors

        assert sum(s.conflicts for s in stores) == 1, "the two decisions did not meet"
        assert len(sender.sent) == 2
        winner = sender.sent[1].event_id
        assert winner in (e1, e2)
        loser = e2 if winner == e1 else e1
        ledger = read_ledger(stores[0]).events
        assert set(ledger) == {fs.event_key(e0), fs.event_key(winner)}
        said = [(d["EventId"], d["DecisionAction"]) for d in decisions]
        assert said[0] == (e0, "Approve")
        assert sorted(said[1:]) == sorted([(winner, "Approve"), (loser, "Defer")])

        # The slot frees when the winner's event completes; the loser's event gets it.
        for store in stores:
            store.armed = False
        fleet.advance(1)
        winner_vm = "web_1" if winner == e1 else "web_2"
        consumers[0].process([fleet.event(winner_vm, winner, transition="Started")])
        fleet.advance(1)
        consumers[0].process([fleet.event(winner_vm, winner, transition="Completed")])
        consumers[1].tick()
        assert [c.event_id for c in sender.sent] == [e0, winner, loser]
    finally:
        for consumer in consumers:
            consumer.close()
