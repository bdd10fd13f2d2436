"""Azure's own view of the fleet (preview): Event Grid deliveries of the scheduled-events and
resource-health system topics, read from an event hub, as the consumer's records.

The consumer's second source beside its agents (docs/second-source.md). This module is
pure: a message body in, the Event records and health changes it holds out, with each part
it refused or left aside and why. Nothing here trusts a delivery: Event Hubs authenticates
who may send to the hub, not what a sender claims, so every delivery is checked against
the topics and the scope the consumer was told to trust (`Trust`), and what fails is
refused (counted and logged by the caller) before it can reach the fleet state. A refused
delivery never changes an event, so it can never free a budget slot.

What Azure sends and what is made of it:

- Scheduled events (system topic type Microsoft.ResourceNotifications.MaintenanceResources).
  The docs' own sample names the event type
  `Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted` while their
  field table says every scheduled event has `microsoft.maintenance/scheduledevents/write`:
  both are taken. The IMDS fields are under `data.resourceInfo.properties`, whose keys are
  read without regard to case (the page spells `resources` both ways). Statuses add
  `Completed` and `Canceled`; there is no DocumentIncarnation. The same topic carries
  AKS's own scheduled events (`resourceInfo.type`
  Microsoft.ContainerService/managedClusters/scheduledEvents, camelCase fields): left
  aside, not refused. Duplicates are documented (same payload, same `id`): they make the
  same RecordId, which the consumer folds once.
- Resource health (Microsoft.ResourceNotifications.HealthResources):
  `AvailabilityStatusChanged` of a VM or a scale set's VM becomes a `HealthChange`;
  `ResourceAnnotated` (why a VM's availability changed, no state) and a whole scale set's
  status (no VM named) are left aside.

Both come in the Event Grid schema or as CloudEvents 1.0 (the event subscription chooses),
one event or an array of them per message.

A real delivery of a scheduled event (the Event Grid schema; from Microsoft's page
scheduled-events-event-grid.md, 2026-05-01; its NotBefore has a wrong weekday):

    {"id": "3da1b9aa-5204-4335-8c33-c54e315dcffe",
     "topic": "/subscriptions/{subscription-id}",
     "subject": "/subscriptions/{subscription-id}/resourceGroups/{rg-name}/providers/
                 Microsoft.Compute/virtualMachineScaleSets/{vmss-name}/providers/
                 microsoft.maintenance/scheduledevents/{event-id}",
     "data": {"resourceInfo": {
                "id": "<the subject>", "name": "{event-id}",
                "type": "microsoft.maintenance/scheduledEvents", "location": "eastus",
                "properties": {"DurationInSeconds": 5,
                  "Description": "Virtual machine is being paused because of a memory-preserving
                                  Live Migration operation.",
                  "EventId": "3da1b9aa-5204-4335-8c33-c54e315dcffe", "EventSource": "Platform",
                  "EventStatus": "Started", "EventType": "Freeze",
                  "NotBefore": "Mon, 19 Sep 2025 18:29:47 GMT",
                  "Resources": ["myvmss_1", "myvmss_2"], "ResourceType": "VirtualMachine",
                  "ScheduledEventApiVersion": "2020-07-01"}},
              "apiVersion": "2024-07-01"},
     "eventType": "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted",
     "dataVersion": "3.0", "metadataVersion": "1", "eventTime": "2017-06-26T18:41:00.9584103Z"}

A real resource-health delivery (CloudEvents; from event-schema-health-resources.md):

    {"id": "1fb6fa94-d965-4306-abeq-4810f0774e97", "source": "/subscriptions/{subscription-id}",
     "subject": "/subscriptions/{subscription-id}/resourceGroups/{rg-name}/providers/
                 Microsoft.Compute/virtualMachines/{vm-name}",
     "data": {"resourceInfo": {
                "id": "<the subject>/providers/Microsoft.ResourceHealth/availabilityStatuses/{id}",
                "name": "{event-id}", "type": "Microsoft.ResourceHealth/availabilityStatuses",
                "properties": {"targetResourceId": "<the subject>",
                  "targetResourceType": "Microsoft.Compute/virtualMachines",
                  "occurredTime": "2023-07-24T19:20:37.9245071Z",
                  "previousAvailabilityState": "Unavailable", "availabilityState": "Available"}},
              "operationalInfo": {"resourceEventTime": "2023-07-24T19:20:37.9245071Z"},
              "apiVersion": "2023-12-01"},
     "type": "Microsoft.ResourceNotifications.HealthResources.AvailabilityStatusChanged",
     "specversion": "1.0", "time": "2023-07-24T19:20:37.9245071Z"}
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, cast
from urllib.parse import urlsplit

from bridge import __version__
from bridge import recordtypes as rt
from bridge.config import ConfigError, EventGridSettings
from bridge.consumer import validation
from bridge.consumer.sources import patchruns
from bridge.imdstime import parse_time as parse_not_before
from bridge.records import is_recommendation, iso, record_id, vm_key

SCHEDULED_TYPES = frozenset(
    {
        "microsoft.resourcenotifications.maintenanceresources.scheduledeventemitted",
        "microsoft.maintenance/scheduledevents/write",
    }
)
HEALTH_CHANGED = "microsoft.resourcenotifications.healthresources.availabilitystatuschanged"
HEALTH_ANNOTATED = "microsoft.resourcenotifications.healthresources.resourceannotated"
AKS_EVENTS = "microsoft.containerservice/managedclusters/scheduledevents"
STATUSES = ("Scheduled", "Started", "Completed", "Canceled")
HEALTH_STATES = ("Available", "Unavailable", "Degraded")
# Event Hubs takes messages of up to 1 MB; Event Grid sends one event a message.
MAX_DELIVERY_BYTES = 1024 * 1024
MAX_EVENTS = 100
# A scale set has at most 1,000 VMs, and an event names those of one placement group at
# most: a longer Resources is not Azure's. Names: Azure's VM names are at most 64
# characters (a scale set's instance name adds an underscore and a number).
MAX_RESOURCES = 1000
MAX_NAME = 80
MAX_TEXT = 4096

_GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
# A compute resource's id, with a maintenance or health resource under it perhaps.
_ARM = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourcegroups/(?P<rg>[^/]+)/providers/microsoft\.compute/"
    r"(?P<kind>virtualmachines|virtualmachinescalesets|availabilitysets)/(?P<name>[^/]+)"
    r"(?:/virtualmachines/(?P<instance>[^/]+))?(?:/providers/.*)?$",
    re.IGNORECASE,
)
_TOPIC = re.compile(r"^/subscriptions/(?P<sub>[^/]+)/?$", re.IGNORECASE)
_FRACTION = re.compile(r"(\.\d{6})\d+")


@dataclass(frozen=True)
class Trust:
    """What a delivery must be about to be taken: a topic of `subscriptions` and, when
    `resource_groups` is not empty, a VM of one of them ("rg" or "sub/rg", lower case)."""

    subscriptions: frozenset[str]
    resource_groups: frozenset[str] = frozenset()
    health: bool = False
    patch_runs: bool = False  # Update Manager's pre- and post-maintenance events (patchruns)

    @classmethod
    def of(cls, settings: EventGridSettings, patch_runs: bool = False) -> Trust:
        return cls(
            frozenset(s.strip().lower() for s in settings.subscriptions if s.strip()),
            frozenset(g.strip().lower() for g in settings.resource_groups if g.strip()),
            settings.health,
            patch_runs,
        )


def check_settings(settings: EventGridSettings, records_hub: str = "") -> None:
    """ConfigError when the [eventgrid] settings cannot work (checked at start); `records_hub`
    is the hub the agents send to (eventhubs.name), which must not be this one."""
    if settings.health and not settings.enabled:
        raise ConfigError("eventgrid.health needs eventgrid.enabled: both come from one hub")
    if settings.acknowledge and not settings.enabled:
        raise ConfigError(
            "eventgrid.acknowledge needs eventgrid.enabled: ARM's acknowledge is "
            "addressed to the resource Event Grid names"
        )
    endpoint = urlsplit(settings.arm_endpoint)
    if settings.acknowledge and (
        endpoint.scheme != "https" or not endpoint.hostname or endpoint.path not in ("", "/")
    ):
        raise ConfigError(
            f"eventgrid.arm_endpoint {settings.arm_endpoint!r} is not https://HOST "
            "(ARM's endpoint: https://management.azure.com)"
        )
    if not settings.enabled:
        return
    if not settings.hub and not settings.connection_string:
        raise ConfigError(
            "eventgrid.enabled needs eventgrid.hub, the event hub the system topics deliver to"
        )
    if settings.hub and settings.hub.strip().lower() == records_hub.strip().lower():
        raise ConfigError(
            f"eventgrid.hub {settings.hub!r} is the hub the agents send to "
            "(eventhubs.name): a VM could then send what reads as Azure's word, "
            "so give the system topics a hub of their own"
        )
    if not any(s.strip() for s in settings.subscriptions):
        raise ConfigError(
            "eventgrid.enabled needs eventgrid.subscriptions: the subscriptions "
            "whose system topics may be trusted (none is otherwise)"
        )
    bad = [s for s in settings.subscriptions if s.strip() and not _GUID.match(s.strip())]
    if bad:
        raise ConfigError(f"eventgrid.subscriptions: {', '.join(bad)} is not a subscription id")


@dataclass(frozen=True)
class Refusal:
    """A delivery (or one event of it) refused: `code` for the metric, `detail` for the log."""

    code: str  # not-json, too-large, wrong-type, untrusted-topic, wrong-subscription,
    # out-of-scope, too-many-resources, malformed
    detail: str
    delivery_id: str = ""


@dataclass(frozen=True)
class Resource:
    """A compute resource an id names: its scope as the agents' records give theirs
    (subscription, resource group and scale set; bridge.policy.model.scope_of)."""

    id: str  # the compute resource's id, without what is under it, as sent
    subscription: str
    resource_group: str
    kind: str  # virtualmachines, virtualmachinescalesets or availabilitysets (lower case)
    name: str
    instance: str | None = None  # a scale set VM's instance id (a uniform scale set's VM)

    @property
    def scale_set(self) -> str | None:
        return self.name if self.kind == "virtualmachinescalesets" else None

    @property
    def vm_name(self) -> str | None:
        """The VM's name as Resources lists it: a VM's, or a uniform scale set VM's
        (its scale set's name, an underscore and its instance id); None for a set."""
        if self.instance is not None:
            return f"{self.name}_{self.instance}"
        return self.name if self.kind == "virtualmachines" else None

    def vm_ids(self, name: str) -> tuple[str, ...]:
        """The full ids (lower case) a VM named `name` in Resources of an event of this
        resource may have: Azure's docs build it from the subscription, the resource group
        and the name; a uniform scale set's VM has its instance's id."""
        base = f"/subscriptions/{self.subscription}/resourcegroups/{self.resource_group}"
        ids = [f"{base}/providers/microsoft.compute/virtualmachines/{vm_key(name)}"]
        if self.kind == "virtualmachinescalesets":
            instance = vm_key(name).rpartition("_")[2]
            set_id = f"{base}/providers/microsoft.compute/virtualmachinescalesets/{self.name}"
            ids.append(f"{set_id}/virtualmachines/{instance}".lower())
        return tuple(i.lower() for i in ids)


def resource_of(resource_id: object) -> Resource | None:
    """The compute resource `resource_id` names (or the one a maintenance or health resource
    id is under); None when it names none."""
    if not isinstance(resource_id, str) or len(resource_id) > MAX_TEXT:
        return None
    match = _ARM.match(resource_id.strip())
    if match is None:
        return None
    end = match.end("instance") if match.group("instance") else match.end("name")
    return Resource(
        resource_id.strip()[:end],
        match.group("sub").lower(),
        match.group("rg").lower(),
        match.group("kind").lower(),
        match.group("name"),
        match.group("instance"),
    )


@dataclass(frozen=True)
class HealthChange:
    """A VM's availability as resource health reports it."""

    resource: Resource  # the VM
    state: str  # Available, Unavailable or Degraded
    at: datetime  # when it changed (occurredTime)
    delivery_id: str


@dataclass
class Parsed:
    """What one message held."""

    events: list[rt.Event] = field(default_factory=list)
    # Spot rebalance recommendations: Advisory records, never Events (never approved).
    advisories: list[rt.Advisory] = field(default_factory=list)
    health: list[HealthChange] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # why each event was left aside
    runs: list[patchruns.RunNotice] = field(default_factory=list)  # patch runs' events


class _Refused(ValueError):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code


def parse(body: str, trust: Trust) -> Parsed:
    """The scheduled events and health changes of one message, each checked against `trust`."""
    parsed = Parsed()
    size = len(body.encode("utf-8", errors="surrogatepass"))
    if size > MAX_DELIVERY_BYTES:
        parsed.refused.append(Refusal("too-large", f"{size} bytes, more than {MAX_DELIVERY_BYTES}"))
        return parsed
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as err:
        parsed.refused.append(Refusal("not-json", f"not JSON: {err}"))
        return parsed
    items = value if isinstance(value, list) else [value]
    if len(items) > MAX_EVENTS:
        parsed.refused.append(Refusal("too-large", f"{len(items)} events in one message"))
        return parsed
    for item in items:
        delivery_id = _text(item.get("id")) if isinstance(item, dict) else None
        try:
            _one(item, trust, parsed)
        except _Refused as err:
            parsed.refused.append(Refusal(err.code, str(err), delivery_id or ""))
    return parsed


def _one(item: object, trust: Trust, parsed: Parsed) -> None:
    if not isinstance(item, dict):
        raise _Refused("malformed", f"a JSON {type(item).__name__}, not an event")
    envelope = _Envelope.of(item)
    kind = envelope.type.lower()
    if kind in patchruns.TYPES:
        _run(envelope, kind, trust, parsed)
        return
    if kind not in SCHEDULED_TYPES and kind not in (HEALTH_CHANGED, HEALTH_ANNOTATED):
        raise _Refused(
            "wrong-type",
            f"event type {_short(envelope.type)} is not one se-bridge "
            "reads (scheduled events, resource health, patch runs)",
        )
    topic = _TOPIC.match(envelope.topic)
    if topic is None or topic.group("sub").lower() not in trust.subscriptions:
        raise _Refused(
            "untrusted-topic",
            f"topic {_short(envelope.topic)} is not the system "
            "topic of a subscription in eventgrid.subscriptions",
        )
    info = _lower_keys(envelope.data.get("resourceinfo"))
    properties = _lower_keys(info.get("properties"))
    if kind in SCHEDULED_TYPES:
        _scheduled(envelope, info, properties, topic.group("sub"), trust=trust, parsed=parsed)
    elif kind == HEALTH_ANNOTATED or not trust.health:
        parsed.ignored.append(
            "a health annotation"
            if kind == HEALTH_ANNOTATED
            else "resource health, which eventgrid.health leaves off"
        )
    else:
        change = _health(envelope, properties, topic.group("sub"), trust)
        if isinstance(change, str):
            parsed.ignored.append(change)
        else:
            parsed.health.append(change)


def _scheduled(
    envelope: _Envelope,
    info: dict[str, Any],
    properties: dict[str, Any],
    subscription: str,
    *,
    trust: Trust,
    parsed: Parsed,
) -> None:
    """A scheduled event: an Event record, or an Advisory for a rebalance recommendation."""
    if str(info.get("type", "")).lower() == AKS_EVENTS:
        parsed.ignored.append("an AKS scheduled event (the cluster's own, not a VM's)")
        return
    record = _event(envelope, info, properties, subscription, trust)
    # What the schema refuses (text that is not Unicode, a number past any column) is
    # refused here, as an agent's record would be at the consumer's door.
    if is_recommendation(record["EventType"]):
        advisory = _advisory(record)
        problem = validation.problem(cast(dict[str, object], advisory))
        if problem is not None:
            raise _Refused("malformed", f"not a valid Advisory record: {problem}")
        parsed.advisories.append(advisory)
        return
    problem = validation.problem(cast(dict[str, object], record))
    if problem is not None:
        raise _Refused("malformed", f"not a valid Event record: {problem}")
    parsed.events.append(_identified(record))


def _run(envelope: _Envelope, kind: str, trust: Trust, parsed: Parsed) -> None:
    """A patch run's pre- or post-maintenance event (bridge.consumer.sources.patchruns)."""
    if not trust.patch_runs:
        parsed.ignored.append("a patch run's event, which patchruns.enabled leaves off")
        return
    try:
        parsed.runs.append(
            patchruns.notice(
                kind,
                envelope.topic,
                envelope.data,
                at=envelope.time,
                delivery_id=envelope.id,
                trusted=trust.subscriptions,
                time_of=event_time,
            )
        )
    except patchruns.PatchRefused as err:
        raise _Refused(err.code, str(err)) from None


@dataclass(frozen=True)
class _Envelope:
    id: str
    type: str
    topic: str
    time: datetime
    data: Mapping[str, Any]

    @classmethod
    def of(cls, item: Mapping[str, Any]) -> _Envelope:
        cloud = "specversion" in item
        kind = _text(item.get("type" if cloud else "eventType"))
        topic = _text(item.get("source" if cloud else "topic"))
        when = event_time(item.get("time" if cloud else "eventTime"))
        data = _lower_keys(item.get("data"))
        if kind is None or topic is None or when is None or not data:
            raise _Refused(
                "malformed", "not an Event Grid event (its type, topic, time or data is missing)"
            )
        return cls(_text(item.get("id")) or "", kind, topic, when, data)


def _scoped(resource: Resource, subscription: str, trust: Trust) -> None:
    if resource.subscription != subscription.lower():
        raise _Refused(
            "wrong-subscription",
            f"resource {_short(resource.id)} is not in "
            f"subscription {subscription}, whose topic sent it",
        )
    groups = trust.resource_groups
    if (
        groups
        and not {resource.resource_group, f"{resource.subscription}/{resource.resource_group}"}
        & groups
    ):
        raise _Refused(
            "out-of-scope", f"resource {_short(resource.id)} is outside eventgrid.resource_groups"
        )


def _event(
    envelope: _Envelope,
    info: Mapping[str, Any],
    properties: Mapping[str, Any],
    subscription: str,
    trust: Trust,
) -> rt.Event:
    resource = resource_of(info.get("id")) or resource_of(envelope.data.get("subject"))
    if resource is None:
        raise _Refused(
            "malformed",
            f"resource id {_short(info.get('id'))} names no VM, scale set or availability set",
        )
    _scoped(resource, subscription, trust)
    event_id = _text(properties.get("eventid")) or _text(info.get("name"))
    if event_id is None or not _GUID.match(event_id):
        raise _Refused("malformed", f"EventId {_short(event_id)} is not a GUID")
    status = _text(properties.get("eventstatus"))
    if status not in STATUSES:
        raise _Refused(
            "malformed", f"EventStatus {_short(status)} is none of {', '.join(STATUSES)}"
        )
    resources = properties.get("resources")
    if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
        raise _Refused("malformed", "Resources is not a list of names")
    if len(resources) > MAX_RESOURCES or any(len(r) > MAX_NAME for r in resources):
        raise _Refused(
            "too-many-resources",
            f"Resources lists {len(resources)} names (at most "
            f"{MAX_RESOURCES} of at most {MAX_NAME} characters each)",
        )
    raw = _text(properties.get("notbefore"))
    not_before = parse_not_before(raw)
    duration = properties.get("durationinseconds")
    ended = status in ("Completed", "Canceled")
    names = [r.strip() for r in resources if r.strip()]
    return {
        "SchemaVersion": 1,
        "RecordId": "",  # `_identified`, once the record is known to be valid
        rt.RECORD_TYPE: "Event",
        "TimeGenerated": iso(envelope.time),
        "VmId": None,
        "VmName": resource.vm_name,
        "ResourceId": resource.id,
        "SubscriptionId": resource.subscription,
        "ResourceGroup": resource.resource_group,
        "Location": _text(info.get("location")),
        "Zone": None,
        "VmScaleSetName": resource.scale_set,
        "PlatformFaultDomain": None,
        "PlatformUpdateDomain": None,
        "HostName": "",
        "AgentVersion": __version__,
        "DocumentIncarnation": None,
        "PreviousIncarnation": None,
        "EventId": event_id,
        "EventType": _text(properties.get("eventtype")),
        "ResourceType": _text(properties.get("resourcetype")),
        "Resources": names,
        "EventSource": _text(properties.get("eventsource")),
        "Description": _text(properties.get("description")),
        "DurationInSeconds": duration
        if isinstance(duration, int) and not isinstance(duration, bool)
        else None,
        "EventStatus": None if ended else status,
        "PreviousStatus": None,
        "Transition": status,  # type: ignore[typeddict-item]  # one of STATUSES, checked above
        "NotBefore": iso(not_before) if not_before is not None else None,
        "NotBeforeRaw": raw,
        "AffectsThisVm": None,
        "Inferred": False,
        "ChangedFields": [],
        "Source": "EventGrid",
    }


def _advisory(event: rt.Event) -> rt.Advisory:
    """A delivery whose EventType is SpotRebalanceRecommendation as an Advisory record: Raised
    while Azure says Scheduled or Started, Cleared once Completed or Canceled. Whether Azure
    sends the recommendation on this topic at all, and in this shape, no public sample shows
    (bridge.agent.advisory): it is read as any scheduled event is, and never approved."""
    status = event["Transition"]
    state: rt.AdvisoryState = "Cleared" if status in ("Completed", "Canceled") else "Raised"
    keep = ("SchemaVersion", "TimeGenerated", "VmId", "VmName", "ResourceId", "SubscriptionId",
            "ResourceGroup", "Location", "Zone", "VmScaleSetName", "PlatformFaultDomain",
            "PlatformUpdateDomain", "HostName", "AgentVersion")  # fmt: skip
    common = cast(rt.Common, {k: v for k, v in event.items() if k in keep})
    names = "\n".join(sorted(vm_key(n) for n in event["Resources"]))
    rid = record_id(
        "EventGrid", "Advisory", event["EventId"].lower(), state, event["TimeGenerated"], names
    )
    return {
        **common,
        "RecordId": rid,
        rt.RECORD_TYPE: "Advisory",
        "EventId": event["EventId"],
        "EventType": event["EventType"],
        "EventStatus": event["EventStatus"],
        "Resources": list(event["Resources"]),
        "NotBefore": event["NotBefore"],
        "NotBeforeRaw": event["NotBeforeRaw"],
        "Description": event["Description"],
        "AffectsThisVm": None,
        "AdvisoryState": state,
        "Source": "EventGrid",
    }


def _identified(record: rt.Event) -> rt.Event:
    """`record` with its RecordId: of the event, its status, the delivery's time, NotBefore
    and names, so that a duplicate delivery (Azure documents them) has the same one."""
    names = "\n".join(sorted(vm_key(n) for n in record["Resources"]))
    event_id, status = record["EventId"].lower(), record["Transition"]
    record["RecordId"] = record_id(
        "EventGrid", event_id, status, record["TimeGenerated"], record["NotBeforeRaw"], names
    )
    return record


def _health(
    envelope: _Envelope, properties: Mapping[str, Any], subscription: str, trust: Trust
) -> HealthChange | str:
    target = properties.get("targetresourceid")
    if isinstance(target, str) and not validation.encodes(target):
        raise _Refused("malformed", "targetResourceId is not Unicode text")
    resource = resource_of(target)
    if resource is None:
        raise _Refused("malformed", f"targetResourceId {_short(target)} names no VM")
    _scoped(resource, subscription, trust)
    if resource.vm_name is None:
        return "the health of a whole scale set (no VM named)"
    state = _text(properties.get("availabilitystate"))
    if state not in HEALTH_STATES:
        return f"an availability state of {_short(state)} (only {', '.join(HEALTH_STATES)} count)"
    at = event_time(properties.get("occurredtime")) or envelope.time
    return HealthChange(resource, state, at, envelope.id)


def event_time(text: object) -> datetime | None:
    """Event Grid's times (`2023-07-24T19:20:37.9245071Z`: seven decimals, which Python
    before 3.11 does not read) as an aware UTC datetime; None when unreadable."""
    if not isinstance(text, str) or len(text) > 64:
        return None
    candidate = _FRACTION.sub(r"\1", text.strip())
    if candidate.endswith(("Z", "z")):
        candidate = candidate[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(candidate)
        if moment.tzinfo is None:
            return moment.replace(tzinfo=timezone.utc)
        return moment.astimezone(timezone.utc)
    except (ValueError, OverflowError):  # 0001-01-01T00:00:00+05:00 is before year 1 in UTC
        return None


def _lower_keys(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        return {}
    return {str(k).lower(): v for k, v in value.items()}


def _text(value: object) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    return value.strip()[:MAX_TEXT]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def describe(refusals: Sequence[Refusal]) -> str:
    """Refusals in a sentence for a log line."""
    return "; ".join(
        f"{r.code}: {r.detail}" + (f" (id {r.delivery_id})" if r.delivery_id else "")
        for r in refusals
    )
