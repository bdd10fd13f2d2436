"""Azure Update Manager's patch runs (issue 40, item 1; preview): the pre- and post-maintenance
events a maintenance configuration's system topic sends, read from the second source's event
hub, and the Resource Graph queries that say which VMs a run patches.

A maintenance configuration "initiate[s] updates on all resources associated with it
simultaneously" (learn.microsoft.com/azure/virtual-machines/maintenance-configurations): the
reboot happens inside the guest, so IMDS shows no scheduled event and nothing else tells
se-bridge's budgets about it. What Microsoft documents, and what this module takes of it:

- Event types `Microsoft.Maintenance.PreMaintenanceEvent` ("raised before maintenance job
  start") and `Microsoft.Maintenance.PostMaintenanceEvent` ("raised after maintenance job
  completes"), from the configuration's own system topic (topic type
  Microsoft.Maintenance.MaintenanceConfigurations; the topic is the configuration's id).
  Data: `correlationId` (the run: the configuration's id, then
  /providers/microsoft.maintenance/applyupdates/{yyyyMMddHHmmss}), `maintenanceConfigurationId`,
  `startDateTime`, `endDateTime`, `cancellationCutOffDateTime` (pre only), `status` (post
  only), `resourceSubscriptionIds` (MicrosoftDocs/azure-docs, articles/event-grid/
  event-schema-maintenance-configuration.md, 2023-11-29). The page's samples spell the data's
  keys in camelCase in one tab and PascalCase in another: keys are read without regard to case.
- Timing (articles/update-manager/pre-post-scripts-overview.md, 2024-06-11): the pre-event
  fires 30 to 40 minutes before the start ("at least 30 mins prior"); "the latest time that can
  invoke the cancellation API" is 10 minutes before it; the post-event "runs immediately after
  updates are installed", within the window or after it. Update Manager never cancels by
  itself: "if the user fails to cancel, the schedule run will proceed" (manage-pre-post-
  events.md). Event Grid delivers at least once: a run's events may repeat (same `id`).
- Guest windows are 1 h 30 to 3 h 55 (maintenance-configurations.md): a window past
  MAX_WINDOW is not Azure's and is refused.

Nothing here trusts a delivery (as bridge.consumer.sources.eventgrid does not): the topic must
be a configuration of a subscription of eventgrid.subscriptions and the data must name that
configuration, or the delivery is refused (counted and logged by the intake) and no VM is
counted or cancelled because of it.

A real pre-maintenance delivery (the Event Grid schema; the sample of
event-schema-maintenance-configuration.md, its missing comma restored):

    {"id": "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/testrg/
            providers/Microsoft.Maintenance/maintenanceConfigurations/contosomaintenance
            configuration/providers/microsoft.maintenance/applyupdates/20230509150000",
     "topic": "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/testrg/
               providers/Microsoft.Maintenance/maintenanceConfigurations/
               contosomaintenanceconfiguration",
     "subject": "contosomaintenanceconfiguration",
     "data": {"correlationId": "<the id above>",
              "maintenanceConfigurationId": "<the topic>",
              "startDateTime": "2023-05-09T15:00:00Z", "endDateTime": "2023-05-09T18:55:00Z",
              "cancellationCutOffDateTime": "2023-05-09T14:59:00Z",
              "resourceSubscriptionIds": ["subscription guid 1", "subscription guid 2"]},
     "eventType": "Microsoft.Maintenance.PreMaintenanceEvent",
     "eventTime": "2023-05-09T14:25:00.3717473Z", "dataVersion": "1.0", "metadataVersion": "1"}

and the post-maintenance one has `"status": "Succeeded"` and no cut-off, `eventType`
Microsoft.Maintenance.PostMaintenanceEvent, `eventTime` 2023-05-09T15:55:00.3717473Z.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from bridge.retry import DeliveryError

PRE = "microsoft.maintenance.premaintenanceevent"
POST = "microsoft.maintenance.postmaintenanceevent"
TYPES = frozenset({PRE, POST})
# Guest windows are at most 3 h 55; a longer one, or a start days away, is not a run's.
MAX_WINDOW = timedelta(hours=6)
MAX_SUBSCRIPTIONS = 100
MAX_STATUS = 40

_CONFIG = re.compile(
    r"^/subscriptions/(?P<sub>[0-9a-f-]{36})/resourcegroups/(?P<rg>[-\w._()]{1,90})/providers/"
    r"microsoft\.maintenance/maintenanceconfigurations/(?P<name>[-\w._]{1,128})$",
    re.IGNORECASE,
)
_RUN = re.compile(r"/providers/microsoft\.maintenance/applyupdates/(?P<run>\d{14})$", re.IGNORECASE)


class PatchRefused(ValueError):
    """A maintenance event refused: `code` as the second source's refusals have them."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code


