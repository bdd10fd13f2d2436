"""Messy-fleet faults for the chaos run (issue 14), written straight into the local hub the
consumer reads, as agents the simulator does not run would send them:

- twins: a scale set `web` in resource group rg-stage, in the simulator's subscription, whose
  instances are named web_0 and web_1 like the real ones. Their events name "web_0" too: the
  consumer must resolve each name in the reporters' scope, or a twin's reboot counts against
  the real scale set's budget (and a real one against the twins');
- a twin user Reboot that grows to both twins after its approval and then completes (no
  agent takes the twins' commands: the approval goes unanswered);
- a twin Preempt that starts, after which that twin is deleted (falls silent): its budget
  slot must be released with a Release Decision. The twin comes back later with a new VmId;
- clocks that lie: a twin heartbeat dated a year ahead (clamped), one seven hours behind;
- poison: bodies the consumer must set aside (a VmId that is no GUID, an unpaired surrogate,
  a date that is none), each marked with a RecordId `check` looks for in the dead letters;
- a mole: a standalone VM of another subscription (one compromised VM, or misrouted records)
  that says in its own name that an event naming `no-such-vm` has started, again every cycle
  until the chaos is over (the real scale sets must not wait for it), and that claims the
  real fleet's events as started or gone (which must neither hold nor release their slots,
  nor carry their approvals). It takes its claims back once the run settles.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from bridge.localhub import LocalHub
from bridge.records import iso
from tests.support.fleetrecords import FleetRecords

TWINS = ("web_0", "web_1")
RESOURCE_GROUP = "rg-stage"
MOLE, MOLE_SUBSCRIPTION = "mole", "8d5f9c8e-0000-4000-8000-0000000000b2"
POISON = (
    {"VmId": "x/../y"},
    {"VmName": "web_\ud800"},
    {"TimeGenerated": "2026-19-39T29:59:59Z"},
)


@dataclass
class TwinEvent:
    event_id: str
    kind: str  # Reboot (user) or Preempt (platform)
    resources: list[str]
    reporters: list[str]  # handles
    ended: bool = False
    deleted: str | None = None  # the handle deleted after a Preempt started
    left_behind: bool = False  # a reporter was deleted while the event was open


@dataclass
class Twins:
    hub: Path
    subscription: str
    rng: random.Random
    records: FleetRecords = field(init=False)
    generation: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TWINS, 0))
    deleted: set[str] = field(default_factory=set)  # twin names deleted now
    gone: set[str] = field(default_factory=set)  # handles deleted, for good
    events: list[TwinEvent] = field(default_factory=list)
    poison_ids: list[str] = field(default_factory=list)
    future_vm: str | None = None
    made: dict[str, int] = field(default_factory=dict)
    written: set[str] = field(default_factory=set)  # RecordIds: not an agent's, in no jsonl
    forged: list[str] = field(default_factory=list)  # the mole's own events (no-such-vm)
    claimed: dict[str, list[str]] = field(default_factory=dict)  # real events: their Resources

    def __post_init__(self) -> None:
        self.records = FleetRecords(datetime.now(timezone.utc))
        for name in TWINS:
            self._register(name)
        self.records.vm(MOLE, resource_group="rg-mole", subscription=MOLE_SUBSCRIPTION)

    @property
    def mole(self) -> str:
        return self.records.vm_id(MOLE)

    def _register(self, name: str) -> None:
        self.records.vm(name, scale_set="web", resource_group=RESOURCE_GROUP,
                        handle=self.handle(name), subscription=self.subscription)  # fmt: skip

    def handle(self, name: str) -> str:
        return f"twin-{name}#{self.generation[name]}"

    def vm_id(self, name: str) -> str:
        return self.records.vm_id(self.handle(name))

    def alive(self) -> list[str]:
        return [name for name in TWINS if name not in self.deleted]

    # --- each kill cycle -----------------------------------------------------------------

    def step(self, cycle: int, real: Mapping[str, Mapping[str, Any]]) -> None:
        """One kill cycle's records; `real`: the simulator's events (rig.events())."""
        self.records.now = datetime.now(timezone.utc)
        out = [self.records.heartbeat(self.handle(name)) for name in self.alive()]
        out += self._mole(cycle, real)
        reboot = next((e for e in self.events if e.kind == "Reboot" and not e.ended), None)
        if cycle % 10 == 1 and reboot is None and self.alive():
            out += self._new("Reboot", [self.rng.choice(self.alive())])
        elif cycle % 10 == 4 and reboot is not None:
            reboot.resources = list(TWINS)  # it grows after its approval
            out += self._event_records(reboot, "Updated")
        elif cycle % 10 == 7 and reboot is not None:
            out += self._end(reboot)
        if cycle % 25 == 12 and len(self.alive()) == len(TWINS):
            out += self._preempt()
        if cycle % 25 == 20:
            out += self._recreate()
        if cycle % 15 == 9:
            out += self._skewed()
        if cycle % 8 == 5:
            out += self._poison()
        self._write(out)

    def _new(
        self, kind: str, resources: list[str], reporters: list[str] | None = None
    ) -> list[dict[str, Any]]:
        seed = self.records.origins[self.handle(TWINS[0])]
        event_id = str(seed.record_id("twin", kind, iso(self.records.now))).upper()
        names = reporters if reporters is not None else self.alive()
        event = TwinEvent(event_id, kind, resources, [self.handle(name) for name in names])
        self.events.append(event)
        self.made[kind] = self.made.get(kind, 0) + 1
        return self._event_records(event, "Scheduled" if kind == "Reboot" else "Started")

    def _event_records(self, event: TwinEvent, transition: str) -> list[dict[str, Any]]:
        source = "User" if event.kind == "Reboot" else "Platform"
        return [
            self.records.event(
                handle,
                event.event_id,
                transition=transition,
                event_type=event.kind,
                source=source,
                resources=event.resources,
                not_before=self.records.now + timedelta(minutes=15),
            )
            for handle in event.reporters
            if handle not in self.gone
        ]

    def _end(self, event: TwinEvent) -> list[dict[str, Any]]:
        event.ended = True
        return self._event_records(event, "Completed")

    def _preempt(self) -> list[dict[str, Any]]:
        victim = self.rng.choice(TWINS)
        for event in self.events:
            event.left_behind |= not event.ended and self.handle(victim) in event.reporters
        out = self._new("Preempt", [victim], reporters=[victim])
        self.events[-1].deleted = self.handle(victim)
        self.deleted.add(victim)  # deleted by the platform: it never reports again
        self.gone.add(self.handle(victim))
        return out

    def _recreate(self) -> list[dict[str, Any]]:
        out = []
        for name in sorted(self.deleted):
            self.generation[name] += 1
            self._register(name)
            out.append(self.records.heartbeat(self.handle(name)))
            self.made["recreated"] = self.made.get("recreated", 0) + 1
        self.deleted.clear()
        return out

    def _skewed(self) -> list[dict[str, Any]]:
        if not self.alive():
            return []
        name = self.rng.choice(self.alive())
        ahead = self.records.heartbeat(self.handle(name))
        ahead["TimeGenerated"] = iso(self.records.now + timedelta(days=365))
        behind = self.records.heartbeat(self.handle(name))
        behind["RecordId"] = behind["RecordId"][:-4] + "beef"
        behind["TimeGenerated"] = iso(self.records.now - timedelta(hours=7))
        self.future_vm = self.vm_id(name)
        self.made["skewed clocks"] = self.made.get("skewed clocks", 0) + 2
        return [ahead, behind]

    def _mole(self, cycle: int, real: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
        out = [self.records.heartbeat(MOLE)]
        if cycle % 50 == 3:
            forged = self.records.origins[MOLE].record_id("mole", cycle)
            self.forged.append(forged.upper())
        out += [self._claim(event_id, "Started", ["no-such-vm"]) for event_id in self.forged]
        open_events = sorted(k for k, e in real.items() if e.get("endedAt") is None)
        if cycle % 3 == 1 and open_events:
            event_id = self.rng.choice(open_events)
            self.claimed[event_id] = list(real[event_id]["resources"])
            transition = self.rng.choice(("Started", "Completed"))
            out.append(self._claim(event_id, transition, self.claimed[event_id]))
            said = f"mole claims {transition}"
            self.made[said] = self.made.get(said, 0) + 1
        return out

    def _claim(self, event_id: str, transition: str, resources: list[str]) -> dict[str, Any]:
        return self.records.event(MOLE, event_id, transition=transition, source="Platform",
                                  resources=resources)  # fmt: skip

    def _poison(self) -> list[dict[str, Any]]:
        out = []
        for damage in POISON:
            record = self.records.heartbeat(self.handle(TWINS[0]))
            record["RecordId"] = f"poison-{len(self.poison_ids)}"
            record.update(damage)
            self.poison_ids.append(record["RecordId"])
            out.append(record)
        return out

    def _write(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        self.written.update(str(r["RecordId"]) for r in records)
        with LocalHub(self.hub) as hub:
            hub.append([(str(r.get("VmId") or f"host:{r['HostName']}"), json.dumps(r))
                        for r in records])  # fmt: skip

    # --- the end -------------------------------------------------------------------------

    def settle(self) -> None:
        """Every twin Reboot ends; a Preempt whose twin was deleted is left to the consumer."""
        self.records.now = datetime.now(timezone.utc)
        out = [self.records.heartbeat(self.handle(name)) for name in self.alive()]
        for event in self.events:
            if not event.ended and event.deleted is None:
                out += self._end(event)
        out += [self._claim(e, "Completed", ["no-such-vm"]) for e in self.forged]
        out += [self._claim(e, "Completed", names) for e, names in self.claimed.items()]
        self._write(out)

    def released(self) -> list[str]:
        """Events a deleted twin still reports (it never says they ended): the Preempts that
        deleted it, and Reboots it reported. Each must get a Release Decision."""
        return [e.event_id for e in self.events if e.deleted is not None or e.left_behind]

    def event_ids(self) -> set[str]:
        return {e.event_id.lower() for e in self.events} | {e.lower() for e in self.forged}
