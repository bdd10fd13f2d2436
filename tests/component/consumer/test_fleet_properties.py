"""Property: on a messy fleet the real consumer never approves unsafely (issue 14).

A random fleet of three resource groups, rg-a and rg-b of one subscription and rg-a of
another, each with a scale set `web` (instances web_0, web_1, ...: the same names in every
group) and availability-set VMs app0, app1 (the same names in each too), each VM with a tier
tag and a clock that may be right, a little ahead, seven hours behind or a year ahead. A
random policy (rules with and without VM conditions, budgets over scale sets, resource groups,
the fleet and the tier tag) and a random sequence of steps:
heartbeats, new events (reported by every VM of the event's scale set or availability set,
as Azure sends them; some also naming VMs without an agent, `ghost_N`), VMs of other scopes
that claim an event in their own name (Scheduled, Started or gone: a compromised VM, or a
misrouted record), Resources that grow and shrink, platform starts, completions, VMs
deleted and created again under their name (a new VmId), clock advances (healthy agents
heartbeat and their records arrive on the way), partial deliveries interleaving VMs (each
VM's own records in order) with replays, poison records, ticks, Approval records from the
targets (the agent's ResourcesDigest check included), and a lagging partition: the VMs' records
go to two partitions (by VM), and for a while the consumer reads nothing of one of them (or of
either: it stalls) while its clock runs on, past alive_within and an event's NotBefore
(issue 27). Every batch says where it was read and how far (a partition is
read up to its oldest record still waiting), as a source does; every record passes the
consumer's input check on its way in, as in `se-bridge consume`.

Checked at every command, against the truth the test keeps (which VMs an event really
names: the names in the reporting scale set or availability set, among the VMs the platform
showed it to: one created again under its name after it appeared is not one of them until an
update shows it the event):

- a rule with VM conditions approved it only if they hold for every true VM;
- no budget group has more VMs impacted than its limit, the group sized by its live
  members (a record within alive_within) and its impacted ones. Impacted: the live true VMs
  of every event approved by a command or seen Started, until its end was delivered from
  every reporter not deleted, or all its VMs are deleted (a released event whose VM still
  exists keeps counting here);

and at the end: every poison record was refused at the door, every event still Scheduled
got a Decision, and once the records stop the state converges: no ledger entry, no event,
and the documents of the deleted VMs removed (four hours on, the healthy agents heartbeating
every minute while an event or a ledger entry is left, every 15 minutes after).
"""

from __future__ import annotations

import os
import random
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bridge import recordtypes as rt
from bridge.commands.message import Command, resources_digest
from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer import validation
from bridge.consumer.core import Consumer
from bridge.consumer.ledger import read_ledger
from bridge.consumer.reading import Position
from bridge.consumer.state.memory import MemoryStore
from bridge.policy.matching import vm_matches
from bridge.policy.model import Action, Budget, Match, Policy, Rule, VmView
from bridge.records import iso
from tests.support.fleetrecords import SUBSCRIPTION, FleetRecords

OTHER = "8d5f9c8e-0000-4000-8000-0000000000b2"  # a second subscription

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
SETTINGS = ConsumerSettings(alive_within=120.0, approval_timeout=30.0, stale_after=3600.0,
                            forget_vms_after=7200.0, unknown_names_for=900.0)  # fmt: skip
HEARTBEAT_EVERY = 60.0  # healthy agents, well within alive_within
# ... and once no event and no ledger entry is left (the end of `finish`), where only the
# hourly sweep of VMs not heard for forget_vms_after is still to come: well within that.
QUIET_HEARTBEAT_EVERY = 900.0
# The test suite's run: 150 examples, about 10 s of CPU, fresh ones on every run (no example
# database is kept between CI's fresh clones). SE_BRIDGE_FLEET_EXAMPLES=2000 (with
# `--timeout 0`) is the deeper run for a change to how the consumer decides, too long for
# every run of the suite on two cores (docs/development.md).
EXAMPLES = int(os.environ.get("SE_BRIDGE_FLEET_EXAMPLES", "150"))
SKEWS = (0.0, 0.0, 120.0, -7 * 3600.0, 365 * 86400.0)  # seconds a VM's clock is off
PARTITIONS = 2  # where the VMs' records go, by VM
NONE: frozenset[int] = frozenset()