@dataclass(frozen=True)
class RunNotice:
    """What one pre- or post-maintenance event says of a patch run."""

    kind: Literal["pre", "post"]
    run_id: str  # the correlationId, lower case: the run's identity
    configuration_id: str  # the maintenance configuration's id, as its topic gave it
    name: str  # the run's applyUpdates name (yyyyMMddHHmmss): what a cancel addresses
    start: datetime
    end: datetime
    cutoff: datetime | None  # the pre-event's cancellation cut-off
    status: str | None  # the post-event's status (Succeeded, Failed, Canceled, ...)
    subscriptions: tuple[str, ...]  # resourceSubscriptionIds that are trusted, lower case
    at: datetime  # the event's time
    delivery_id: str

    @property
    def subscription(self) -> str:
        return self.configuration_id.split("/")[2].lower()


def notice(
    kind: str,
    topic: str,
    data: Mapping[str, Any],
    *,
    at: datetime,
    delivery_id: str,
    trusted: frozenset[str],
    time_of: Callable[[object], datetime | None],
) -> RunNotice:
    """The run notice of one maintenance event (its envelope already read by the second
    source's parser: `kind` its type lower case, `data` with lower-cased keys); PatchRefused
    when it is not one se-bridge may act on. `time_of` reads Event Grid's times."""
    config = _CONFIG.match(topic.strip())
    if config is None or config.group("sub").lower() not in trusted:
        raise PatchRefused(
            "untrusted-topic",
            f"topic {_short(topic)} is not a maintenance configuration of a subscription "
            "in eventgrid.subscriptions",
        )
    named = data.get("maintenanceconfigurationid")
    if not isinstance(named, str) or named.strip().lower() != topic.strip().lower():
        raise PatchRefused(
            "malformed", f"maintenanceConfigurationId {_short(named)} is not its topic's"
        )
    correlation = data.get("correlationid")
    run = _RUN.search(correlation.strip()) if isinstance(correlation, str) else None
    if (
        not isinstance(correlation, str)
        or run is None
        or correlation.strip()[: run.start()].lower() != topic.strip().lower()
    ):
        raise PatchRefused(
            "malformed", f"correlationId {_short(correlation)} is not a run of its configuration"
        )
    start, end = time_of(data.get("startdatetime")), time_of(data.get("enddatetime"))
    if start is None or end is None or not start < end <= start + MAX_WINDOW:
        raise PatchRefused(
            "malformed",
            f"startDateTime {_short(data.get('startdatetime'))} and endDateTime "
            f"{_short(data.get('enddatetime'))} are not a window of at most {MAX_WINDOW}",
        )
    cutoff, status = None, None
    if kind == PRE:
        cutoff = time_of(data.get("cancellationcutoffdatetime"))
        if cutoff is None or cutoff > start:
            raise PatchRefused(
                "malformed",
                f"cancellationCutOffDateTime {_short(data.get('cancellationcutoffdatetime'))} "
                "is not a time before the run's start",
            )
    else:
        raw = data.get("status")
        status = raw.strip()[:MAX_STATUS] if isinstance(raw, str) and raw.strip() else None
    subscriptions = data.get("resourcesubscriptionids")
    if not isinstance(subscriptions, list) or len(subscriptions) > MAX_SUBSCRIPTIONS:
        subscriptions = []
    # VMs of a subscription not trusted are never read nor counted: Resource Graph is asked of
    # eventgrid.subscriptions only.
    mine = tuple(sorted({s.strip().lower() for s in subscriptions if isinstance(s, str)} & trusted))
    return RunNotice(
        "pre" if kind == PRE else "post",
        correlation.strip().lower(),
        topic.strip(),
        run.group("run"),
        start,
        end,
        cutoff,
        status,
        mine or (config.group("sub").lower(),),
        at,
        delivery_id,
    )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


