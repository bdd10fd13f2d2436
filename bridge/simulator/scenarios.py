"""Named maintenance scenarios, each a small function over the fleet model.

Every scenario can target chosen VMs (`vms`) or picks sensible defaults from the fleet,
accepts notice / run-time overrides in simulated seconds, and returns the EventIds it
created. Notices follow the documented minimums: Freeze and Reboot 15 min, Redeploy
10 min, Terminate 5-15 min (configurable), Preempt 30 s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from bridge.simulator.fleet import STARTED, Change, EventSpec, Fleet, Now, SimulationError
from bridge.simulator.vms import Vm

MINUTE = 60.0

# Descriptions: the live-migration and "Host server" texts are Microsoft's own; the others
# are written in the same style, since the docs do not quote them.
LIVE_MIGRATION = (
    "Virtual machine is being paused because of a memory-preserving Live Migration operation."
)
HOST_MAINTENANCE = "Host server is undergoing maintenance."
USER_REBOOT = "Virtual machine is going to be restarted as requested by authorized user."
USER_REDEPLOY = "Virtual machine is going to be redeployed as requested by authorized user."
SPOT_EVICTION = "Virtual machine is being evicted because Azure needs the capacity back."
# Azure publishes no Description for a recommendation; this one says what it means.
SPOT_REBALANCE = "The eviction risk of this Spot virtual machine has risen."
SCALE_IN = "Virtual machine is going to be deleted as requested by authorized user."
HARDWARE_FAILURE = "Virtual machine is being restarted because the host had a hardware failure."


@dataclass(frozen=True)
class ScenarioOptions:
    """Overrides for a scenario; None keeps the scenario's default. Times are simulated."""

    vms: tuple[str, ...] | None = None
    notice: float | None = None
    run_time: float | None = None
    cancel_after: float | None = None


@dataclass(frozen=True)
class Outcome:
    """What a scenario wants done: events to add, and VMs to give the 24-hour reset."""

    events: tuple[EventSpec, ...] = ()
    resets: tuple[str, ...] = ()


Builder = Callable[[Fleet, ScenarioOptions], Outcome]


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    build: Builder


def _pick(
    fleet: Fleet, opts: ScenarioOptions, count: int, want: Callable[[Vm], bool]
) -> tuple[str, ...]:
    """The VMs the caller named, else the first `count` VMs that suit the scenario."""
    if opts.vms:
        return tuple(fleet.vm(name).name for name in opts.vms)
    chosen = tuple(vm.name for vm in fleet.vms if want(vm))[:count]
    if not chosen:
        raise SimulationError("no VM in the fleet suits this scenario; name the VMs to use")
    return chosen


def _standalone_first(fleet: Fleet, opts: ScenarioOptions) -> tuple[str, ...]:
    if any(not vm.group for vm in fleet.vms):
        return _pick(fleet, opts, 1, lambda vm: not vm.group)
    return _pick(fleet, opts, 1, lambda vm: True)


def _single(event_type: str, source: str, notice: float, description: str) -> Builder:
    def build(fleet: Fleet, opts: ScenarioOptions) -> Outcome:
        spec = EventSpec(
            event_type=event_type,
            resources=_standalone_first(fleet, opts),
            notice=notice if opts.notice is None else opts.notice,
            run_time=opts.run_time,
            description=description,
            event_source=source,
        )
        return Outcome(events=(spec,))

    return build


def _live_migration(fleet: Fleet, opts: ScenarioOptions) -> Outcome:
    # Microsoft's sample shows two scale-set instances (WestNO_0, WestNO_1) in one event.
    in_scale_set = any(vm.vm_scale_set_name for vm in fleet.vms)
    resources = _pick(fleet, opts, 2, lambda vm: bool(vm.vm_scale_set_name) or not in_scale_set)
    spec = EventSpec(
        event_type="Freeze",
        resources=resources,
        notice=15 * MINUTE if opts.notice is None else opts.notice,
        run_time=opts.run_time,
        description=LIVE_MIGRATION,
        duration_in_seconds=5,
    )
    return Outcome(events=(spec,))


def _spot_preempt(fleet: Fleet, opts: ScenarioOptions) -> Outcome:
    resources = _pick(fleet, opts, 1, lambda vm: vm.priority == "Spot")
    spec = EventSpec(
        event_type="Preempt",
        resources=resources,
        notice=30.0 if opts.notice is None else opts.notice,
        run_time=opts.run_time,
        description=SPOT_EVICTION,
    )
    return Outcome(events=(spec,))


def _spot_rebalance(fleet: Fleet, opts: ScenarioOptions) -> Outcome:
    """A rebalance recommendation for one Spot VM (api-version 2024-07-09 only); no Preempt
    follows unless another scenario schedules one. Its NotBefore and run time mean nothing
    to an advisory: it stays in the document for the notice plus the run time."""
    resources = _pick(fleet, opts, 1, lambda vm: vm.priority == "Spot")
    spec = EventSpec(
        event_type="SpotRebalanceRecommendation",
        resources=resources,
        notice=15 * MINUTE if opts.notice is None else opts.notice,
        run_time=opts.run_time,
        description=SPOT_REBALANCE,
    )
    return Outcome(events=(spec,))