RULES = {
    "rg-a-only": Rule("rg-a-only", Match(resource_groups=frozenset({"rg-a"})), Action("approve")),
    "web-tier": Rule("web-tier", Match(tags=(("tier", "web"),)), Action("approve")),
    "web-set": Rule("web-set", Match(scale_sets=frozenset({"web"})), Action("approve")),
    "users": Rule("users", Match(event_sources=frozenset({"user"})), Action("approve")),
}
BUDGETS = (
    Budget("set-1", "scale_set", max_vms=1),
    Budget("rg-2", "resource_group", max_vms=2),
    Budget("fleet-25", "fleet", max_percent=25),
    Budget("tier-1", "tag:tier", max_vms=1),
    Budget("set-half", "scale_set", max_percent=50),
)


@dataclass
class Vm:
    name: str
    rg: str
    scale_set: str | None
    tier: str
    skew: float
    sub: str = SUBSCRIPTION
    generation: int = 0
    deleted: bool = False

    @property
    def handle(self) -> str:
        return f"{self.sub[-2:]}/{self.rg}/{self.name}#{self.generation}"

    @property
    def scope(self) -> tuple[str, str, str | None]:
        return (self.sub, self.rg, self.scale_set)

    @property
    def partition(self) -> int:
        return partition_of(self.handle)

    def view(self) -> VmView:
        return VmView(self.handle, self.name, self.sub, self.rg, scale_set=self.scale_set,
                      tags={"tier": self.tier})  # fmt: skip

    def group(self, kind: str) -> str | None:
        return {
            "fleet": "fleet",
            "scale_set": f"{self.sub}/{self.rg}/{self.scale_set}" if self.scale_set else None,
            "resource_group": f"{self.sub}/{self.rg}",
            "tag:tier": self.tier,
        }[kind]


def partition_of(handle: str) -> int:
    return zlib.crc32(handle.encode()) % PARTITIONS


@st.composite
def fleets(draw: st.DrawFn) -> list[Vm]:
    vms = []
    for sub, rg in ((SUBSCRIPTION, "rg-a"), (SUBSCRIPTION, "rg-b"), (OTHER, "rg-a")):
        for n in range(draw(st.integers(1 if sub == SUBSCRIPTION else 0, 3))):
            vms.append(Vm(f"web_{n}", rg, "web", draw(st.sampled_from(("web", "db"))),
                          draw(st.sampled_from(SKEWS)), sub))  # fmt: skip
        for n in range(draw(st.integers(0, 2))):
            vms.append(Vm(f"app{n}", rg, None, draw(st.sampled_from(("web", "db"))),
                          draw(st.sampled_from(SKEWS)), sub))  # fmt: skip
    return vms


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    names = draw(st.lists(st.sampled_from(sorted(RULES)), min_size=1, max_size=3, unique=True))
    budgets = draw(st.lists(st.sampled_from(BUDGETS), max_size=2, unique_by=lambda b: b.name))
    rest = Rule("rest", Match(), Action("hold"))
    return Policy(rules=(*(RULES[n] for n in names), rest), budgets=tuple(budgets))


# Which scope, which of its names (bits), from a user or not, and how many ghost names.
NEW_EVENT = st.tuples(st.just("event"), st.integers(0, 9), st.integers(1, 7), st.booleans(),
                      st.sampled_from((0, 0, 0, 1, 2)))  # fmt: skip
FORGE = st.tuples(st.just("forge"), st.integers(0, 9), st.integers(0, 9),
                  st.sampled_from(("Scheduled", "Started", "Completed")))  # fmt: skip