# Which VMs a run patches: the configuration's assignments, through Resource Graph.
#
# A configuration is assigned to a VM or a scale set one by one (a `configurationAssignments`
# resource under it, `properties.resourceId` the VM's or the set's id) or by a dynamic scope
# (one at a subscription, `properties.filter` with resourceTypes, resourceGroups, locations,
# osTypes and tagSettings {tags: {name: [values]}, filterOperator: Any or All}): the .NET and
# JavaScript SDKs' ConfigurationAssignmentProperties and ConfigurationAssignmentFilter
# Properties, and the Bicep of Update Manager's dynamic scope samples. Both are rows of
# Resource Graph's `maintenanceresources`, type `microsoft.maintenance/configurationassignments`
# (the query the Update Manager portal itself sends, seen in its HAR samples). A row, as
# Resource Graph answers (objectArray), of each kind:
#
#     {"id": "/subscriptions/{sub}/resourcegroups/rg-web/providers/microsoft.compute/
#             virtualmachinescalesets/web/providers/microsoft.maintenance/
#             configurationassignments/tuesday-web",
#      "name": "tuesday-web", "type": "microsoft.maintenance/configurationassignments",
#      "subscriptionId": "{sub}", "resourceGroup": "rg-web",
#      "properties": {"maintenanceConfigurationId": "/subscriptions/{sub}/resourcegroups/
#                       rg-patch/providers/microsoft.maintenance/maintenanceconfigurations/tuesday",
#                     "resourceId": "/subscriptions/{sub}/resourcegroups/rg-web/providers/
#                       microsoft.compute/virtualmachinescalesets/web"}}
#
#     {"id": "/subscriptions/{sub}/providers/microsoft.maintenance/configurationassignments/
#             tuesday-dynamic", "name": "tuesday-dynamic", "subscriptionId": "{sub}",
#      "type": "microsoft.maintenance/configurationassignments", "resourceGroup": "",
#      "properties": {"maintenanceConfigurationId": "<as above>",
#                     "resourceId": "/subscriptions/{sub}",
#                     "filter": {"resourceTypes": ["Microsoft.Compute/virtualMachines"],
#                                "resourceGroups": ["rg-web"], "locations": ["westeurope"],
#                                "osTypes": ["Linux"], "tagSettings": {"filterOperator": "Any",
#                                "tags": {"patch": ["tuesday"]}}}}}
#
# A dynamic scope's VMs are the `resources` rows of type microsoft.compute/virtualmachines of
# its subscription that its filter takes (evaluated here: the query only narrows by resource
# group and location, with names that are Azure's, so that nothing a row says is ever written
# into a query). Every query is bounded and paged, its 429s waited out (ResourceGraph.rows).

