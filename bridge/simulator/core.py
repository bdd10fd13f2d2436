"""The simulator's state: the fleet behind a lock, approvals received, request counters.

`Simulator` is the in-process API; bridge.simulator.server puts it on HTTP and
bridge.simulator.command is the public entry point (re-exports and `se-bridge simulate`).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from bridge.simulator import scenarios
from bridge.simulator.faults import FaultPlan
from bridge.simulator.fleet import (
    LATEST_VERSION,
    Change,
    EventSpec,
    Fleet,
    UnknownEventError,
    rfc1123,
)

logger = logging.getLogger("bridge.simulator")

TOKEN_LIFETIME = 86399  # managed identity tokens live about a day


@dataclass(frozen=True)
class Approval:
    """One EventId in a StartRequests POST, as received (event_id is None if unreadable), or
    in ARM's acknowledge (`via` "ARM", `vm` the first VM of the event's Resources)."""

    vm: str
    event_id: str | None
    at: float
    status: int
    event_status: str | None = None  # the event's status right after the POST
    via: str = "IMDS"

    def to_json(self) -> dict[str, Any]:
        return {
            "vm": self.vm,
            "eventId": self.event_id,
            "time": datetime.fromtimestamp(self.at, timezone.utc).isoformat(),
            "timestamp": self.at,
            "status": self.status,
            "eventStatus": self.event_status,
            "via": self.via,
        }


class Simulator:
    """The fleet behind a lock, plus what IMDS records: approvals, request counters, faults.

    Every method is safe to call from any thread and applies due transitions first.
    """

    def __init__(
        self,
        fleet: Fleet,
        faults: FaultPlan | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.fleet = fleet
        self.faults = faults or FaultPlan()
        self._clock = clock
        self._lock = threading.RLock()
        self._approvals: list[Approval] = []
        self._counters: dict[str, Counter[str]] = {name: Counter() for name in fleet.names}
        self._served_generation: dict[str, int] = {}
        # The access tokens issued, and for which resource: what a test double of a service
        # checks a bearer token against (ARM's acknowledge, bridge.simulator.arm).
        self.issued: dict[str, str] = {}
        # api-versions this IMDS refuses as unsupported (a 400, as for an unknown one): a
        # region or subscription without a preview, such as 2024-07-09 without SpotPlus.
        self.unserved_versions: set[str] = set()
        # Told every change, under the simulator's lock (the Event Grid double, issue 36).
        self.observers: list[Callable[[Sequence[Change]], None]] = []

    @property
    def vm_names(self) -> list[str]:
        return self.fleet.names

    def now(self) -> float:
        return self._clock()

    def tick(self) -> list[Change]:
        """Apply every transition that is due now (the server calls this several times a second)."""
        with self._lock:
            changes = self.fleet.advance(self.now())
            self._log(changes)
            return changes

    # -- what a VM reads -----------------------------------------------------------------

    def document(self, vm: str, api_version: str = LATEST_VERSION) -> dict[str, Any]:
        with self._lock:
            self.tick()
            return self.fleet.document(vm, api_version)

    def instance_metadata(self, vm: str) -> dict[str, Any]:
        return self.fleet.vm(vm).instance_metadata()

    def token(self, vm: str, resource: str, client_id: str | None = None) -> dict[str, str]:
        """A managed identity token response shaped like IMDS's (all values are strings)."""
        now = int(self.now())
        token = secrets.token_urlsafe(48)
        with self._lock:
            self.issued[token] = resource
        return {
            "access_token": token,
            "client_id": client_id or self.fleet.vm(vm).client_id,
            "expires_in": str(TOKEN_LIFETIME),
            "expires_on": str(now + TOKEN_LIFETIME),
            "ext_expires_in": str(TOKEN_LIFETIME),
            "not_before": str(now),
            "resource": resource,
            "token_type": "Bearer",
        }

    def first_call(self, vm: str) -> bool:
        """True once after start and after each 24-hour reset: that call is the slow one."""
        with self._lock:
            generation = self.fleet.reset_generation(vm)
            first = self._served_generation.get(vm) != generation
            self._served_generation[vm] = generation
            return first

    # -- approvals -----------------------------------------------------------------------

    def approve(self, vm: str, event_ids: Sequence[str]) -> None:
        """Act as `vm` POSTing StartRequests; records it like the HTTP endpoint does."""
        try:
            self.apply_approval(vm, event_ids)
        except UnknownEventError:
            self.record_approvals(vm, event_ids, 400)
            raise
        self.record_approvals(vm, event_ids, 200)

    def apply_approval(self, vm: str, event_ids: Sequence[str]) -> None:
        """Apply a StartRequests POST without recording it (the HTTP layer records)."""
        with self._lock:
            self.tick()
            self._log(self.fleet.approve(vm, event_ids, self.now()))

    def acknowledge(self, scope: str, event_id: str) -> bool:
        """ARM's acknowledge of `event_id` at the compute resource `scope` (a scale set,
        availability set or VM id; bridge.simulator.arm): approves the event as a StartRequests
        POST of its VMs does, and records it. False, and nothing changes, when no current event
        of that id is kept under `scope` (it never was, or it is over)."""
        with self._lock:
            self.tick()
            try:
                event = self.fleet.event(event_id)
            except UnknownEventError:
                return False
            if not event.spec.resources:
                return False
            vm = self.fleet.vm(event.spec.resources[0])
            if vm.events_scope.lower() != scope.lower():
                return False
            self._log(self.fleet.approve(vm.name, [event.event_id], self.now(), by="ARM"))
            approval = Approval(vm.name, event.event_id, self.now(), 200, event.status, "ARM")
            self._approvals.append(approval)
            logger.info(
                "Approval received through ARM's acknowledge for event %s (%s's "
                "scheduled events): event is %s.",
                event.event_id,
                scope,
                event.status,
            )
            return True

    def record_approvals(self, vm: str, event_ids: Sequence[str] | None, status: int) -> None:
        with self._lock:
            at = self.now()
            ids: Sequence[str | None] = list(event_ids) if event_ids else [None]
            for event_id in ids:
                approval = Approval(vm, event_id, at, status, self._status_of(event_id))
                self._approvals.append(approval)
                self._log_approval(approval)

    def _status_of(self, event_id: str | None) -> str | None:
        if event_id is None:
            return None
        try:
            return self.fleet.event(event_id).status
        except UnknownEventError:
            return None

    def approvals(self) -> list[Approval]:
        with self._lock:
            return list(self._approvals)

    # -- control -------------------------------------------------------------------------

    def run_scenario(
        self,
        name: str,
        vms: Sequence[str] | None = None,
        notice: float | None = None,
        run_time: float | None = None,
        cancel_after: float | None = None,
    ) -> list[str]:
        """Run a named scenario (bridge.simulator.scenarios); returns the EventIds it created."""
        opts = scenarios.ScenarioOptions(
            vms=tuple(vms) if vms else None,
            notice=notice,
            run_time=run_time,
            cancel_after=cancel_after,
        )
        with self._lock:
            self.tick()
            outcome = scenarios.plan(name, self.fleet, opts)
            ids, changes = scenarios.apply(outcome, self.fleet, self.now())
            self._log(changes)
            return ids

    def add_event(self, spec: EventSpec) -> str:
        with self._lock:
            self.tick()
            event, changes = self.fleet.add_event(spec, self.now())
            self._log(changes)
            return event.event_id

    def start_event(self, event_id: str) -> None:
        self._control(self.fleet.start, event_id)

    def cancel_event(self, event_id: str) -> None:
        self._control(self.fleet.cancel, event_id)

    def complete_event(self, event_id: str) -> None:
        self._control(self.fleet.complete, event_id)

    def _control(self, action: Callable[[str, float], list[Change]], event_id: str) -> None:
        with self._lock:
            self.tick()
            self._log(action(event_id, self.now()))

    def reset_vm(self, vm: str, restart_at: int = 1) -> int:
        """The 24-hour switch-off for `vm`; returns its new DocumentIncarnation."""
        with self._lock:
            self._log(self.fleet.reset(vm, self.now(), restart_at))
            return self.fleet.incarnation(vm)

    def events(self, include_finished: bool = True) -> list[dict[str, Any]]:
        with self._lock:
            self.tick()
            return [ev.summary() for ev in self.fleet.events(include_finished)]

    def set_faults(self, changes: Mapping[str, Any], vm: str | None = None) -> dict[str, Any]:
        if vm is not None:
            self.fleet.vm(vm)
        self.faults.set(changes, vm)
        return self.faults.snapshot()

    def clear_faults(self, vm: str | None = None) -> None:
        self.faults.clear(vm)

    # -- counters ------------------------------------------------------------------------

    def record_request(
        self, vm: str, method: str, endpoint: str, status: int, version: str | None = None
    ) -> None:
        with self._lock:
            counter = self._counters[vm]
            counter[method] += 1
            counter[f"{method} {endpoint}"] += 1
            counter[f"status {status}"] += 1
            if version is not None:
                counter[f"{method} {endpoint} {version}"] += 1

    def counters(self) -> dict[str, dict[str, int]]:
        """Per VM: "GET", "POST", "GET scheduledevents", "GET scheduledevents 2020-07-01"
        (by api-version), "status 200", ... (absent = 0)."""
        with self._lock:
            return {vm: dict(counter) for vm, counter in self._counters.items()}

    def reset_counters(self) -> None:
        with self._lock:
            for counter in self._counters.values():
                counter.clear()

    # -- logging -------------------------------------------------------------------------

    def _log(self, changes: Sequence[Change]) -> None:
        for change in changes:
            logger.info("%s", self._describe(change))
        if changes:
            for observer in list(self.observers):
                observer(changes)

    def _describe(self, change: Change) -> str:
        what = f"Event {change.event_id} ({change.event_type}) for {', '.join(change.resources)}"
        if change.kind == "scheduled":
            not_before = self._not_before(change.event_id)
            wait = max(not_before - self.now(), 0.0)
            return (
                f"{what} scheduled; {len(change.vms)} VM(s) see it; it starts at NotBefore "
                f"{rfc1123(not_before)} (in {wait:.1f} s) unless a VM approves it sooner."
            )
        if change.kind == "started":
            return f"{what} started ({change.reason}); the VMs are being impacted now."
        if change.kind in ("completed", "canceled"):
            return (
                f"{what} {change.kind} ({change.reason}) and was removed from the documents "
                f"of {', '.join(change.vms)}."
            )
        if change.kind == "approved":
            return f"{what} approved {change.reason}."
        return f"VM {change.vms[0]}: Scheduled Events was switched off for 24 h; {change.reason}."

    def _not_before(self, event_id: str) -> float:
        for ev in self.fleet.events(include_finished=True):
            if ev.event_id == event_id:
                return ev.not_before
        return self.now()

    def _log_approval(self, approval: Approval) -> None:
        if approval.status == 200:
            logger.info(
                "Approval received from %s for event %s: HTTP 200, event is %s.",
                approval.vm,
                approval.event_id,
                approval.event_status or "gone",
            )
        else:
            logger.info(
                "Approval from %s for event %s was rejected with HTTP %d; check that the "
                "agent sends a well-formed StartRequests body for an event in its own document.",
                approval.vm,
                approval.event_id,
                approval.status,
            )


def vm_path(name: str) -> str:
    """The path prefix that serves `name`'s IMDS on the main port."""
    return f"/vm/{quote(name, safe='')}"
