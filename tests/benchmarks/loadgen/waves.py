"""The named, seeded waves: what the platform does to the fleet, in fleet seconds.

A wave is a plan, made before the run from the fleet and a seed: the events (which VMs each
names, when it appears, its notice, how long it runs once started) and the VMs deleted or
whose agents fall silent, and when. How the events then play out (approved and started early,
or started by the platform at NotBefore) depends on the consumers, and is `sim`'s part.

- `steady`: heartbeats only.
- `freeze`: a regional host update: Freeze events for `share` (20%) of the fleet, appearing
  within `window` (30 minutes), 15 minutes' notice, each pausing the VMs one host holds (a
  scale set's VMs by placement group and fault domain, two at most; one VM otherwise) for 5
  to 30 s.
- `spot-storm`: `count` (5,000) Spot VMs evicted within `window` (2 minutes): a Preempt
  event each with the documented minimum of 30 s notice; the VM is gone once it starts.
- `rolling-reboot`: platform Reboots of every VM of the rolling scale sets (tagged
  `maintenance: rolling`, about `share` of the fleet), all announced within 5 minutes with
  30 minutes' notice, so the scale-set budget (20%) paces them; meanwhile users reboot 0.5%
  of the fleet (15 minutes' notice).
- `scale-in`: platform Reboots of VMs of rolling scale sets, half of which are deleted
  (scale-in) while their event is under way; Terminate notifications (user scale-in, 5
  minutes' notice) whose VMs are deleted once they start; and 1% of the agents falling silent.

Sizes shrink with the fleet (a 300-VM fleet has no 5,000 Spot VMs); the report says what
was played.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.benchmarks.loadgen.fleet import Fleet

MINUTE = 60.0


@dataclass
class SimEvent:
    """One Scheduled Event: its plan (fleet seconds from the wave's start) and, once
    played, what happened on the wall clock (epoch seconds)."""

    event_id: str
    event_type: str  # Freeze, Reboot, Preempt, Terminate
    source: str  # Platform or User
    vms: tuple[int, ...]  # fleet indices of the VMs its Resources name
    appear: float
    notice: float  # from appearing to NotBefore
    runs_for: float  # from Started until it leaves the documents
    duration: int  # DurationInSeconds
    description: str
    evicts: bool = False  # its VMs are deleted when it ends (Preempt, Terminate)
    deletes: dict[int, float] = field(default_factory=dict)  # VM -> fleet s after Started
    status: str = "future"  # future, Scheduled, Started, Gone
    first_record: float | None = None  # when its first record was in a hub
    started: float | None = None
    started_by: str | None = None  # "approval" or "platform"
    start_place: tuple[int, int, int] | None = None  # (hub, partition, offset) of a Started
    ended: float | None = None

    @property
    def rebooting(self) -> bool:
        return self.event_type in ("Reboot", "Redeploy")


@dataclass
class WavePlan:
    name: str
    events: list[SimEvent]
    silences: list[tuple[float, int]] = field(default_factory=list)  # (fleet s, VM)
    length: float = 0.0  # fleet seconds until everything planned has happened, at the latest
    description: str = ""
    at_least: float = 0.0  # fleet seconds the wave lasts even when nothing is left open

    def __post_init__(self) -> None:
        ends = [e.appear + e.notice + e.runs_for for e in self.events]
        ends += [t for t, _ in self.silences]
        self.length = max([self.length, *ends])


@dataclass(frozen=True)
class WaveOptions:
    share: float | None = None  # of the fleet: frozen (0.2), in rolling sets rebooted (0.1)
    window: float | None = None  # fleet seconds over which events appear (wave default)
    count: int = 5000  # spot-storm: evictions
    steady: float = 900.0  # steady: fleet seconds of heartbeats


def _event_id(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4)).upper()


FREEZE_TEXT = "Virtual machine is being paused because of a memory-preserving Live Migration."
REBOOT_TEXT = "Virtual machine is going to be restarted as requested by authorized user."
PLATFORM_REBOOT_TEXT = "Virtual machine is going to be restarted because of a host update."
PREEMPT_TEXT = "Virtual machine is going to be evicted: Azure needs the capacity back."
TERMINATE_TEXT = "Virtual machine is going to be deleted as requested by authorized user."


def steady(fleet: Fleet, rng: random.Random, options: WaveOptions) -> WavePlan:
    return WavePlan(
        "steady",
        [],
        length=options.steady,
        at_least=options.steady,
        description=f"heartbeats only, {options.steady:g} fleet seconds",
    )


def freeze(fleet: Fleet, rng: random.Random, options: WaveOptions) -> WavePlan:
    window = options.window or 30 * MINUTE
    share = 0.2 if options.share is None else options.share
    chosen = set(rng.sample(range(len(fleet)), round(len(fleet) * share)))
    hosts: list[tuple[int, ...]] = []
    for members in fleet.placement_groups.values():
        by_domain: dict[int, list[int]] = {}
        for index in members:
            if index in chosen:
                by_domain.setdefault(fleet.vms[index].fault_domain, []).append(index)
        for vms in by_domain.values():
            hosts += [tuple(vms[i : i + 2]) for i in range(0, len(vms), 2)]
    others = [fleet.vms[i] for i in sorted(chosen) if fleet.vms[i].scale_set is None]
    hosts += [(vm.index,) for vm in others]
    rng.shuffle(hosts)
    events = [
        SimEvent(
            _event_id(rng),
            "Freeze",
            "Platform",
            vms,
            rng.uniform(0, window),
            15 * MINUTE,
            runs_for=float(duration),
            duration=duration,
            description=FREEZE_TEXT,
        )
        for vms in hosts
        for duration in [rng.choice((5, 5, 9, 15, 30))]
    ]
    return WavePlan(
        "freeze",
        events,
        description=(
            f"regional host update: Freeze events for {len(chosen):,} VMs ({share:.0%}) in "
            f"{len(events):,} events within {window / MINUTE:g} fleet minutes"
        ),
    )


def spot_storm(fleet: Fleet, rng: random.Random, options: WaveOptions) -> WavePlan:
    window = options.window or 2 * MINUTE
    spot = fleet.spot()
    evicted = rng.sample(spot, min(options.count, len(spot)))
    events = [
        SimEvent(
            _event_id(rng),
            "Preempt",
            "Platform",
            (index,),
            rng.uniform(0, window),
            notice=30.0,
            runs_for=10.0,
            duration=-1,
            description=PREEMPT_TEXT,
            evicts=True,
        )
        for index in evicted
    ]
    return WavePlan(
        "spot-storm",
        events,
        description=(
            f"Spot eviction storm: {len(events):,} Preempt events (of {len(spot):,} Spot VMs) "
            f"within {window / MINUTE:g} fleet minutes, 30 s notice"
        ),
    )


def _rolling_sets(fleet: Fleet, rng: random.Random, share: float) -> list[list[int]]:
    rolling = [
        members
        for members in fleet.scale_sets.values()
        if fleet.vms[members[0]].tag("maintenance") == "rolling"
    ]
    rng.shuffle(rolling)
    picked: list[list[int]] = []
    for members in rolling:
        if picked and sum(map(len, picked)) + len(members) > share * len(fleet):
            continue
        picked.append(members)
    return picked


def _user_reboots(fleet: Fleet, rng: random.Random, share: float, window: float) -> list[SimEvent]:
    users = rng.sample(range(len(fleet)), max(1, round(len(fleet) * share)))
    return [
        SimEvent(
            _event_id(rng),
            "Reboot",
            "User",
            (index,),
            rng.uniform(0, window),
            15 * MINUTE,
            runs_for=rng.uniform(60, 150),
            duration=-1,
            description=REBOOT_TEXT,
        )
        for index in users
    ]


def rolling_reboot(fleet: Fleet, rng: random.Random, options: WaveOptions) -> WavePlan:
    window = options.window or 5 * MINUTE
    sets = _rolling_sets(fleet, rng, 0.1 if options.share is None else options.share)
    events = [
        SimEvent(
            _event_id(rng),
            "Reboot",
            "Platform",
            (index,),
            rng.uniform(0, window),
            30 * MINUTE,
            runs_for=rng.uniform(90, 150),
            duration=-1,
            description=PLATFORM_REBOOT_TEXT,
        )
        for members in sets
        for index in members
    ]
    users = _user_reboots(fleet, rng, 0.005, 20 * MINUTE)
    return WavePlan(
        "rolling-reboot",
        events + users,
        description=(
            f"rolling platform reboot of {len(sets)} scale sets ({len(events):,} VMs, one event "
            f"each, announced within {window / MINUTE:g} fleet minutes, 30 minutes' notice) and "
            f"{len(users):,} user reboots meanwhile"
        ),
    )


def scale_in(fleet: Fleet, rng: random.Random, options: WaveOptions) -> WavePlan:
    window = options.window or 10 * MINUTE
    sets = _rolling_sets(fleet, rng, 0.05)
    members = [i for s in sets for i in s]
    rebooted = rng.sample(members, max(1, round(len(members) * 0.3)))
    events = []
    for index in rebooted:
        event = SimEvent(
            _event_id(rng),
            "Reboot",
            "Platform",
            (index,),
            rng.uniform(0, window),
            15 * MINUTE,
            runs_for=rng.uniform(90, 150),
            duration=-1,
            description=PLATFORM_REBOOT_TEXT,
        )
        if rng.random() < 0.5:  # scale-in takes the VM while its reboot is under way
            event.deletes[index] = rng.uniform(1, 60)
        events.append(event)
    rolled = set(members)
    in_sets = [
        i
        for vms in fleet.scale_sets.values()
        for i in vms
        if not fleet.vms[i].spot and i not in rolled
    ]
    terminated = rng.sample(in_sets, min(len(in_sets), max(1, round(len(fleet) * 0.01))))
    events += [
        SimEvent(
            _event_id(rng),
            "Terminate",
            "User",
            (index,),
            rng.uniform(0, window),
            5 * MINUTE,
            runs_for=20.0,
            duration=-1,
            description=TERMINATE_TEXT,
            evicts=True,
        )
        for index in terminated
    ]
    taken = {i for e in events for i in e.vms}
    quiet = [i for i in range(len(fleet)) if i not in taken]
    silent = rng.sample(quiet, min(len(quiet), max(1, round(len(fleet) * 0.01))))
    # Some silent agents are on VMs that events name: the event is reported by the others.
    silent += [e.vms[0] for e in events[: max(1, len(events) // 50)]]
    silences = [(rng.uniform(0, window), index) for index in silent]
    return WavePlan(
        "scale-in",
        events,
        silences,
        description=(
            f"scale-in: {len(rebooted):,} platform reboots in {len(sets)} rolling scale sets, "
            f"{sum(len(e.deletes) for e in events):,} of their VMs deleted mid-event; "
            f"{len(terminated):,} Terminate notifications (VMs deleted once started); "
            f"{len(silences):,} agents fall silent"
        ),
    )


WAVES: dict[str, Callable[[Fleet, random.Random, WaveOptions], WavePlan]] = {
    "steady": steady,
    "freeze": freeze,
    "spot-storm": spot_storm,
    "rolling-reboot": rolling_reboot,
    "scale-in": scale_in,
}


def plan(name: str, fleet: Fleet, seed: int, options: WaveOptions | None = None) -> WavePlan:
    """The wave `name` for `fleet`, the same for the same seed."""
    return WAVES[name](fleet, random.Random(f"{name}/{seed}"), options or WaveOptions())
