"""The pure fleet model behind the IMDS simulator: VMs, events, their lifecycle, documents.

No I/O, no threads, no clock of its own: every call that needs the time takes `now`
(epoch seconds like `time.time()`, or an aware datetime), so tests drive it with a fake clock.

Lifecycle of an event (as IMDS shows it; there is no Completed or Canceled status):

    Scheduled --(approved, or NotBefore reached)--> Started --(run time over)--> gone (completed)
    Scheduled --(cancel)--> gone (canceled)

Durations given to the model (notice, run time, approval delay, cancel-after) are
*simulated* seconds; the model divides them by `time_scale` to get real seconds, so at
time_scale 60 a 15-minute notice is 15 real seconds and NotBefore is now + 15 s in real
wall-clock time. DurationInSeconds is a value in the document and is not scaled.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import formatdate
from typing import Any

from bridge.simulator.vms import Vm, group_members

Now = float | datetime

SCHEDULED = "Scheduled"
STARTED = "Started"

SCHEDULED_EVENTS_VERSIONS = (
    "2017-03-01",
    "2017-08-01",
    "2017-11-01",
    "2019-01-01",
    "2019-04-01",
    "2019-08-01",
    "2020-07-01",
    # Preview: adds the Spot rebalance recommendation (bridge.agent.advisory says where
    # that is known from); the documents of older versions never list one.
    "2024-07-09",
)
# The GA version: what a client that names none of the others is served by default.
LATEST_VERSION = "2020-07-01"
REBALANCE_VERSION = "2024-07-09"
# Served, never listed among the newest versions a 400 names: IMDS's docs list GA ones.
PREVIEW_VERSIONS = frozenset({REBALANCE_VERSION})
REBALANCE_TYPE = "SpotRebalanceRecommendation"

# The api-version that first returned each optional field, from the release notes in the
# Scheduled Events docs ("2019-04-01: added Event Description", "2019-08-01: EventSource",
# "2020-07-01: event duration"). ISO dates compare correctly as strings.
_FIELD_SINCE = {
    "Description": "2019-04-01",
    "EventSource": "2019-08-01",
    "DurationInSeconds": "2020-07-01",
}

# Simulated seconds from Started to Completed when the caller does not say.
DEFAULT_RUN_TIME = {"Freeze": 10.0, "Reboot": 120.0, "Redeploy": 180.0, "Preempt": 60.0}
FALLBACK_RUN_TIME = 60.0


class SimulationError(ValueError):
    """A request the model cannot honour; the message says what to do instead."""


class UnknownVmError(SimulationError):
    pass


class UnknownEventError(SimulationError):
    pass


class EventStateError(SimulationError):
    pass


def timestamp(now: Now) -> float:
    """Epoch seconds from either form of `now`; a naive datetime is taken as UTC."""
    if isinstance(now, datetime):
        aware = now if now.tzinfo else now.replace(tzinfo=timezone.utc)
        return aware.timestamp()
    return float(now)


def rfc1123(ts: float) -> str:
    return formatdate(ts, usegmt=True)


@dataclass(frozen=True)
class EventSpec:
    """What to schedule. Times are simulated seconds; None means the per-type default."""

    event_type: str
    resources: tuple[str, ...]
    audience: tuple[str, ...] | None = None  # None: every VM in the sets of `resources`
    notice: float = 900.0
    run_time: float | None = None
    status: str = SCHEDULED  # Started: appears directly as Started (hardware failure)
    description: str = ""
    event_source: str = "Platform"
    duration_in_seconds: int = -1
    resource_type: str = "VirtualMachine"
    event_id: str | None = None
    cancel_after: float | None = None  # cancel automatically this long after scheduling
    approval_delay: float | None = None  # None: the fleet's approval delay
    not_before_raw: str | None = None  # render NotBefore verbatim (e.g. a wrong weekday)
    omit_fields: tuple[str, ...] = ()  # leave these keys out of the document


@dataclass
class SimEvent:
    """A live event. All times are real epoch seconds."""

    spec: EventSpec
    event_id: str
    audience: tuple[str, ...]
    status: str
    scheduled_at: float
    not_before: float
    run_time: float
    approval_delay: float
    cancel_at: float | None = None
    approved_at: float | None = None
    approved_by: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    outcome: str | None = None  # "completed" | "canceled" once gone

    @property
    def start_due(self) -> float:
        if self.approved_at is None:
            return self.not_before
        return min(self.not_before, self.approved_at + self.approval_delay)

    def summary(self) -> dict[str, Any]:
        """The simulator's view of the event (for the control API), not the IMDS shape."""
        return {
            "eventId": self.event_id,
            "eventType": self.spec.event_type,
            "resources": list(self.spec.resources),
            "audience": list(self.audience),
            "status": self.outcome or self.status,
            "eventSource": self.spec.event_source,
            "scheduledAt": self.scheduled_at,
            "notBefore": self.not_before,
            "approvedAt": self.approved_at,
            "approvedBy": self.approved_by,
            "startedAt": self.started_at,
            "endedAt": self.ended_at,
        }