def _vmss_terminate(fleet: Fleet, opts: ScenarioOptions) -> Outcome:
    notice = 10 * MINUTE if opts.notice is None else opts.notice
    if not 5 * MINUTE <= notice <= 15 * MINUTE:
        raise SimulationError("Terminate notice is configurable from 300 to 900 seconds only")
    members = [vm.name for vm in fleet.vms if vm.vm_scale_set_name]
    resources = opts.vms or tuple(members[-1:])
    if not resources:
        raise SimulationError("no scale-set VM in the fleet; add a scale set or name the VM")
    spec = EventSpec(
        event_type="Terminate",
        resources=tuple(fleet.vm(name).name for name in resources),
        notice=notice,
        run_time=opts.run_time,
        description=SCALE_IN,
        event_source="User",
    )
    return Outcome(events=(spec,))


def _canceled(fleet: Fleet, opts: ScenarioOptions) -> Outcome:
    base = _single("Reboot", "Platform", 15 * MINUTE, HOST_MAINTENANCE)(fleet, opts).events[0]
    cancel_after = base.notice / 3 if opts.cancel_after is None else opts.cancel_after
    if cancel_after >= base.notice:
        raise SimulationError("cancel_after must be shorter than the notice, or the event starts")
    return Outcome(events=(replace(base, cancel_after=cancel_after),))


def _hardware_failure(fleet: Fleet, opts: ScenarioOptions) -> Outcome:
    spec = EventSpec(
        event_type="Reboot",
        resources=_standalone_first(fleet, opts),
        status=STARTED,
        notice=0.0,
        run_time=opts.run_time,
        description=HARDWARE_FAILURE,
    )
    return Outcome(events=(spec,))


def _availability_set(fleet: Fleet, opts: ScenarioOptions) -> Outcome:
    # One VM in Resources, every member of its set in the audience: each VM must check
    # its own name. Naming several VMs puts all of them in Resources.
    resources = _pick(fleet, opts, 1, lambda vm: bool(vm.availability_set))
    spec = EventSpec(
        event_type="Reboot",
        resources=resources,
        notice=15 * MINUTE if opts.notice is None else opts.notice,
        run_time=opts.run_time,
        description=HOST_MAINTENANCE,
    )
    return Outcome(events=(spec,))


def _reset_24h(fleet: Fleet, opts: ScenarioOptions) -> Outcome:
    return Outcome(resets=_pick(fleet, opts, 1, lambda vm: True))


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("live-migration", "Freeze of two VMs, 5 s, 15 min notice", _live_migration),
        Scenario(
            "user-reboot",
            "Reboot requested by the user, 15 min notice",
            _single("Reboot", "User", 15 * MINUTE, USER_REBOOT),
        ),
        Scenario(
            "platform-reboot",
            "Reboot for host maintenance, 15 min notice",
            _single("Reboot", "Platform", 15 * MINUTE, HOST_MAINTENANCE),
        ),
        Scenario(
            "redeploy",
            "Redeploy requested by the user, 10 min notice",
            _single("Redeploy", "User", 10 * MINUTE, USER_REDEPLOY),
        ),
        Scenario("spot-preempt", "Spot eviction, 30 s notice", _spot_preempt),
        Scenario(
            "spot-rebalance",
            "Spot rebalance recommendation (preview api-version 2024-07-09)",
            _spot_rebalance,
        ),
        Scenario("vmss-terminate", "Scale-set instance deleted, 10 min notice", _vmss_terminate),
        Scenario("canceled", "Reboot scheduled, then canceled before NotBefore", _canceled),
        Scenario("hardware-failure", "Reboot that appears directly as Started", _hardware_failure),
        Scenario("availability-set", "Reboot of one VM, seen by its whole set", _availability_set),
        Scenario("reset-24h", "The VM's DocumentIncarnation starts over", _reset_24h),
    )
}


def plan(name: str, fleet: Fleet, opts: ScenarioOptions | None = None) -> Outcome:
    """What scenario `name` would do to `fleet`, without doing it."""
    scenario = SCENARIOS.get(name)
    if scenario is None:
        raise SimulationError(f"unknown scenario {name!r}; choose one of: {', '.join(SCENARIOS)}")
    return scenario.build(fleet, opts or ScenarioOptions())


def apply(outcome: Outcome, fleet: Fleet, now: Now) -> tuple[list[str], list[Change]]:
    """Carry out a planned outcome; returns the new EventIds and every change made."""
    ids: list[str] = []
    changes: list[Change] = []
    for spec in outcome.events:
        event, added = fleet.add_event(spec, now)
        ids.append(event.event_id)
        changes.extend(added)
    for vm in outcome.resets:
        changes.extend(fleet.reset(vm, now))
    return ids, changes


def run(name: str, fleet: Fleet, now: Now, opts: ScenarioOptions | None = None) -> list[str]:
    """Apply scenario `name` to `fleet` at `now`; returns the EventIds it created."""
    return apply(plan(name, fleet, opts), fleet, now)[0]


def names() -> Sequence[str]:
    return tuple(SCENARIOS)
