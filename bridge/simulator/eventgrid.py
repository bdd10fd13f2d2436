"""Azure's side of the second source for the simulator (issue 36, item 5): the scheduled-events
and resource-health system topics, delivering the simulated fleet's events into a local hub
(bridge.localhub) as their event subscription delivers into an event hub, with the faults
Event Grid documents: delay, duplicates, reordering and loss.

Every change of an event the simulator makes (scheduled, started, completed, canceled) becomes
the delivery Azure sends for it, in the Event Grid schema of Microsoft's sample (see
bridge.consumer.sources.eventgrid for the sample itself): the resource id of the event's scale
set, availability set or VM, `resourceInfo.properties` with the IMDS fields and the statuses
IMDS never shows (Completed, Canceled), no DocumentIncarnation. `health(vm, state)` sends a VM's
availability change (CloudEvents, as the health topic's sample). Event Grid promises no order
and delivers at least once: the partition key of each message is its own delivery id, so the
consumer sees no order either.

    grid = EventGridDouble(sim, hub_dir, GridFaults(delay=0.5, duplicate=0.2, loss=0.0))
    grid.start()       # watches `sim`, delivers on its own thread
    grid.health("web_2", "Unavailable")
    grid.stop()

A lost delivery is never sent (`counts["lost"]`): the Resource Graph reconciler is what
catches it in production.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import random
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bridge.localhub import LocalHub
from bridge.simulator.core import Simulator
from bridge.simulator.fleet import Change, SimEvent, rfc1123
from bridge.simulator.vms import Vm

log = logging.getLogger(__name__)

SCHEDULED_TYPE = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"
HEALTH_TYPE = "Microsoft.ResourceNotifications.HealthResources.AvailabilityStatusChanged"
_STATUS = {
    "scheduled": "Scheduled",
    "started": "Started",
    "completed": "Completed",
    "canceled": "Canceled",
}
HEALTH_STATES = ("Available", "Unavailable", "Degraded", "Unknown")


@dataclass(frozen=True)
class GridFaults:
    """How Event Grid misbehaves: `delay` seconds before each delivery (real seconds, up to
    twice that with jitter), the chance that a delivery comes twice (`duplicate`), comes
    after the next ones (`reorder`, held back a further `reorder_by` seconds), or never
    (`loss`)."""

    delay: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    reorder_by: float = 2.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        for name in ("duplicate", "reorder", "loss"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"Event Grid fault {name} is a chance from 0 to 1")
        if self.delay < 0 or self.reorder_by < 0:
            raise ValueError("Event Grid's delay and reorder_by are seconds, not negative")


def scheduled_delivery(vm: Vm, event: SimEvent, status: str, at: float) -> dict[str, Any]:
    """The delivery Azure sends when `event` (of `vm`'s set) becomes `status` at `at`."""
    resource = f"{vm.events_scope}/providers/microsoft.maintenance/scheduledevents/{event.event_id}"
    spec = event.spec
    return {
        "id": str(uuid.uuid4()),
        "topic": f"/subscriptions/{vm.subscription_id}",
        "subject": resource,
        "data": {
            "resourceInfo": {
                "id": resource,
                "name": event.event_id,
                "type": "microsoft.maintenance/scheduledEvents",
                "location": vm.location,
                "properties": {
                    "DurationInSeconds": spec.duration_in_seconds,
                    "Description": spec.description,
                    "EventId": event.event_id,
                    "EventSource": spec.event_source,
                    "EventStatus": status,
                    "EventType": spec.event_type,
                    "NotBefore": rfc1123(event.not_before) if status == "Scheduled" else "",
                    "Resources": list(spec.resources),
                    "ResourceType": spec.resource_type,
                    "ScheduledEventApiVersion": "2020-07-01",
                },
            },
            "apiVersion": "2024-07-01",
        },
        "eventType": SCHEDULED_TYPE,
        "dataVersion": "3.0",
        "metadataVersion": "1",
        "eventTime": _time(at),
    }


def health_delivery(vm: Vm, state: str, was: str, at: float) -> dict[str, Any]:
    """The delivery Azure sends when `vm`'s availability goes from `was` to `state`."""
    return {
        "id": str(uuid.uuid4()),
        "source": f"/subscriptions/{vm.subscription_id}",
        "subject": vm.resource_id,
        "data": {
            "resourceInfo": {
                "id": f"{vm.resource_id}/providers/Microsoft.ResourceHealth/"
                "availabilityStatuses/current",
                "name": "current",
                "type": "Microsoft.ResourceHealth/availabilityStatuses",
                "properties": {
                    "targetResourceId": vm.resource_id,
                    "targetResourceType": "Microsoft.Compute/virtualMachines",
                    "occurredTime": _time(at),
                    "previousAvailabilityState": was,
                    "availabilityState": state,
                },
            },
            "operationalInfo": {"resourceEventTime": _time(at)},
            "apiVersion": "2023-12-01",
        },
        "type": HEALTH_TYPE,
        "specversion": "1.0",
        "time": _time(at),
    }


def _time(at: float) -> str:
    """Event Grid's own form: seven decimals and a Z."""
    moment = datetime.fromtimestamp(at, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}0Z"


class EventGridDouble:
    """The system topics of `sim`'s fleet, delivering into the local hub `hub_dir`."""

    def __init__(
        self,
        sim: Simulator,
        hub_dir: Path | str,
        faults: GridFaults | None = None,
        *,
        seed: int = 0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.sim, self.faults = sim, faults or GridFaults()
        self.hub_dir = Path(hub_dir)
        self._clock = clock or sim.now
        self._rng = random.Random(seed)  # noqa: S311 - faults drawn reproducibly, not secrets
        self._lock = threading.Lock()
        self._queue: list[tuple[float, int, str]] = []  # (due, order, body)
        self._order = itertools.count()
        self._health: dict[str, str] = {}
        self.counts: Counter[str] = Counter()  # sent, lost, duplicated, reordered
        self.sent: list[dict[str, Any]] = []  # what reached the hub, in order
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        sim.observers.append(self.observe)

    def observe(self, changes: Sequence[Change]) -> None:
        """Queue the deliveries of the simulator's `changes` (its observer)."""
        for change in changes:
            status = _STATUS.get(change.kind)
            if status is None or not change.resources:
                continue
            event = next(
                (
                    e
                    for e in self.sim.fleet.events(include_finished=True)
                    if e.event_id == change.event_id
                ),
                None,
            )
            if event is None:
                continue
            vm = self.sim.fleet.vm(change.resources[0])
            self._queue_one(scheduled_delivery(vm, event, status, change.at))

    def health(self, vm_name: str, state: str) -> None:
        """`vm_name`'s availability changes to `state` now (Azure's resource health)."""
        if state not in HEALTH_STATES:
            raise ValueError(f"availability state {state!r} is none of {HEALTH_STATES}")
        vm = self.sim.fleet.vm(vm_name)
        with self._lock:
            was = self._health.get(vm_name, "Available")
            self._health[vm_name] = state
        self._queue_one(health_delivery(vm, state, was, self._clock()))

    def _queue_one(self, delivery: dict[str, Any]) -> None:
        faults, rng = self.faults, self._rng
        body = json.dumps(delivery)
        with self._lock:
            if rng.random() < faults.loss:
                self.counts["lost"] += 1
                return
            copies = 2 if rng.random() < faults.duplicate else 1
            self.counts["duplicated"] += copies - 1
            for _ in range(copies):
                due = self._clock() + faults.delay * (1 + rng.random())
                if rng.random() < faults.reorder:
                    due += faults.reorder_by
                    self.counts["reordered"] += 1
                heapq.heappush(self._queue, (due, next(self._order), body))

    def pump(self) -> int:
        """Deliver what is due now: how many messages reached the hub."""
        now = self._clock()
        due: list[str] = []
        with self._lock:
            while self._queue and self._queue[0][0] <= now:
                due.append(heapq.heappop(self._queue)[2])
        if not due:
            return 0
        with LocalHub(self.hub_dir) as hub:
            hub.append([(str(uuid.uuid4()), body) for body in due])
        with self._lock:
            self.counts["sent"] += len(due)
            self.sent += [json.loads(body) for body in due]
        return len(due)

    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def start(self, interval: float = 0.05) -> EventGridDouble:
        self._thread = threading.Thread(
            target=self._run, args=(interval,), name="event grid double", daemon=True
        )
        self._thread.start()
        return self

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.pump()
            except Exception:  # a hub that cannot be written: tried again next round
                log.exception("the Event Grid double could not deliver to %s", self.hub_dir)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.observe in self.sim.observers:
            self.sim.observers.remove(self.observe)
