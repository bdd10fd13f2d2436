"""Event Grid deliveries as Azure sends them (the shapes of tests/data/eventgrid), for tests of
the consumer's second source (issue 36)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from typing import Any

from bridge.records import iso
from tests.support.fleetrecords import SUBSCRIPTION

SCHEDULED = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"
HEALTH = "Microsoft.ResourceNotifications.HealthResources.AvailabilityStatusChanged"


def compute_id(resource_group: str, kind: str, name: str, sub: str = SUBSCRIPTION) -> str:
    group = f"/subscriptions/{sub}/resourceGroups/{resource_group}"
    return f"{group}/providers/Microsoft.Compute/{kind}/{name}"


def scheduled(
    event_id: str,
    status: str,
    resources: list[str],
    at: datetime,
    *,
    scale_set: str | None = "web",
    resource_group: str = "rg-app",
    event_type: str = "Reboot",
    source: str = "Platform",
    not_before: datetime | None = None,
    subscription: str = SUBSCRIPTION,
    topic: str | None = None,
) -> str:
    """A scheduled-events delivery (Event Grid schema) of an event of a scale set (or, with
    `scale_set` None, of the VM named first in `resources`)."""
    parent = (
        compute_id(resource_group, "virtualMachineScaleSets", scale_set, subscription)
        if scale_set
        else compute_id(resource_group, "virtualMachines", resources[0], subscription)
    )
    nb = not_before or at + timedelta(minutes=15)
    resource_id = f"{parent}/providers/microsoft.maintenance/scheduledevents/{event_id}"
    delivery: dict[str, Any] = {
        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{event_id}|{status}|{iso(at)}")),
        "topic": topic or f"/subscriptions/{subscription}",
        "subject": resource_id,
        "data": {
            "resourceInfo": {
                "id": resource_id,
                "name": event_id,
                "type": "microsoft.maintenance/scheduledEvents",
                "location": "westeurope",
                "properties": {
                    "DurationInSeconds": -1,
                    "Description": "test event",
                    "EventId": event_id,
                    "EventSource": source,
                    "EventStatus": status,
                    "EventType": event_type,
                    "NotBefore": nb.strftime("%a, %d %b %Y %H:%M:%S GMT")
                    if status == "Scheduled"
                    else "",
                    "Resources": resources,
                    "ResourceType": "VirtualMachine",
                    "ScheduledEventApiVersion": "2020-07-01",
                },
            },
            "apiVersion": "2024-07-01",
        },
        "eventType": SCHEDULED,
        "dataVersion": "3.0",
        "metadataVersion": "1",
        "eventTime": iso(at),
    }
    return json.dumps(delivery)


def health(
    name: str,
    state: str,
    at: datetime,
    *,
    scale_set: str | None = "web",
    resource_group: str = "rg-app",
    subscription: str = SUBSCRIPTION,
) -> str:
    """A resource-health delivery (CloudEvents) of VM `name` (a uniform scale set's
    instance `scale_set`_N when `scale_set` is given)."""
    if scale_set:
        instance = name.rpartition("_")[2]
        target = compute_id(
            resource_group,
            "virtualMachineScaleSets",
            f"{scale_set}/virtualMachines/{instance}",
            subscription,
        )
    else:
        target = compute_id(resource_group, "virtualMachines", name, subscription)
    delivery = {
        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{name}|{state}|{iso(at)}")),
        "source": f"/subscriptions/{subscription}",
        "subject": target,
        "data": {
            "resourceInfo": {
                "id": f"{target}/providers/Microsoft.ResourceHealth/availabilityStatuses/current",
                "name": "current",
                "type": "Microsoft.ResourceHealth/availabilityStatuses",
                "properties": {
                    "targetResourceId": target,
                    "targetResourceType": "Microsoft.Compute/virtualMachines",
                    "occurredTime": iso(at),
                    "previousAvailabilityState": "Available",
                    "availabilityState": state,
                },
            },
            "operationalInfo": {"resourceEventTime": iso(at)},
            "apiVersion": "2023-12-01",
        },
        "type": HEALTH,
        "specversion": "1.0",
        "time": iso(at),
    }
    return json.dumps(delivery)


def configuration_id(name: str = "tuesday", resource_group: str = "rg-patch") -> str:
    """A maintenance configuration's id (the topic of its pre- and post-maintenance events)."""
    return (
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{resource_group}/providers/"
        f"Microsoft.Maintenance/maintenanceConfigurations/{name}"
    )


def maintenance(
    kind: str,
    start: datetime,
    at: datetime,
    *,
    configuration: str | None = None,
    window: timedelta = timedelta(hours=3),
    cutoff_before: timedelta = timedelta(minutes=10),
) -> str:
    """Update Manager's pre- or post-maintenance delivery (`kind` "pre" or "post") of the run
    starting at `start`, sent at `at` (the shape of tests/data/patchruns)."""
    config = configuration or configuration_id()
    run = f"{config}/providers/microsoft.maintenance/applyupdates/{start:%Y%m%d%H%M%S}"
    data: dict[str, Any] = {
        "correlationId": run,
        "maintenanceConfigurationId": config,
        "startDateTime": iso(start),
        "endDateTime": iso(start + window),
        "resourceSubscriptionIds": [SUBSCRIPTION],
    }
    if kind == "pre":
        data["cancellationCutOffDateTime"] = iso(start - cutoff_before)
    else:
        data["status"] = "Succeeded"
    return json.dumps(
        [
            {
                "id": run,
                "topic": config,
                "subject": config.rpartition("/")[2],
                "data": data,
                "eventType": f"Microsoft.Maintenance.{'Pre' if kind == 'pre' else 'Post'}"
                "MaintenanceEvent",
                "eventTime": iso(at),
                "dataVersion": "1.0",
                "metadataVersion": "1",
            }
        ]
    )