@dataclass(frozen=True)
class Change:
    """One state change in the fleet (what changed, when, who sees it), for the log."""

    kind: str  # scheduled | approved | started | completed | canceled | reset
    at: float
    vms: tuple[str, ...]
    event_id: str = ""
    event_type: str = ""
    resources: tuple[str, ...] = ()
    reason: str = ""


class Fleet:
    """The VMs, the events they see and each VM's own DocumentIncarnation."""

    def __init__(
        self,
        vms: Sequence[Vm],
        time_scale: float = 1.0,
        seed: int = 0,
        approval_delay: float = 0.0,
    ) -> None:
        if time_scale <= 0:
            raise SimulationError("time_scale must be greater than 0")
        self.vms = list(vms)
        self.time_scale = time_scale
        self.approval_delay = approval_delay  # simulated seconds from approval to Started
        self._by_name = {vm.name: vm for vm in self.vms}
        if len(self._by_name) != len(self.vms):
            raise SimulationError("VM names in a fleet must be unique")
        self._events: dict[str, SimEvent] = {}
        self._finished: list[SimEvent] = []
        self._incarnation = {vm.name: vm.initial_incarnation for vm in self.vms}
        self._resets = dict.fromkeys(self._by_name, 0)
        # Not for security: event ids only need to look real and repeat for the same seed.
        # The stream name keeps them distinct from the fleet's ids made from the same seed.
        self._rng = random.Random(f"events-{seed}")  # noqa: S311

    # -- queries -------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return [vm.name for vm in self.vms]

    def vm(self, name: str) -> Vm:
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(self._by_name)
            raise UnknownVmError(f"no VM named {name!r} in the fleet (known: {known})") from None

    def real(self, simulated_seconds: float) -> float:
        return simulated_seconds / self.time_scale

    def incarnation(self, vm: str) -> int:
        self.vm(vm)
        return self._incarnation[vm]

    def reset_generation(self, vm: str) -> int:
        """How many 24-hour resets `vm` has had; a change means "the next call is a first call"."""
        self.vm(vm)
        return self._resets[vm]

    def event(self, event_id: str) -> SimEvent:
        for ev in self._events.values():
            if ev.event_id.lower() == event_id.lower():
                return ev
        raise UnknownEventError(f"no current event with EventId {event_id!r}")

    def events(self, include_finished: bool = False) -> list[SimEvent]:
        live = list(self._events.values())
        return [*self._finished, *live] if include_finished else live

    def events_for(self, vm: str) -> list[SimEvent]:
        self.vm(vm)
        return [ev for ev in self._events.values() if vm in ev.audience]

    def audience_for(self, resources: Iterable[str]) -> tuple[str, ...]:
        """Every VM in the sets of `resources`, in fleet order (what real Azure shows them to)."""
        wanted: set[str] = set()
        for name in resources:
            wanted.update(group_members(self.vms, self.vm(name)))
        return tuple(name for name in self.names if name in wanted)

    # -- changes -------------------------------------------------------------------------

    def add_event(self, spec: EventSpec, now: Now) -> tuple[SimEvent, list[Change]]:
        """Schedule (or directly start) an event; every VM in its audience sees it."""
        ts = timestamp(now)
        ev = self._new_event(spec, ts)
        self._events[ev.event_id] = ev
        self._bump(ev.audience)
        if ev.status == STARTED:
            return ev, [self._change("started", ev, ts, "appeared directly as Started")]
        return ev, [self._change("scheduled", ev, ts, "")]

    def _new_event(self, spec: EventSpec, ts: float) -> SimEvent:
        if spec.status not in (SCHEDULED, STARTED):
            raise SimulationError(f"EventStatus must be Scheduled or Started, not {spec.status!r}")
        for name in spec.resources:
            self.vm(name)
        audience = self._audience(spec)
        event_id = spec.event_id or self._new_event_id()
        if any(ev.event_id.lower() == event_id.lower() for ev in self._events.values()):
            raise SimulationError(f"an event with EventId {event_id} is already present")
        run_time = spec.run_time if spec.run_time is not None else _default_run_time(spec)
        delay = self.approval_delay if spec.approval_delay is None else spec.approval_delay
        started = spec.status == STARTED
        return SimEvent(
            spec=spec,
            event_id=event_id,
            audience=audience,
            status=spec.status,
            scheduled_at=ts,
            not_before=ts + self.real(max(spec.notice, 0.0)),
            run_time=self.real(run_time),
            approval_delay=self.real(delay),
            cancel_at=None if spec.cancel_after is None else ts + self.real(spec.cancel_after),
            started_at=ts if started else None,
        )

    def _audience(self, spec: EventSpec) -> tuple[str, ...]:
        if spec.audience is None:
            audience = self.audience_for(spec.resources)
        else:
            audience = tuple(self.vm(name).name for name in spec.audience)
        if not audience:
            raise SimulationError("the event has no Resources and no audience: no VM would see it")
        return audience

    def _new_event_id(self) -> str:
        event_id = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        # Real documents carry both cases (the docs show C7061BAC-... and f020ba2e-...).
        return event_id.upper() if self._rng.random() < 0.5 else event_id

    def approve(
        self, vm: str, event_ids: Sequence[str], now: Now, by: str | None = None
    ) -> list[Change]:
        """Apply a StartRequests POST from `vm` (or an approval `by` ARM's acknowledge, for
        events `vm` sees). Unknown ids raise before anything changes."""
        ts = timestamp(now)
        self.vm(vm)
        known = {ev.event_id.lower(): ev for ev in self.events_for(vm)}
        for event_id in event_ids:
            if event_id.lower() not in known:
                raise UnknownEventError(f"EventId {event_id!r} is not in the document of {vm}")
        changes: list[Change] = []
        for event_id in event_ids:
            ev = known[event_id.lower()]
            if ev.status != SCHEDULED or ev.approved_at is not None:
                continue  # approving twice is allowed and changes nothing
            if ev.spec.event_type == REBALANCE_TYPE:
                continue  # "acknowledging them has no effect" (an advisory)
            ev.approved_at, ev.approved_by = ts, by or vm
            delay = f"; it starts in {ev.approval_delay:.1f} s" if ev.approval_delay > 0 else ""
            changes.append(self._change("approved", ev, ts, f"by {by or vm}{delay}"))
        return changes + self.advance(ts)

    def start(self, event_id: str, now: Now) -> list[Change]:
        """Start a Scheduled event now, as if the platform had decided to go."""
        ev = self._require(event_id, SCHEDULED, "start")
        return [self._start(ev, timestamp(now), "started by the control API")]

    def cancel(self, event_id: str, now: Now) -> list[Change]:
        """Remove a Scheduled event before it started: it never happens."""
        ev = self._require(event_id, SCHEDULED, "cancel")
        return [self._end(ev, timestamp(now), "canceled", "canceled by the control API")]

    def complete(self, event_id: str, now: Now) -> list[Change]:
        """Finish a Started event now: it disappears from every document."""
        ev = self._require(event_id, STARTED, "complete")
        return [self._end(ev, timestamp(now), "completed", "completed by the control API")]

    def _require(self, event_id: str, status: str, verb: str) -> SimEvent:
        ev = self.event(event_id)
        if ev.status != status:
            msg = f"cannot {verb} event {ev.event_id}: it is {ev.status}, not {status}"
            raise EventStateError(msg)
        return ev

    def advance(self, now: Now) -> list[Change]:
        """Apply every transition that is due at `now`, each at the time it fell due."""
        ts = timestamp(now)
        changes: list[Change] = []
        for ev in list(self._events.values()):
            cancel_at = ev.cancel_at
            scheduled = ev.status == SCHEDULED
            if scheduled and cancel_at is not None and cancel_at <= min(ts, ev.start_due):
                changes.append(self._end(ev, cancel_at, "canceled", "canceled by the platform"))
                continue
            if ev.status == SCHEDULED and ts >= ev.start_due:
                approved = ev.approved_at is not None and ev.start_due < ev.not_before
                reason = f"approved by {ev.approved_by}" if approved else "NotBefore reached"
                changes.append(self._start(ev, ev.start_due, reason))
            if ev.status == STARTED and ev.started_at is not None:
                end = ev.started_at + ev.run_time
                if ts >= end:
                    changes.append(self._end(ev, end, "completed", "run time over"))
        return changes

    def reset(self, vm: str, now: Now, restart_at: int = 1) -> list[Change]:
        """The 24-hour switch-off: the VM's DocumentIncarnation starts over at `restart_at`."""
        self.vm(vm)
        self._incarnation[vm] = restart_at
        self._resets[vm] += 1
        reason = f"DocumentIncarnation restarts at {restart_at}"
        return [Change("reset", timestamp(now), (vm,), reason=reason)]

    def _start(self, ev: SimEvent, at: float, reason: str) -> Change:
        ev.status, ev.started_at = STARTED, at
        self._bump(ev.audience)
        return self._change("started", ev, at, reason)

    def _end(self, ev: SimEvent, at: float, outcome: str, reason: str) -> Change:
        del self._events[ev.event_id]
        ev.outcome, ev.ended_at = outcome, at
        self._finished.append(ev)
        self._bump(ev.audience)
        return self._change(outcome, ev, at, reason)

    def _bump(self, vms: Iterable[str]) -> None:
        for name in vms:
            self._incarnation[name] += 1

    @staticmethod
    def _change(kind: str, ev: SimEvent, at: float, reason: str) -> Change:
        spec = ev.spec
        return Change(kind, at, ev.audience, ev.event_id, spec.event_type, spec.resources, reason)

    # -- documents -----------------------------------------------------------------------

    def document(self, vm: str, api_version: str = LATEST_VERSION) -> dict[str, Any]:
        """The Scheduled Events document `vm` sees now, in the shape of `api_version`.

        Real sample (Microsoft's live-migration example, api-version 2020-07-01):

            {
                "DocumentIncarnation":  2,
                "Events":  [
                    {
                        "EventId":  "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
                        "EventStatus":  "Scheduled",
                        "EventType":  "Freeze",
                        "ResourceType":  "VirtualMachine",
                        "Resources":  ["WestNO_0", "WestNO_1"],
                        "NotBefore":  "Mon, 11 Apr 2022 22:26:58 GMT",
                        "Description":  "Virtual machine is being paused because of a
                                         memory-preserving Live Migration operation.",
                        "EventSource":  "Platform",
                        "DurationInSeconds":  5
                    }
                ]
            }
        """
        events = [
            render_event(ev, api_version)
            for ev in self.events_for(vm)
            if api_version >= REBALANCE_VERSION or ev.spec.event_type != REBALANCE_TYPE
        ]
        return {"DocumentIncarnation": self._incarnation[vm], "Events": events}