ASSIGNMENTS = "microsoft.maintenance/configurationassignments"
VIRTUAL_MACHINES = "microsoft.compute/virtualmachines"
INSTANCES = "microsoft.compute/virtualmachinescalesets/virtualmachines"
MAX_SCOPES = 20  # dynamic scopes of one configuration read per run (Azure allows more)
# A scale set assigned to a run is read instance by instance, so that each counts in the
# budgets, agent or not: at most MAX_SCALE_SETS sets and MAX_INSTANCES instances a run (two
# queries, each paged: 10 pages of 1,000 rows at most, well inside ResourceGraph.rows' 50, so
# a bound reached is seen here and never a silent truncation). Past either, or when Resource
# Graph fails, the sets not read are `unread`: the run counts as breaking every budget (worst
# case), said at WARNING by the consumer.
MAX_SCALE_SETS = 50
MAX_INSTANCES = 10_000
# VMs assigned one by one whose scale set Resource Graph is asked (one query a run); the rest
# count as names that may be anywhere (worst case).
MAX_PLACED = 500
_NAME = re.compile(r"^[-\w._()]{1,90}$")
_SAFE_ID = re.compile(r"^/subscriptions/[0-9a-f-]{36}(?:/[-\w._()]{1,128}){6,8}$")


@dataclass(frozen=True)
class Resolved:
    """The compute resources a run patches: VM, scale-set instance or scale set ids, lower
    case. A scale set whose instances were read counts by them (`whole`: its agents' VMs too,
    none by its name); one in `unread` counts as breaking every budget. `placed`: of the VM
    ids, those Resource Graph placed, each with the name of its (flexible) scale set or ""
    (none, or an availability set): where its name counts when no agent reports it; a VM not
    placed may be in any group (worst case)."""

    resources: frozenset[str]
    dynamic_scopes: int = 0
    notes: tuple[str, ...] = ()  # what was left out, and why
    whole: frozenset[str] = frozenset()
    unread: frozenset[str] = frozenset()
    placed: Mapping[str, str] = field(default_factory=dict)


Rows = Callable[[str, list[str]], Iterable[Mapping[str, Any]]]


def assignment_query(configuration_id: str) -> str:
    """The configuration's assignments (`configuration_id` checked by the parser)."""
    if _CONFIG.match(configuration_id) is None:
        raise ValueError(f"{configuration_id!r} is not a maintenance configuration's id")
    return (
        f"maintenanceresources | where type =~ '{ASSIGNMENTS}'"
        " | where tolower(tostring(properties.maintenanceConfigurationId)) == "
        f"'{configuration_id.lower()}'"
        " | project id, name, type, subscriptionId, resourceGroup, properties"
    )


def scope_query(filter_: Mapping[str, Any]) -> str:
    """The VMs a dynamic scope's filter may take, narrowed where its names are Azure's."""
    query = f"resources | where type =~ '{VIRTUAL_MACHINES}'"
    for column, key in (("resourceGroup", "resourcegroups"), ("location", "locations")):
        names = _names(filter_.get(key))
        if names and all(_NAME.match(n) for n in names):
            query += f" | where {column} in~ (" + ", ".join(f"'{n}'" for n in names) + ")"
    return (
        query + " | project id, name, type, subscriptionId, resourceGroup, location, tags,"
        " osType = tostring(properties.storageProfile.osDisk.osType),"
        f" {_SCALE_SET_COLUMN}"
    )


# A VM's flexible scale set, as `resources` holds it (properties.virtualMachineScaleSet.id of
# the VM's model, Microsoft.Compute/virtualMachines REST reference); "" when it is in none.
_SCALE_SET_COLUMN = "scaleSet = tolower(tostring(properties.virtualMachineScaleSet.id))"


def placement_query(vm_ids: Sequence[str]) -> str:
    """The scale sets of the VMs `vm_ids` (ids checked to be Azure's: nothing a row says is
    written into a query unless it is)."""
    listed = ", ".join(f"'{i}'" for i in vm_ids)
    return (
        f"resources | where type =~ '{VIRTUAL_MACHINES}' | where tolower(id) in ({listed})"
        f" | project id, name, type, subscriptionId, resourceGroup, {_SCALE_SET_COLUMN}"
    )