DELIVER = st.tuples(st.just("deliver"), st.integers(1, 12), st.integers(0, 2**16), st.booleans())
# New events, deliveries and answers weigh more: budgets are tested by events that overlap.
STEPS = st.one_of(
    NEW_EVENT,
    NEW_EVENT,
    NEW_EVENT,
    DELIVER,
    DELIVER,
    st.tuples(st.just("answer")),
    st.tuples(st.just("heartbeat"), st.integers(0, 9)),
    st.tuples(st.just("resize"), st.integers(0, 9), st.integers(1, 7)),
    st.tuples(st.just("start"), st.integers(0, 9)),
    st.tuples(st.just("complete"), st.integers(0, 9)),
    st.tuples(st.just("delete"), st.integers(0, 9)),
    st.tuples(st.just("recreate"), st.integers(0, 9)),
    st.tuples(st.just("advance"), st.sampled_from((1.0, 20.0, 130.0, 700.0))),
    DELIVER,
    st.tuples(st.just("tick")),
    st.tuples(st.just("answer")),
    st.tuples(st.just("poison"), st.integers(0, 3)),
    FORGE,
    FORGE,
    st.tuples(st.just("lag"), st.integers(0, PARTITIONS), st.sampled_from((130.0, 1200.0))),
)


@dataclass
class EventModel:
    event_id: str
    scope: tuple[str, str, str | None]
    names: set[str]
    user: bool
    not_before: datetime
    started: bool = False  # truly, by the platform
    completed: bool = False
    started_delivered: bool = False
    end_delivered: set[str] = field(default_factory=set)  # reporters whose end arrived
    sent: list[Command] = field(default_factory=list)
    answered: set[str] = field(default_factory=set)
    reporters: set[str] = field(default_factory=set)  # handles that reported it
    # A VM of another scope that has a VM of one of its names said it started: which scope
    # is the event's is ambiguous, and the consumer takes it as started (fail closed).
    started_elsewhere: bool = False