def render_event(ev: SimEvent, api_version: str = LATEST_VERSION) -> dict[str, Any]:
    """One event in the key order and shape IMDS uses for `api_version`."""
    spec = ev.spec
    preview = api_version == "2017-03-01"
    # 2017-08-01 "removed the leading underscore from IaaS VM resource names"; the 2017-03-01
    # docs also show NotBefore in ISO 8601 rather than RFC 1123.
    resources = [f"_{name}" for name in spec.resources] if preview else list(spec.resources)
    rendered: dict[str, Any] = {
        "EventId": ev.event_id,
        "EventStatus": ev.status,
        "EventType": spec.event_type,
        "ResourceType": spec.resource_type,
        "Resources": resources,
        "NotBefore": _not_before(ev, preview),
        "Description": spec.description,
        "EventSource": spec.event_source,
        "DurationInSeconds": spec.duration_in_seconds,
    }
    for key, since in _FIELD_SINCE.items():
        if api_version < since:
            del rendered[key]
    for key in spec.omit_fields:
        rendered.pop(key, None)
    return rendered


def _not_before(ev: SimEvent, iso: bool) -> str:
    if ev.status == STARTED:
        return ""
    if ev.spec.not_before_raw is not None:
        return ev.spec.not_before_raw
    if iso:
        moment = datetime.fromtimestamp(int(ev.not_before), timezone.utc)
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    return rfc1123(ev.not_before)


def _default_run_time(spec: EventSpec) -> float:
    if spec.event_type in DEFAULT_RUN_TIME:
        return DEFAULT_RUN_TIME[spec.event_type]
    return max(float(spec.duration_in_seconds), FALLBACK_RUN_TIME)