# A scale set's instances (issue 40 leftover 1). Microsoft publishes no Resource Graph row of
# either kind; these are shaped as its references give them: the table and type from Resource
# Graph's table reference ("computeresources: microsoft.compute/virtualmachinescalesets/
# virtualmachines"), an instance's id from the REST reference of Virtual Machine Scale Set VMs
# (.../virtualMachineScaleSets/{vmScaleSetName}/virtualMachines/{instanceId}), its name as
# scheduled events name it (`myvmss_1` in the Event Grid sample of bridge.consumer.sources.
# resourcegraph), and a Flexible set's VM from the VM reference (properties.
# virtualMachineScaleSet.id); `scaleSet` is the column the queries below project:
#
#     {"id": "/subscriptions/{sub}/resourcegroups/rg-web/providers/microsoft.compute/
#             virtualmachinescalesets/web/virtualmachines/3",
#      "name": "web_3", "type": "microsoft.compute/virtualmachinescalesets/virtualmachines",
#      "subscriptionId": "{sub}", "resourceGroup": "rg-web",
#      "scaleSet": "/subscriptions/{sub}/resourcegroups/rg-web/providers/microsoft.compute/
#                   virtualmachinescalesets/web"}
#
#     {"id": "/subscriptions/{sub}/resourceGroups/rg-web/providers/Microsoft.Compute/
#             virtualMachines/flex_a1b2c3", "name": "flex_a1b2c3",
#      "type": "microsoft.compute/virtualmachines", "subscriptionId": "{sub}",
#      "resourceGroup": "rg-web", "scaleSet": "/subscriptions/{sub}/resourcegroups/rg-web/
#      providers/microsoft.compute/virtualmachinescalesets/flex"}
#
# Nothing a row says is trusted: an instance counts only when its id is under a set the run
# names (Uniform) or its scaleSet is one (Flexible); anything else is left out.


def instances_queries(scale_sets: Sequence[str]) -> tuple[str, str]:
    """The instances of `scale_sets` (ids checked to be Azure's): a Uniform set's are rows of
    `computeresources`, type microsoft.compute/virtualmachinescalesets/virtualmachines, their
    ids under the set's (Resource Graph's table reference, "computeresources"); a Flexible
    set's are VMs of `resources` naming it in properties.virtualMachineScaleSet.id."""
    listed = ", ".join(f"'{i}'" for i in scale_sets)
    uniform = (
        f"computeresources | where type =~ '{INSTANCES}'"
        " | extend scaleSet = tolower(strcat_array(array_slice(split(id, '/'), 0, 8), '/'))"
        f" | where scaleSet in ({listed})"
        " | project id, name, type, subscriptionId, resourceGroup, scaleSet"
    )
    flexible = (
        f"resources | where type =~ '{VIRTUAL_MACHINES}' | extend {_SCALE_SET_COLUMN}"
        f" | where scaleSet in ({listed})"
        " | project id, name, type, subscriptionId, resourceGroup, scaleSet"
    )
    return uniform, flexible


def resolve(run: RunNotice, rows: Rows) -> Resolved:
    """The VMs and scale sets `run`'s configuration is assigned to, in the run's trusted
    subscriptions; `rows(query, subscriptions)` is ResourceGraph.rows."""
    return resolve_configuration(run.configuration_id, run.subscriptions, rows, instances=True)


