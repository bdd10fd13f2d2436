"""The fleet in fleet time: what every VM's agent sends, and what the platform does.

`Sim.advance(t)` plays everything due by fleet second `t` and returns the records made, in
the order the agents made them (so each VM's own records are in order):

- every VM's heartbeat every `heartbeat_interval` (300 s, the agent's default), each VM at its
  own seeded phase, except while it reboots, once deleted, or once its agent is silent;
- a wave's events: each appears in the IMDS document of every VM that sees it, and each of
  those VMs' agents reports it (Scheduled); it starts when one of them approves it
  (`answer`, `start_delay` later: the platform acting on StartRequests) or at NotBefore
  without approval; they report it Started; it leaves their documents `runs_for` later
  (Completed); a reboot takes the VMs it names down meanwhile (no heartbeats; back with a
  Start heartbeat and a new boot id); a Preempt or Terminate deletes them instead. Who sees
  an event is the `fan_out`: "named", the VMs its Resources name (the issue's model), or
  "group", every VM of their placement groups and availability sets, as Microsoft's page
  says events are delivered (the others report it with AffectsThisVm false);
- VMs deleted mid-event (scale-in) and agents that fall silent, when the wave says.

Fleet time maps to the wall clock through a `Clock`: live runs stamp records with the wall
clock as agents do (`WallClock`); the generator's own test stamps them with fleet time
(`FleetClock`), which makes the stream a pure function of the seed.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import Any, Protocol

from bridge.commands.message import Command, resources_digest
from bridge.recordtypes import ApprovalOutcome as Outcome
from tests.benchmarks.loadgen.agents import Agents, Record
from tests.benchmarks.loadgen.fleet import Fleet
from tests.benchmarks.loadgen.waves import SimEvent, WavePlan

Emitted = tuple[int, Record]  # (VM index, record)
FAN_OUTS = ("named", "group")  # who sees an event: see the module's docstring
HEARTBEAT_INTERVAL = 300.0  # agent.heartbeat_interval's default
START_DELAY = 2.0  # fleet s from an accepted StartRequests until the event is Started
BUSY_RETRY = 5.0  # fleet s: a command that reaches a rebooting VM is read after it is back


class Clock(Protocol):
    def stamp(self, fleet_t: float) -> datetime:
        """What a record made at fleet second `fleet_t` carries as TimeGenerated."""

    def at(self, fleet_t: float) -> datetime:
        """When fleet second `fleet_t` falls (a NotBefore)."""

    def wall(self, fleet_t: float) -> float:
        """Epoch seconds of the moment, for the run's own log."""