class World:
    def __init__(self, vms: list[Vm], policy: Policy) -> None:
        self.now = T0
        self.vms = vms
        self.policy = policy
        self.records = FleetRecords(T0)
        for vm in vms:
            self._register(vm)
        # In memory: this tests the consumer, not a store (the stores pass one contract).
        self.store = MemoryStore()
        self.decisions: list[rt.Decision] = []
        self.consumer = Consumer(self.store, self, policy, self.decisions.extend, SETTINGS,
                                 now=lambda: self.now)  # fmt: skip
        # (VM handle, record, when it was sent) not yet read, and those read
        self.pending: list[tuple[str, dict[str, Any], datetime]] = []
        self.delivered: list[tuple[str, dict[str, Any]]] = []
        self.heard: dict[str, datetime] = {}
        self.beat: dict[str, datetime] = {}
        self.events: dict[str, EventModel] = {}
        self.poison_refused = 0
        self.violations: list[str] = []

    def _register(self, vm: Vm) -> None:
        self.records.vm(vm.name, scale_set=vm.scale_set, resource_group=vm.rg,
                        tags={"tier": vm.tier}, handle=vm.handle, subscription=vm.sub)  # fmt: skip

    # --- the command channel: every command is checked as it is sent -----------------------

    def send(self, command: Command, time_to_live: float) -> None:
        event = self.events[command.event_id]
        try:
            # A VM of another scope cannot approve the event (its IMDS does not have it): its
            # agent refuses the command (`answer`).
            target = self.target(command)
            if target is not None and target.scope == event.scope:
                self.check_rule(event, command)
                self.check_budgets(event)
        except AssertionError as err:
            # Kept here too: the consumer isolates a failing decision (as it must), so an
            # exception raised from a send would only become an "(error)" Decision record.
            self.violations.append(str(err))
            raise
        event.sent.append(command)

    def close(self) -> None:
        pass

    # --- truth ------------------------------------------------------------------------------

    def target(self, command: Command) -> Vm | None:
        """The VM the command went to, None if deleted and created again since."""
        return next((vm for vm in self.vms
                     if self.records.origins[vm.handle].identity.vm_id == command.vm_id),
                    None)  # fmt: skip

    def live(self) -> list[Vm]:
        return [vm for vm in self.vms if not vm.deleted]

    def true_vms(self, event: EventModel) -> list[Vm]:
        """The VMs the event names: its names in its scale set or availability set, as now,
        among those shown the event."""
        return [vm for vm in self.live() if vm.scope == event.scope and vm.name in event.names
                and vm.handle in event.reporters]  # fmt: skip

    def alive(self, vm: Vm) -> bool:
        heard = self.heard.get(vm.handle)
        return heard is not None and self.now - heard <= timedelta(seconds=SETTINGS.alive_within)

    def impacting(self, event: EventModel) -> bool:
        # Ended once every reporter still there said so: a deleted one never does.
        there = event.reporters & {vm.handle for vm in self.live()}
        ended = event.end_delivered >= there and event.end_delivered
        return bool(event.sent or event.started_delivered) and not ended

    def check_rule(self, event: EventModel, command: Command) -> None:
        rule = next(r for r in self.policy.rules if r.name == command.rule)
        source = "user" if event.user else "platform"
        assert not rule.match.event_sources or source in rule.match.event_sources, (
            f"rule {rule.name} approved {event.event_id}, a {source} event"
        )
        if rule.match.about_vms:
            for vm in self.true_vms(event):
                assert vm_matches(rule.match, vm.view()), (
                    f"rule {rule.name} approved {event.event_id} on {vm.handle}, "
                    "which its VM conditions do not match"
                )

    def check_budgets(self, event: EventModel) -> None:
        mine = {vm.handle for vm in self.true_vms(event)}
        others: set[str] = set()
        for other in self.events.values():
            if other is not event and self.impacting(other):
                others |= {vm.handle for vm in self.true_vms(other)}
        impacted = others | mine
        for budget in self.policy.budgets:
            for key in {vm.group(budget.group) for vm in self.true_vms(event)} - {None}:
                group = [vm for vm in self.live() if vm.group(budget.group) == key]
                size = len([vm for vm in group if self.alive(vm) or vm.handle in impacted])
                count = len(impacted & {vm.handle for vm in group})
                assert count <= budget.limit(size), (
                    f"approving {event.event_id} puts {count} VMs of {key} under maintenance, "
                    f"more than budget {budget.name} allows of {size}"
                )

    # --- what the agents send ---------------------------------------------------------------

    def emit(self, vm: Vm, record: dict[str, Any]) -> None:
        record["TimeGenerated"] = iso(self.now + timedelta(seconds=vm.skew))
        self.pending.append((vm.handle, record, self.now))

    def heartbeat(self, vm: Vm) -> None:
        self.records.now = self.now
        self.emit(vm, self.records.heartbeat(vm.handle))
        self.beat[vm.handle] = self.now

    def event_record(self, event: EventModel, transition: str) -> None:
        for vm in self.live():
            if vm.scope == event.scope:
                event.reporters.add(vm.handle)
                self.claim(vm, event, transition)

    def claim(self, vm: Vm, event: EventModel, transition: str, *, forged: bool = False) -> None:
        """`vm` reports `event` in its own name; `forged`: a VM of another scope, which says
        the event is of the other source."""
        self.records.now = self.now
        record = self.records.event(
            vm.handle, event.event_id, transition=transition,
            source="User" if event.user != forged else "Platform", resources=sorted(event.names),
            not_before=event.not_before,
        )  # fmt: skip
        self.emit(vm, record)

    def deliver(self, count: int, seed: int, replay: bool, held: frozenset[int] = NONE) -> None:
        """Up to `count` waiting records, VMs interleaved (each VM's in order); none of
        the partitions `held` (the consumer is behind there)."""
        chooser = random.Random(seed)
        batch: list[tuple[str, dict[str, Any]]] = []
        while len(batch) < count:
            handles = sorted({h for h, _, _ in self.pending if partition_of(h) not in held})
            if not handles:
                break
            pick = chooser.choice(handles)
            index = next(i for i, (h, _, _) in enumerate(self.pending) if h == pick)
            batch.append(self.pending.pop(index)[:2])
        if replay and self.delivered:
            batch += chooser.sample(self.delivered, min(3, len(self.delivered)))
        self.process(batch)

    def process(self, batch: list[tuple[str, dict[str, Any]]]) -> None:
        """Each partition's records of `batch`, and how far it is read: up to its oldest
        record still waiting (everything sent before that was read), or to now."""
        self.delivered += batch
        for partition in range(PARTITIONS):
            given = []
            for handle, record in batch:
                if partition_of(handle) == partition:
                    copy = dict(record)
                    assert validation.problem(copy) is None, record
                    given.append(copy)
                    self.learn(record)
            waiting = [at for h, _, at in self.pending if partition_of(h) == partition]
            self.consumer.process(
                given, Position(f"hub/{partition}", min(waiting, default=self.now))
            )

    def learn(self, record: dict[str, Any]) -> None:
        handle = next(h for h, o in self.records.origins.items()
                      if o.identity.vm_id == record["VmId"])  # fmt: skip
        self.heard[handle] = self.now
        event = self.events.get(str(record.get("EventId")))
        if event is None or record["RecordType"] != "Event" or handle not in event.reporters:
            return  # what a VM of another scope says of the event is not the truth
        if record["EventStatus"] == "Started":
            event.started_delivered = True
        if record["EventStatus"] is None:
            event.end_delivered.add(handle)

    def advance(
        self, seconds: float, held: frozenset[int] = NONE, every: float = HEARTBEAT_EVERY
    ) -> None:
        """Time passes: healthy agents heartbeat `every` s, what they send is read (but what
        goes to the partitions `held`), and the consumer makes its passes."""
        end = self.now + timedelta(seconds=seconds)
        while self.now < end:
            self.now = min(end, self.now + timedelta(seconds=every))
            for vm in self.live():
                if self.now - self.beat.get(vm.handle, T0) >= timedelta(seconds=every):
                    self.heartbeat(vm)
            self.deliver(len(self.pending), 0, replay=False, held=held)
            self.consumer.tick()

    def answer(self) -> None:
        for event in self.events.values():
            for command in event.sent:
                target = self.target(command)
                if command.command_id in event.answered or target is None or target.deleted:
                    continue
                event.answered.add(command.command_id)
                same = command.resources_digest == resources_digest(event.names)
                ok = same and not event.started and not event.completed
                ok = ok and target.scope == event.scope
                self.records.now = self.now
                self.emit(target, self.records.approval(command, "Approved" if ok else "Refused"))
                if ok:
                    event.started = True
                    self.event_record(event, "Started")

    def poison(self, kind: int) -> None:
        vm = self.vms[kind % len(self.vms)]
        self.records.now = self.now
        record = self.records.heartbeat(vm.handle)
        damages: list[dict[str, Any]] = [
            {"VmId": "x/../y"},
            {"VmName": "web_\ud800"},
            {"TimeGenerated": "2026-19-39T29:59:59Z"},
            {"Resources": ["web_0"]},
        ]
        damage = damages[kind]
        record.update(damage)
        assert validation.problem(record) is not None, damage
        self.poison_refused += 1