def resolve_configuration(
    configuration_id: str, trusted: Sequence[str], rows: Rows, *, instances: bool = False
) -> Resolved:
    """The VMs and scale sets configuration `configuration_id` is assigned to, in the
    `trusted` subscriptions (lower case): its assignments and its dynamic scopes. With
    `instances` (a run about to start), also its scale sets' instances and where its VMs are
    (two or three more queries); the week ahead's read, which resolves every configuration,
    does without."""
    subscriptions = list(trusted)
    wanted = configuration_id.lower()
    found: set[str] = set()
    scopes: list[tuple[str, Mapping[str, Any]]] = []
    for row in rows(assignment_query(configuration_id), subscriptions):
        properties = _lower(row.get("properties"))
        if str(row.get("type", "")).lower() != ASSIGNMENTS:
            continue
        if str(properties.get("maintenanceconfigurationid", "")).lower() != wanted:
            continue
        target = str(properties.get("resourceid", "")).strip().lower()
        filter_ = properties.get("filter")
        if isinstance(filter_, Mapping):
            sub = str(row.get("subscriptionId", "")).lower()
            if sub in subscriptions:
                scopes.append((sub, _lower(filter_)))
        elif _COMPUTE.match(target) and target.split("/")[2] in subscriptions:
            found.add(target)
    notes: list[str] = []
    placed: dict[str, str] = {}
    dynamic: set[str] = set()  # their rows say their scale sets already
    if len(scopes) > MAX_SCOPES:
        notes.append(f"{len(scopes)} dynamic scopes; the first {MAX_SCOPES} were read")
    for sub, filter_ in scopes[:MAX_SCOPES]:
        for row in rows(scope_query(filter_), [sub]):
            vm = str(row.get("id", "")).strip().lower()
            if _COMPUTE.match(vm) and vm.split("/")[2] == sub and takes(filter_, row):
                found.add(vm)
                dynamic.add(vm)
                _place(placed, vm, row)
    whole: frozenset[str] = frozenset()
    unread: frozenset[str] = frozenset()
    if instances:
        _place_assigned(found - dynamic, placed, subscriptions, rows, notes)
        whole, unread, read = _instances(found, subscriptions, rows, notes)
        for vm, row in read.items():
            found.add(vm)
            _place(placed, vm, row)
    return Resolved(
        frozenset(found),
        min(len(scopes), MAX_SCOPES),
        tuple(notes),
        whole=whole,
        unread=unread,
        placed=placed,
    )


def _place(placed: dict[str, str], vm: str, row: Mapping[str, Any]) -> None:
    """Note the scale set a VM row names (a projected `scaleSet`: a set's id, or "")."""
    if vm.split("/")[-2] != "virtualmachines" or "scaleSet" not in row:
        return
    named = str(row.get("scaleSet") or "").strip().lower()
    placed[vm] = named.rpartition("/")[2] if named else ""


def _place_assigned(
    found: set[str], placed: dict[str, str], subscriptions: list[str], rows: Rows, notes: list[str]
) -> None:
    """Ask Resource Graph the scale set of each VM assigned one by one (at most MAX_PLACED);
    a VM it does not place may be in any group. Its failure costs only that precision."""
    wanted = sorted(r for r in found if r not in placed and _kind(r) == "vm" and _SAFE_ID.match(r))
    if not wanted:
        return
    if len(wanted) > MAX_PLACED:
        notes.append(
            f"{len(wanted)} VMs assigned one by one; where the first {MAX_PLACED} are was "
            "read, the others may be in any group (worst case)"
        )
    try:
        for row in rows(placement_query(wanted[:MAX_PLACED]), subscriptions):
            vm = str(row.get("id", "")).strip().lower()
            if vm in found and str(row.get("type", "")).lower() == VIRTUAL_MACHINES:
                _place(placed, vm, row)
    except DeliveryError as err:
        notes.append(f"where the VMs assigned one by one are could not be read ({err}): each "
                     "may be in any group (worst case)")  # fmt: skip


