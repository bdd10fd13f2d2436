"""Planned disruptions days ahead besides the maintenance configurations' runs (issue 40, item 2;
docs/planned-disruptions.md#service-healths-planned-maintenance and #aks-upgrade-notices): Azure
Service Health's planned maintenance that names VMs among its impacted resources, and the AKS
Communication Manager's notices of a cluster's scheduled upgrade. Read through Resource Graph
with the consumer's client (`rows(query, subscriptions)`: paged, bounded, its 429s waited).

The parsers are pure and refuse a row they cannot read with a ValueError naming the row and
the field; the readers turn each refusal into a sentence and keep the other rows, so one
malformed row never hides the rest.

Service Health keeps an event per subscription it concerns (`servicehealthresources`, type
microsoft.resourcehealth/events, its id /subscriptions/{sub}/providers/Microsoft.ResourceHealth/
events/{TrackingId}) and, for planned maintenance of "rebootful updates for compute resources",
the resources it impacts (type microsoft.resourcehealth/events/impactedresources, the event's
id then /impactedResources/{guid}) (learn.microsoft.com/azure/service-health/
impacted-resources-planned-maintenance, resource-graph-impacted-samples). Its properties are
PascalCase; the impact's start and end are .NET ticks in Resource Graph (Microsoft's samples read
them with `todatetime(tolong(properties.ImpactMitigationTime))` and keep `tolong(impactStartTime)
> 1`), ISO text in the REST API: both are read.

AKS's Communication Manager writes a row per scheduled event of a cluster to
`containerserviceeventresources` (type microsoft.containerservice/managedclusters/scheduledevents),
"one week before maintenance starts and one day before" (articles/aks/aks-communication-manager.md),
its properties camelCase as in the Event Grid event's resourceInfo (articles/event-grid/
event-schema-containerservice-resources.md). Microsoft's own queries read the row's `properties`
as text (`substring(properties, indexof(properties, "eventStatus") ...)`): an object or its JSON
text are both read. A notice says when, not for how long: its window is AKS_WINDOW, the
shortest planned maintenance window AKS takes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from bridge.consumer.sources.eventgrid import event_time
from bridge.consumer.sources.patchruns import Rows
from bridge.policy.upcoming import HORIZON

EVENTS = "microsoft.resourcehealth/events"
IMPACTED = "microsoft.resourcehealth/events/impactedresources"
SCHEDULED_EVENTS = "microsoft.containerservice/managedclusters/scheduledevents"
CLUSTERS = "microsoft.containerservice/managedclusters"
# What se-bridge's budgets count: VMs, scale sets and the VMs of scale sets. The other
# resources planned maintenance names (SQL databases, hosts) are not VMs an agent reports.
COMPUTE_TYPES = frozenset({
    "microsoft.compute/virtualmachines",
    "microsoft.compute/virtualmachinescalesets",
    "microsoft.compute/virtualmachinescalesets/virtualmachines",
})  # fmt: skip
# AKS's planned maintenance windows are at least four hours (durationHours, articles/aks/
# planned-maintenance.md); a notice names only its start.
AKS_WINDOW = timedelta(hours=4)
AKS_KINDS = ("K8sVersionUpgrade", "NodeOSUpgrade")
# "If not specified, the default is 10%" (AgentPoolUpgradeSettings.maxSurge, Microsoft's
# ContainerService reference).
DEFAULT_SURGE = "10%"
# Tracking ids are short codes (`PYN_-ZL8`, `1J14-8LG`); anything else is not put in a query.
_TRACKING = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
_IMPACTED_ID = re.compile(
    r"^/subscriptions/(?P<sub>[0-9a-f-]{36})/providers/microsoft\.resourcehealth/events/"
    r"(?P<tracking>[^/]+)/impactedresources/[^/]+$",
    re.IGNORECASE,
)
_CLUSTER_ID = re.compile(
    r"^/subscriptions/(?P<sub>[0-9a-f-]{36})/resourcegroups/(?P<rg>[-\w._()]{1,90})/providers/"
    r"microsoft\.containerservice/managedclusters/(?P<name>[-\w]{1,63})$",
    re.IGNORECASE,
)
_TICKS_EPOCH = datetime(1, 1, 1, tzinfo=timezone.utc)
MAX_TEXT = 300
T = TypeVar("T")


class Unreadable(ValueError):
    """A row that cannot be read: the sentence names the row and the field."""


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _properties(row: Mapping[str, Any], what: str) -> Mapping[str, Any]:
    props = row.get("properties")
    if isinstance(props, str):
        try:
            props = json.loads(props)
        except ValueError:
            raise ValueError(f"{what}: its properties are not JSON") from None
    if not isinstance(props, Mapping):
        raise Unreadable(f"{what}: it has no properties")
    return props


def _text(value: object) -> str:
    return value.strip()[:MAX_TEXT] if isinstance(value, str) else ""


def moment(value: object) -> datetime | None:
    """A Service Health or AKS time: .NET ticks (a number, or its digits) or ISO 8601 text;
    None when it is neither, or the ticks say none (0 or 1, as Microsoft's samples skip)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int | float):
        if value <= 1:
            return None
        try:
            return _TICKS_EPOCH + timedelta(microseconds=int(value) // 10)
        except (OverflowError, ValueError):  # past year 9999, or NaN
            return None
    found = event_time(value)
    return None if found is None or found.year < 2 else found


def _parsed(
    found: Iterable[Mapping[str, Any]],
    kind: str,
    parse: Callable[[Mapping[str, Any]], T],
    problems: list[str],
    consequence: str = "it is not counted ahead",
) -> Iterator[T]:
    """What `parse` makes of each row of type `kind` (the others are another query's); a row it
    refuses is a sentence in `problems`, and the next row is read."""
    for row in found:
        if _text(row.get("type")).lower() != kind:
            continue
        try:
            yield parse(row)
        except ValueError as err:
            problems.append(f"{err}: {consequence}")


# --- Service Health -------------------------------------------------------------------------


@dataclass(frozen=True)
class Maintenance:
    """A planned maintenance of Service Health, and the compute resources it names."""

    tracking_id: str
    title: str
    start: datetime
    end: datetime
    subscriptions: frozenset[str] = frozenset()  # lower case
    resources: frozenset[str] = frozenset()  # VM, scale set and instance ids, lower case


def parse_event(row: Mapping[str, Any]) -> Maintenance:
    """The Maintenance a `servicehealthresources` row of type microsoft.resourcehealth/events
    tells, without its resources; ValueError naming the event and what it lacks.

    Its shape (the fields of learn.microsoft.com/azure/service-health/
    azure-resource-graph-overview, the tracking id of Microsoft's planned maintenance samples,
    the times as ticks as those samples read them: 638542728000000000 is 2024-06-18 02:00 UTC):

        {"id": "/subscriptions/8d5f9c8e-.../providers/Microsoft.ResourceHealth/events/PYN_-ZL8",
         "name": "PYN_-ZL8", "type": "microsoft.resourcehealth/events",
         "subscriptionId": "8d5f9c8e-...", "location": "global",
         "properties": {"EventType": "PlannedMaintenance", "EventSource": "ServiceHealth",
           "Status": "Active", "TrackingId": "PYN_-ZL8", "Level": "Warning",
           "Title": "Planned maintenance for Azure Virtual Machines - West Europe",
           "Summary": "<p>...</p>", "PlatformInitiated": true,
           "ImpactStartTime": 638542728000000000, "ImpactMitigationTime": 638543016000000000,
           "LastUpdateTime": 638536068000000000,
           "Impact": [{"ImpactedService": "Virtual Machines",
                       "ImpactedRegions": [{"ImpactedRegion": "West Europe"}]}]}}
    """
    name = _text(row.get("name")) or _text(row.get("id")).rpartition("/")[2]
    what = f"Service Health event {_short(name or row.get('id'))}"
    props = _properties(row, what)
    tracking = _text(props.get("TrackingId")) or name
    if not _TRACKING.match(tracking):
        raise ValueError(f"{what}: TrackingId {_short(tracking)} is not a tracking id")
    what = f"Service Health event {tracking}"
    start = moment(props.get("ImpactStartTime"))
    end = moment(props.get("ImpactMitigationTime"))
    if start is None or end is None or end <= start:
        raise ValueError(
            f"{what}: ImpactStartTime {_short(props.get('ImpactStartTime'))} and "
            f"ImpactMitigationTime {_short(props.get('ImpactMitigationTime'))} are not a window"
        )
    subscription = _text(row.get("subscriptionId")).lower()
    title = _text(props.get("Title")) or "planned maintenance"
    return Maintenance(tracking, title, start, end, frozenset({subscription} - {""}))


def _planned(row: Mapping[str, Any]) -> bool:
    """Whether `row` is a planned maintenance event not yet resolved (before it is parsed)."""
    try:
        props = _properties(row, "")
    except ValueError:
        return True  # parse_event says what is wrong with it
    kind, status = _text(props.get("EventType")), _text(props.get("Status"))
    return kind.lower() == "plannedmaintenance" and status.lower() != "resolved"


def parse_impacted(row: Mapping[str, Any]) -> tuple[str, str] | None:
    """(TrackingId, resource id lower case) of an impacted resource row, None when it is not a
    VM, a scale set or a scale set's VM; ValueError when it cannot be read.

    A real one (the Resource Health API's example of an impacted resource, as Resource Graph
    adds the subscription; learn.microsoft.com/rest/api/resourcehealth/impacted-resources):

        {"id": "/subscriptions/8d5f9c8e-.../providers/Microsoft.ResourceHealth/events/PYN_-ZL8/
                impactedResources/abc-123-ghj-456",
         "name": "abc-123-ghj-456", "type": "microsoft.resourcehealth/events/impactedresources",
         "subscriptionId": "8d5f9c8e-...",
         "properties": {"targetRegion": "westeurope",
           "targetResourceId": "/subscriptions/8d5f9c8e-.../resourceGroups/rg-web/providers/
                                Microsoft.Compute/virtualMachines/vm0",
           "targetResourceType": "Microsoft.Compute/virtualMachines",
           "resourceName": "vm0", "resourceGroup": "rg-web"}}
    """
    row_id = _text(row.get("id"))
    found = _IMPACTED_ID.match(row_id)
    if found is None:
        raise ValueError(
            f"impacted resource {_short(row_id)}: its id names no Service Health event"
        )
    what = f"impacted resource of Service Health event {found.group('tracking')}"
    props = _properties(row, what)
    kind = _text(props.get("targetResourceType")).lower()
    if kind not in COMPUTE_TYPES:
        return None
    target = _text(props.get("targetResourceId")).lower()
    if not target.startswith(f"/subscriptions/{found.group('sub').lower()}/resourcegroups/"):
        raise ValueError(
            f"{what}: targetResourceId {_short(props.get('targetResourceId'))} is not a "
            "resource of the event's subscription"
        )
    return found.group("tracking"), target


def event_query() -> str:
    """The active planned maintenance events of the subscriptions."""
    return (
        f"servicehealthresources | where type =~ '{EVENTS}'"
        " | where tostring(properties.EventType) == 'PlannedMaintenance'"
        " | where tostring(properties.Status) != 'Resolved'"
        " | project id, name, type, subscriptionId, properties"
    )


def impacted_query(tracking_ids: Iterable[str]) -> str:
    """The compute resources the events of `tracking_ids` impact (the ids checked by
    parse_event: nothing else goes into the query)."""
    named = ", ".join(f"'{t}'" for t in sorted(set(tracking_ids)))
    kinds = ", ".join(f"'{k}'" for k in sorted(COMPUTE_TYPES))
    return (
        f"servicehealthresources | where type =~ '{IMPACTED}'"
        " | extend TrackingId = tostring(split(split(id, '/events/')[1], '/')[0])"
        f" | where TrackingId in ({named})"
        f" | where tolower(tostring(properties.targetResourceType)) in ({kinds})"
        " | project id, name, type, subscriptionId, properties"
    )


def read_service_health(
    rows: Rows, subscriptions: Sequence[str], now: datetime, horizon: timedelta = HORIZON
) -> tuple[list[Maintenance], list[str]]:
    """The planned maintenance of `subscriptions` whose window is open within `horizon`, each
    with the compute resources it names, and a sentence per row that cannot be read. An event
    in several subscriptions is one Maintenance; one that names no compute resource of the
    subscriptions is left out (it takes no VM se-bridge counts)."""
    trusted = [s.lower() for s in subscriptions]
    problems: list[str] = []
    found: dict[str, Maintenance] = {}
    planned = (row for row in rows(event_query(), trusted) if _planned(row))
    for event in _parsed(planned, EVENTS, parse_event, problems):
        if not event.subscriptions <= set(trusted):
            continue
        if event.end <= now or event.start >= now + horizon:
            continue
        seen = found.get(event.tracking_id)
        subs = event.subscriptions | (seen.subscriptions if seen else frozenset())
        found[event.tracking_id] = replace(event, subscriptions=subs)
    if not found:
        return [], problems
    resources: dict[str, set[str]] = {t: set() for t in found}
    for impacted in _parsed(
        rows(impacted_query(found), trusted), IMPACTED, parse_impacted, problems
    ):
        if impacted is None or impacted[0] not in resources:
            continue
        tracking, target = impacted
        if target.split("/")[2] in found[tracking].subscriptions:
            resources[tracking].add(target)
    events = [replace(e, resources=frozenset(resources[t])) for t, e in found.items()]
    return sorted((e for e in events if e.resources), key=lambda e: (e.start, e.tracking_id)), (
        problems
    )


# --- AKS ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pool:
    """A node pool's size and upgrade settings, as the cluster's row says them."""

    name: str
    count: int
    max_surge: str = ""
    max_unavailable: str = ""

    def batch(self, nodes: int) -> int:
        """How many of its `nodes` an upgrade drains at once: AKS "cordons and drains as many
        nodes at the same time as the number of buffer nodes" (maxSurge), or maxUnavailable
        without surge, a percentage of the pool rounded up (articles/aks/
        upgrade-aks-node-pools-rolling.md); at least one, at most the pool."""
        size = max(self.count, nodes)
        wanted = max(
            _nodes(self.max_surge or DEFAULT_SURGE, size), _nodes(self.max_unavailable, size)
        )
        return max(1, min(wanted, nodes))


def _nodes(setting: str, size: int) -> int:
    text = setting.strip()
    if text.endswith("%") and text[:-1].isdigit():
        return math.ceil(int(text[:-1]) * size / 100)
    return int(text) if text.isdigit() else 0


@dataclass(frozen=True)
class Cluster:
    """What the managed cluster's row says of its nodes: where they are and their pools."""

    cluster_id: str  # lower case
    node_resource_group: str
    pools: tuple[Pool, ...] = ()

    def pool(self, name: str | None) -> Pool:
        wanted = (name or "").lower()
        return next((p for p in self.pools if p.name.lower() == wanted), Pool(name or "", 0))


@dataclass(frozen=True)
class AksNotice:
    """A scheduled upgrade of a cluster, as the Communication Manager's notice says it."""

    event_id: str
    cluster_id: str  # lower case
    kind: str  # K8sVersionUpgrade, NodeOSUpgrade, or the notice's eventSource
    title: str  # eventDetails
    status: str
    start: datetime
    updated: datetime | None
    cluster: Cluster | None = field(default=None, compare=False)
    resource_id: str = ""  # the cluster's id as the notice spells it

    @property
    def cluster_resource_id(self) -> str:
        return self.resource_id or self.cluster_id

    @property
    def end(self) -> datetime:
        return self.start + AKS_WINDOW

    @property
    def cluster_name(self) -> str:
        return self.cluster_id.rpartition("/")[2]

    @property
    def subscription(self) -> str:
        return self.cluster_id.split("/")[2]

    @property
    def resource_group(self) -> str:
        return self.cluster_id.split("/")[4]


def parse_notice(row: Mapping[str, Any]) -> AksNotice:
    """The AksNotice of a `containerserviceeventresources` row; ValueError naming the notice
    and what it lacks.

    A real one (the example of articles/event-grid/event-schema-containerservice-resources.md,
    its resourceInfo as Resource Graph keeps it, status Scheduled as the advance notices have):

        {"id": "/subscriptions/{sub}/resourcegroups/{rg}/providers/Microsoft.ContainerService/
                managedClusters/{cluster}/scheduledEvents/bbe82027-0444-4f73-897a-0bbfe3af66f1",
         "name": "bbe82027-0444-4f73-897a-0bbfe3af66f1",
         "type": "microsoft.containerservice/managedclusters/scheduledevents",
         "location": "westus2", "subscriptionId": "{sub}",
         "properties": {"description": "ScheduledEvents",
           "eventId": "bbe82027-0444-4f73-897a-0bbfe3af66f1", "eventSource": "AutoUprader",
           "eventStatus": "Scheduled", "eventDetails": "Start to upgrade security vhd",
           "scheduledTime": "2024-04-16T22:17:12.103268606Z",
           "startTime": "0001-01-01T00:00:00.0000000Z",
           "lastUpdateTime": "0001-01-01T00:00:00.0000000Z",
           "resources": ["/subscriptions/{sub}/resourcegroups/{rg}/providers/
                          Microsoft.ContainerService/managedClusters/{cluster}"],
           "resourceType": "ManagedCluster"}}
    """
    row_id = _text(row.get("id"))
    cluster_id, _, event_id = row_id.rpartition("/")
    cluster_id = re.sub(r"/scheduledevents$", "", cluster_id, flags=re.IGNORECASE)
    what = f"AKS notice {_short(event_id or row_id)}"
    if _CLUSTER_ID.match(cluster_id) is None:
        raise ValueError(f"{what}: its id {_short(row_id)} names no managed cluster")
    raw = row.get("properties")
    props = _properties(row, what)
    event_id = _text(props.get("eventId")) or event_id
    what = f"AKS notice {event_id} of cluster {cluster_id.rpartition('/')[2]}"
    start = moment(props.get("scheduledTime"))
    if start is None:
        raise ValueError(f"{what}: scheduledTime {_short(props.get('scheduledTime'))} is no time")
    status = _text(props.get("eventStatus"))
    if not status:
        raise ValueError(f"{what}: it has no eventStatus")
    said = raw if isinstance(raw, str) else json.dumps(props)
    kind = next((k for k in AKS_KINDS if k in said), _text(props.get("eventSource")) or "upgrade")
    details = props.get("eventDetails")
    title = _text(details) if isinstance(details, str) else _text(json.dumps(details))
    updated = moment(props.get("lastUpdateTime"))
    return AksNotice(
        event_id, cluster_id.lower(), kind, title, status, start, updated, resource_id=cluster_id
    )


def parse_cluster(row: Mapping[str, Any]) -> Cluster:
    """The Cluster of a `resources` row of a managed cluster (the ARM resource's properties:
    `nodeResourceGroup`, `agentPoolProfiles[]` with `name`, `count` and `upgradeSettings`);
    ValueError when it names no node resource group."""
    cluster_id = _text(row.get("id")).lower()
    what = f"managed cluster {_short(cluster_id.rpartition('/')[2] or cluster_id)}"
    props = _properties(row, what)
    node_group = _text(props.get("nodeResourceGroup"))
    if not node_group:
        raise ValueError(f"{what}: it names no nodeResourceGroup")
    pools: list[Pool] = []
    profiles = props.get("agentPoolProfiles")
    for profile in profiles if isinstance(profiles, list) else []:
        if not isinstance(profile, Mapping) or not _text(profile.get("name")):
            continue
        count = profile.get("count")
        settings = profile.get("upgradeSettings")
        settings = settings if isinstance(settings, Mapping) else {}
        pools.append(Pool(
            _text(profile.get("name")),
            count if isinstance(count, int) and not isinstance(count, bool) else 0,
            _text(str(settings.get("maxSurge") or "")),
            _text(str(settings.get("maxUnavailable") or "")),
        ))  # fmt: skip
    return Cluster(cluster_id, node_group, tuple(pools))


def notice_query() -> str:
    return (
        f"containerserviceeventresources | where type =~ '{SCHEDULED_EVENTS}'"
        " | project id, name, type, subscriptionId, properties"
    )


def cluster_query(cluster_ids: Iterable[str]) -> str:
    """The rows of the managed clusters `cluster_ids` (checked by parse_notice)."""
    named = ", ".join(f"'{c}'" for c in sorted(set(cluster_ids)))
    return (
        f"resources | where type =~ '{CLUSTERS}' | where tolower(id) in ({named})"
        " | project id, name, type, subscriptionId, resourceGroup, properties"
    )


def read_aks_notices(
    rows: Rows, subscriptions: Sequence[str], now: datetime, horizon: timedelta = HORIZON
) -> tuple[list[AksNotice], list[str]]:
    """The upgrades of `subscriptions`' clusters scheduled within `horizon` (each with its
    cluster's pools where the cluster's row can be read), and a sentence per row that cannot
    be read. A notice whose event has since started, completed, failed or been cancelled (a
    later row of the same eventId) is not ahead."""
    trusted = [s.lower() for s in subscriptions]
    problems: list[str] = []
    latest: dict[tuple[str, str], AksNotice] = {}
    moved: set[tuple[str, str]] = set()
    for notice in _parsed(rows(notice_query(), trusted), SCHEDULED_EVENTS, parse_notice, problems):
        if notice.subscription not in trusted:
            continue
        key = (notice.cluster_id, notice.event_id.lower())
        if notice.status.lower() != "scheduled":
            moved.add(key)
            continue
        seen = latest.get(key)
        if seen is None or (notice.updated or notice.start) >= (seen.updated or seen.start):
            latest[key] = notice
    ahead = [n for k, n in latest.items() if k not in moved
             and n.end > now and n.start < now + horizon]  # fmt: skip
    if not ahead:
        return [], problems
    clusters: dict[str, Cluster] = {}
    found = rows(cluster_query(n.cluster_id for n in ahead), trusted)
    why = "its notices count its nodes with AKS's default surge"
    for cluster in _parsed(found, CLUSTERS, parse_cluster, problems, why):
        clusters[cluster.cluster_id] = cluster
    ahead = [replace(n, cluster=clusters.get(n.cluster_id)) for n in ahead]
    return sorted(ahead, key=lambda n: (n.start, n.cluster_id, n.event_id)), problems