def run_step(world: World, step: tuple[Any, ...]) -> None:  # noqa: PLR0912 - a dispatcher
    kind, *args = step
    vms = world.vms
    events = list(world.events.values())
    if kind == "heartbeat":
        vm = vms[args[0] % len(vms)]
        if not vm.deleted:
            world.heartbeat(vm)
    elif kind == "event":
        scopes = sorted({vm.scope for vm in world.live()}, key=str)
        if not scopes:
            return
        scope = scopes[args[0] % len(scopes)]
        names = sorted({vm.name for vm in world.live() if vm.scope == scope})
        chosen = {n for i, n in enumerate(names) if args[1] >> i & 1} or {names[0]}
        chosen |= {f"ghost_{n}" for n in range(args[3])}  # VMs of the set without an agent
        event_id = f"00000000-0000-4000-8000-{len(world.events):012d}"
        nb = world.now + timedelta(minutes=15)
        world.events[event_id] = EventModel(event_id, scope, chosen, args[2], nb)
        world.event_record(world.events[event_id], "Scheduled")
    elif kind == "resize" and events:
        event = events[args[0] % len(events)]
        names = sorted({vm.name for vm in world.live() if vm.scope == event.scope})
        if names and not event.started and not event.completed:
            event.names = {n for i, n in enumerate(names) if args[1] >> i & 1} or {names[-1]}
            world.event_record(event, "Updated")
    elif kind == "start" and events:
        event = events[args[0] % len(events)]
        if not event.started and not event.completed:
            event.started = True
            world.event_record(event, "Started")
    elif kind == "complete" and events:
        event = events[args[0] % len(events)]
        if not event.completed:
            event.completed = True
            world.event_record(event, "Completed")
    elif kind == "delete":
        vms[args[0] % len(vms)].deleted = True
    elif kind == "recreate":
        vm = vms[args[0] % len(vms)]
        if vm.deleted:
            vm.deleted, vm.generation = False, vm.generation + 1
            world._register(vm)
            world.heartbeat(vm)
    elif kind == "advance":
        world.advance(args[0])
    elif kind == "deliver":
        world.deliver(*args)
    elif kind == "tick":
        world.consumer.tick()
    elif kind == "answer":
        world.answer()
    elif kind == "poison":
        world.poison(args[0])
    elif kind == "forge" and events:
        vm, event = vms[args[0] % len(vms)], events[args[1] % len(events)]
        if not vm.deleted and vm.scope != event.scope:
            world.claim(vm, event, args[2], forged=True)
            same = any(v.scope == vm.scope and v.name in event.names for v in world.vms)
            event.started_elsewhere |= same and args[2] == "Started"
    elif kind == "lag":
        # One partition, or (PARTITIONS) all of them: a consumer that stalls.
        world.advance(
            args[1], held=frozenset({args[0]} if args[0] < PARTITIONS else range(PARTITIONS))
        )