def _instances(
    found: set[str], subscriptions: list[str], rows: Rows, notes: list[str]
) -> tuple[frozenset[str], frozenset[str], dict[str, Mapping[str, Any]]]:
    """The instances of the scale sets of `found`: (the sets read whole, the sets not read,
    each instance's id with its row)."""
    sets = sorted(r for r in found if _kind(r) == "scale_set")
    readable = [r for r in sets if _SAFE_ID.match(r)][:MAX_SCALE_SETS]
    unread = set(sets) - set(readable)
    if unread:
        notes.append(
            f"the instances of {len(unread)} scale sets were not read (more than "
            f"{MAX_SCALE_SETS}, or an id that is not Azure's): counted as breaking every "
            "budget (worst case)"
        )
    if not readable:
        return frozenset(), frozenset(unread), {}
    try:
        instances = _read_instances(readable, subscriptions, rows)
    except DeliveryError as err:
        notes.append(
            f"the instances of {len(readable)} scale sets could not be read ({err}): counted "
            "as breaking every budget (worst case)"
        )
        return frozenset(), frozenset(sets), {}
    if instances is None:
        notes.append(
            f"the scale sets hold more than {MAX_INSTANCES} instances: not read, counted as "
            "breaking every budget (worst case)"
        )
        return frozenset(), frozenset(sets), {}
    return frozenset(readable), frozenset(unread), instances


def _read_instances(
    readable: list[str], subscriptions: list[str], rows: Rows
) -> dict[str, Mapping[str, Any]] | None:
    """Each instance of `readable`'s sets by its id, with its row; None past MAX_INSTANCES."""
    instances: dict[str, Mapping[str, Any]] = {}
    wanted = set(readable)
    for query in instances_queries(readable):
        for row in rows(query, subscriptions):
            vm = str(row.get("id", "")).strip().lower()
            named = str(row.get("scaleSet") or "").strip().lower()
            if not named or _instance_of(vm, row, wanted) != named:
                continue
            instances[vm] = row
            if len(instances) > MAX_INSTANCES:
                return None
    return instances


def _instance_of(vm: str, row: Mapping[str, Any], wanted: set[str]) -> str:
    """The scale set (of `wanted`) whose instance the row `vm` is, else ""."""
    kind = str(row.get("type", "")).lower()
    if kind == INSTANCES:
        parent, _, instance = vm.rpartition("/virtualmachines/")
        return parent if parent in wanted and _NAME.match(instance) else ""
    if kind == VIRTUAL_MACHINES and _COMPUTE.match(vm):
        named = str(row.get("scaleSet") or "").strip().lower()
        return named if named in wanted else ""
    return ""


def _kind(resource: str) -> str:
    return "scale_set" if resource.split("/")[-2] == "virtualmachinescalesets" else "vm"


def takes(filter_: Mapping[str, Any], vm: Mapping[str, Any]) -> bool:
    """Whether a dynamic scope's filter (keys lower case) takes the VM row `vm`."""
    types = {t.lower() for t in _names(filter_.get("resourcetypes"))}
    if str(vm.get("type", "")).lower() != VIRTUAL_MACHINES or (
        types and VIRTUAL_MACHINES not in types
    ):
        return False
    for key, column in (
        ("resourcegroups", "resourceGroup"),
        ("locations", "location"),
        ("ostypes", "osType"),
    ):
        allowed = {n.lower() for n in _names(filter_.get(key))}
        if allowed and str(vm.get(column, "")).lower() not in allowed:
            return False
    settings = _lower(filter_.get("tagsettings"))
    wanted = _lower(settings.get("tags"))
    if not wanted:
        return True
    tags = {str(k).lower(): str(v) for k, v in _lower(vm.get("tags")).items()}
    hits = [
        name in tags and (not _names(values) or tags[name] in _names(values))
        for name, values in wanted.items()
    ]
    return all(hits) if str(settings.get("filteroperator", "Any")).lower() == "all" else any(hits)


_COMPUTE = re.compile(
    r"^/subscriptions/[0-9a-f-]{36}/resourcegroups/[^/]+/providers/microsoft\.compute/"
    r"(?:virtualmachines|virtualmachinescalesets)/[^/]+$"
)


def _names(value: object) -> list[str]:
    if not isinstance(value, list):
        return []
    return [v.strip() for v in value if isinstance(v, str) and v.strip()]


def _lower(value: object) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k).lower(): v for k, v in value.items()}