class WallClock:
    """Live runs: fleet time runs `scale` times faster than the wall clock from `start`."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self._mono = time.monotonic()
        self._epoch = time.time()

    def start(self) -> None:
        self._mono, self._epoch = time.monotonic(), time.time()

    def fleet_now(self) -> float:
        return (time.monotonic() - self._mono) * self.scale

    def stamp(self, fleet_t: float) -> datetime:
        return datetime.now(timezone.utc)

    def at(self, fleet_t: float) -> datetime:
        return datetime.fromtimestamp(self._epoch + fleet_t / self.scale, timezone.utc)

    def wall(self, fleet_t: float) -> float:
        return time.time()


class FleetClock:
    """Stamps that follow fleet time from `epoch` (compressed by `scale`): no wall clock."""

    def __init__(self, epoch: datetime, scale: float = 1.0) -> None:
        self.epoch, self.scale = epoch, scale

    def stamp(self, fleet_t: float) -> datetime:
        return self.at(fleet_t)

    def at(self, fleet_t: float) -> datetime:
        return self.epoch + timedelta(seconds=fleet_t / self.scale)

    def wall(self, fleet_t: float) -> float:
        return self.at(fleet_t).timestamp()


def rfc1123(moment: datetime) -> str:
    """NotBefore as IMDS writes it."""
    return moment.astimezone(timezone.utc).strftime("%a, %d %b %Y %H:%M:%S GMT")


class Sim:
    """The fleet's agents and the platform, driven by fleet time."""

    def __init__(
        self,
        fleet: Fleet,
        plan: WavePlan,
        clock: Clock,
        *,
        seed: int = 1,
        offset: float = 0.0,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
        fan_out: str = "named",
    ) -> None:
        if fan_out not in FAN_OUTS:
            raise ValueError(f"fan_out {fan_out!r}: one of {', '.join(FAN_OUTS)}")
        self.fleet, self.plan, self.clock = fleet, plan, clock
        self.fan_out = fan_out
        # Event -> the VMs whose documents hold it; built as events appear.
        self.seers: dict[str, tuple[int, ...]] = {}
        self.agents = Agents(fleet)
        self.interval = heartbeat_interval
        self.events = {event.event_id: event for event in plan.events}
        self.deleted: dict[int, float] = {}  # VM -> wall time it was deleted
        self.silent: dict[int, float] = {}  # VM -> wall time its agent fell silent
        self.down: dict[int, str] = {}  # VM -> the event whose reboot it is down for
        self.counts = {"records": 0, "heartbeats": 0, "events": 0, "approvals": 0}
        self.outcomes: dict[str, int] = {}  # Approval records by outcome
        self.approved: dict[str, int] = {}  # event -> StartRequests its agents sent
        self._heap: list[tuple[float, int, Callable[[float], list[Emitted]]]] = []
        self._seq = itertools.count()
        rng = random.Random(f"phases/{seed}")
        phases = sorted((rng.uniform(0, heartbeat_interval), i) for i in range(len(fleet)))
        self._phase = [p for p, _ in phases]
        self._order = [i for _, i in phases]
        self._cycle, self._pos = 0, 0
        self.offset = offset  # fleet second at which the wave begins
        for event in plan.events:
            self._at(offset + event.appear, partial(self._appear, event))
        for when, index in plan.silences:
            self._at(offset + when, partial(self._silence, index))

    # --- what the player calls ----------------------------------------------------------

    def warm_up(self, chunk: int = 2000) -> Iterator[list[Emitted]]:
        """Every VM's Start heartbeat (its agent started before the run), `chunk` at a time."""
        for start in range(0, len(self.fleet), chunk):
            stop = min(start + chunk, len(self.fleet))
            beats = [
                (i, self.agents.heartbeat(i, self.clock.stamp(0.0), "Start"))
                for i in range(start, stop)
            ]
            self.counts["records"] += len(beats)
            self.counts["heartbeats"] += len(beats)
            yield beats

    def advance(self, until: float) -> list[Emitted]:
        """Everything due by fleet second `until`, in time order."""
        out: list[Emitted] = []
        while True:
            beat = self._cycle * self.interval + self._phase[self._pos]
            action = self._heap[0][0] if self._heap else math.inf
            if min(beat, action) > until:
                break
            if beat <= action:
                self._heartbeat(beat, out)
            else:
                when, _, run = heapq.heappop(self._heap)
                out += run(when)
        self.counts["records"] += len(out)
        return out

    def answer(self, command: Command, now: float) -> None:
        """A command reached its VM's channel: the agent reads it on its next poll."""
        self._at(now, partial(self._answer, command))

    def open_events(self) -> int:
        """Events not yet gone from every document."""
        return sum(1 for e in self.plan.events if e.status != "Gone")

    def finished(self, now: float) -> bool:
        return now >= self.offset + self.plan.length or (
            self.open_events() == 0 and now >= self.offset + self._last_planned()
        )

    def _last_planned(self) -> float:
        appear = max((e.appear for e in self.plan.events), default=0.0)
        silent = max((t for t, _ in self.plan.silences), default=0.0)
        return max(appear, silent, self.plan.at_least)

    # --- the platform and the agents ----------------------------------------------------

    def _at(self, when: float, run: Callable[[float], list[Emitted]]) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), run))

    def _gone(self, index: int) -> bool:
        return index in self.deleted or index in self.silent

    def _heartbeat(self, when: float, out: list[Emitted]) -> None:
        index = self._order[self._pos]
        self._pos += 1
        if self._pos == len(self._order):
            self._pos, self._cycle = 0, self._cycle + 1
        if self._gone(index) or index in self.down:
            return
        out.append((index, self.agents.heartbeat(index, self.clock.stamp(when))))
        self.counts["heartbeats"] += 1

    def _raw(self, event: SimEvent, status: str, not_before: str) -> dict[str, Any]:
        return {
            "EventId": event.event_id,
            "EventType": event.event_type,
            "ResourceType": "VirtualMachine",
            "Resources": [self.fleet.vms[i].name for i in event.vms],
            "EventStatus": status,
            "NotBefore": not_before,
            "Description": event.description,
            "EventSource": event.source,
            "DurationInSeconds": event.duration,
        }

    def _seers(self, event: SimEvent) -> tuple[int, ...]:
        seers = self.seers.get(event.event_id)
        if seers is None:
            if self.fan_out == "named":
                seers = event.vms
            else:
                around = {i for vm in event.vms for i in self.fleet.neighbours(vm)}
                # The named VMs first, in their order: they are who reports it first.
                seers = event.vms + tuple(sorted(around - set(event.vms)))
            self.seers[event.event_id] = seers
        return seers

    def _observe_all(self, event: SimEvent, when: float) -> list[Emitted]:
        out: list[Emitted] = []
        stamp = self.clock.stamp(when)
        for index in self._seers(event):
            if self._gone(index) or index in self.down:
                continue  # a rebooting VM sees the change when it is back
            records = self.agents.observe(index, stamp)
            out += [(index, r) for r in records]
            self.counts["events"] += len(records)
        return out

    def _appear(self, event: SimEvent, when: float) -> list[Emitted]:
        event.status = "Scheduled"
        not_before = when + event.notice
        raw = self._raw(event, "Scheduled", rfc1123(self.clock.at(not_before)))
        for index in self._seers(event):
            if not self._gone(index):
                self.agents.put(index, raw)
        self._at(not_before, partial(self._start, event, "platform"))
        return self._observe_all(event, when)

    def _start(self, event: SimEvent, by: str, when: float) -> list[Emitted]:
        if event.status != "Scheduled":
            return []
        event.status, event.started, event.started_by = "Started", self.clock.wall(when), by
        raw = self._raw(event, "Started", "")
        for index in self._seers(event):
            if not self._gone(index):
                self.agents.put(index, raw)
        out = self._observe_all(event, when)
        for index in event.vms:
            if event.rebooting and not self._gone(index) and index not in self.down:
                self.agents.reboot(index)
                self.down[index] = event.event_id
            if index in event.deletes:
                self._at(when + event.deletes[index], partial(self._delete, index))
        self._at(when + event.runs_for, partial(self._end, event))
        return out

    def _end(self, event: SimEvent, when: float) -> list[Emitted]:
        event.status, event.ended = "Gone", self.clock.wall(when)
        out: list[Emitted] = []
        stamp = self.clock.stamp(when)
        named = set(event.vms)
        for index in self._seers(event):
            if self._gone(index):
                continue
            if event.evicts and index in named:
                self._delete(index, when)
                continue
            self.agents.drop(index, event.event_id)
            if self.down.get(index) == event.event_id:
                del self.down[index]
                out.append((index, self.agents.heartbeat(index, stamp, "Start")))
                self.counts["heartbeats"] += 1
            if index not in self.down:
                records = self.agents.observe(index, stamp)
                out += [(index, r) for r in records]
                self.counts["events"] += len(records)
            self.agents.idle(index)
        return out

    def _delete(self, index: int, when: float) -> list[Emitted]:
        if index not in self.deleted:
            self.deleted[index] = self.clock.wall(when)
            self.down.pop(index, None)
            self.agents.forget(index)
        return []

    def _silence(self, index: int, when: float) -> list[Emitted]:
        if not self._gone(index):
            self.silent[index] = self.clock.wall(when)
            self.agents.forget(index)
        return []

    def _answer(self, command: Command, when: float) -> list[Emitted]:
        """The target's agent checks the command against a fresh document, as the real one
        does (bridge.agent.approver), and approves through IMDS or refuses."""
        vm = self.fleet.by_vm_id(command.vm_id)
        if vm is None or self._gone(vm.index):
            return []  # no agent reads the channel of a deleted VM or a silent agent
        if vm.index in self.down:
            self._at(when + BUSY_RETRY, partial(self._answer, command))
            return []
        stamp = self.clock.stamp(when)
        if command.expired(stamp):
            return []  # the channel dropped it unread
        event = self.events.get(command.event_id.upper())
        agent = self.agents.agent(vm.index)
        raw = agent.events.get(command.event_id.upper())
        outcome: Outcome
        if event is None or raw is None:
            outcome, detail = (
                "Refused",
                f"NotFound: event {command.event_id} is not in the document",
            )
        elif raw["EventStatus"] != "Scheduled":
            outcome, detail = (
                "Refused",
                f"NotScheduled: event {command.event_id} is {raw['EventStatus']}",
            )
        elif command.resources_digest not in (None, resources_digest(raw["Resources"])):
            outcome, detail = (
                "Refused",
                f"ResourcesChanged: event {command.event_id} names other VMs",
            )
        else:
            outcome = "Approved"
            detail = (
                f"IMDS accepted StartRequests for {raw['EventType']} {command.event_id}: "
                f"{command.reason}"
            )
            self._at(when + START_DELAY, partial(self._start, event, "approval"))
        self.counts["approvals"] += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if outcome == "Approved":
            self.approved[command.event_id.upper()] = (
                self.approved.get(command.event_id.upper(), 0) + 1
            )
        record = self.agents.approval(vm.index, command, outcome, detail, stamp)
        self.agents.idle(vm.index)
        return [(vm.index, record)]