def finish(world: World) -> None:
    world.advance(HEARTBEAT_EVERY)
    for event in world.events.values():
        known = any(d["EventId"] == event.event_id for d in world.decisions)
        scheduled = not (event.started or event.completed or event.started_elsewhere)
        scheduled = scheduled and bool(world.true_vms(event))
        if scheduled and any(h in world.heard for h in event.reporters):
            assert known, f"event {event.event_id} was never decided: another one blocked it?"
    for event in world.events.values():
        if not event.completed:
            event.completed = True
            world.event_record(event, "Completed")
    # Four hours: past stale_after, and past the first hourly sweep after forget_vms_after.
    # While an event or a ledger entry is left, the agents heartbeat as before: whether a VM
    # is alive decides what is released. Once none is left, no record but a heartbeat comes,
    # and only the sweep is still to come, which reads when each VM was last heard: a beat
    # every QUIET_HEARTBEAT_EVERY tells it the same (a beat a minute there took nine tenths
    # of this test's time, and took it past pytest's timeout on a loaded machine).
    end = world.now + timedelta(hours=4)
    while world.now < end and (read_ledger(world.store).events or world.store.scan(fs.EVENT)):
        world.advance(HEARTBEAT_EVERY)
    world.advance((end - world.now).total_seconds(), every=QUIET_HEARTBEAT_EVERY)
    ledger = read_ledger(world.store).events
    assert ledger == {}, ledger
    assert world.store.scan(fs.EVENT) == []
    kept = {doc.key for doc in world.store.scan(fs.VM)}
    live = {world.records.origins[vm.handle].identity.vm_id for vm in world.live()}
    assert kept == live & kept, "the documents of deleted VMs are not removed"
    assert live <= kept


# A consumer that stalls past an approved event's NotBefore and alive_within: the event's
# VMs were only unread, and its slot must not go to the deferred one of the same tier.
STALL = {
    "vms": [Vm("web_0", "rg-a", "web", "web", 0.0), Vm("app0", "rg-a", None, "web", 0.0)],
    "policy": Policy(rules=(RULES["rg-a-only"], Rule("rest", Match(), Action("hold"))),
                     budgets=(BUDGETS[3],)),
    "steps": [("event", 1, 1, False, 0), ("deliver", 12, 1, False), ("event", 0, 1, False, 0),
              ("deliver", 12, 1, False), ("lag", PARTITIONS, 1200.0), ("advance", 130.0)],
}  # fmt: skip


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None)
@given(vms=fleets(), policy=policies(), steps=st.lists(STEPS, max_size=40))
@example(**STALL)
def test_a_messy_fleet_never_gets_an_unsafe_approval(
    vms: list[Vm], policy: Policy, steps: list[tuple[Any, ...]]
) -> None:
    world = World(vms, policy)
    try:
        for vm in vms:
            world.heartbeat(vm)
        world.deliver(len(world.pending), 0, replay=False)
        for step in steps:
            run_step(world, step)
            assert not world.violations, world.violations
        finish(world)
        assert not world.violations, world.violations
    finally:
        world.store.close()
