"""The week ahead's other sources (issue 40, item 2; docs/planned-disruptions.md): Upcoming
records for Service Health's planned maintenance (a record per impacted VM) and for AKS's
upgrade notices (a record per cluster), each naming the budgets its window would break. The
budget arithmetic is the maintenance configurations' runs' (bridge.policy.upcoming.ahead, the
patch-run gate's): each disruption is a run over its window, and the disruptions (and the runs
`alongside`) whose windows overlap count together.

Service Health does not say in which order Azure takes the VMs it names within its window:
they count as impacted at once, the worst case. An AKS upgrade drains each pool's batch
(sources.planned.Pool.batch) at once; which nodes go together is AKS's choice, so the batch
counted is the pool's first nodes by name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from bridge import recordtypes as rt
from bridge.consumer.decisionrecord import identity_of
from bridge.consumer.sources.patchruns import Rows
from bridge.consumer.sources.planned import (
    AksNotice,
    Maintenance,
    Pool,
    read_aks_notices,
    read_service_health,
)
from bridge.policy.groups import pool_of
from bridge.policy.model import Budget, FleetView, VmView
from bridge.policy.patchruns import index_of, vm_ids
from bridge.policy.upcoming import Planned, ahead, upcoming
from bridge.records import Origin, VmIdentity, iso, record_id
from bridge.retry import PermanentError, RetryableError

SERVICE_HEALTH = "servicehealth/"
AKS = "aks/"
CLUSTER_NAME_TAG = "aks-managed-cluster-name"
CLUSTER_RG_TAG = "aks-managed-cluster-rg"
T = TypeVar("T")
_INSTANCE = re.compile(
    r"^(?P<base>/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.compute/)"
    r"virtualmachinescalesets/(?P<set>[^/]+)/virtualmachines/(?P<n>\d+)$"
)


def maintenance_planned(maintenance: Maintenance, index: Mapping[str, frozenset[str]]) -> Planned:
    """A planned maintenance as the budgets see a run: its window, the resources it names
    (`index`: the fleet's index_of)."""
    resources = frozenset(_known_as(r, index) for r in maintenance.resources)
    return Planned(SERVICE_HEALTH + maintenance.tracking_id, maintenance.start,
                   maintenance.end, resources, "ServiceHealth")  # fmt: skip


def _known_as(resource: str, index: Mapping[str, frozenset[str]]) -> str:
    """A scale set's VM (.../virtualmachinescalesets/web/virtualmachines/3) by the id the fleet
    knows it by when its agent gave no resource id: the VM's name, web_3, as IMDS names it."""
    found = _INSTANCE.match(resource)
    if resource in index or found is None:
        return resource
    named = f"{found.group('base')}virtualmachines/{found.group('set')}_{found.group('n')}"
    return named if named in index else resource


def _tag(vm: VmView, name: str) -> str:
    return next((v for k, v in vm.tags.items() if k.lower() == name), "").lower()


def cluster_nodes(notice: AksNotice, fleet: FleetView) -> list[VmView]:
    """The fleet's VMs that are nodes of the notice's cluster: in its node resource group (as
    the cluster's row names it), or tagged by AKS with its name and resource group."""
    node_group = notice.cluster.node_resource_group.lower() if notice.cluster else None
    name, group = notice.cluster_name.lower(), notice.resource_group.lower()
    return [
        vm
        for vm in fleet.vms.values()
        if (vm.subscription_id or "").lower() == notice.subscription
        and (
            (node_group is not None and (vm.resource_group or "").lower() == node_group)
            or (_tag(vm, CLUSTER_NAME_TAG) == name and _tag(vm, CLUSTER_RG_TAG) == group)
        )
    ]


def aks_planned(notice: AksNotice, fleet: FleetView) -> Planned:
    """An upgrade as the budgets see a run: its window and, of each pool, the batch of nodes
    it drains at once (the pool's first nodes by name)."""
    pools: dict[str, list[VmView]] = {}
    for vm in cluster_nodes(notice, fleet):
        pools.setdefault(pool_of(vm) or vm.scale_set or "", []).append(vm)
    resources: set[str] = set()
    for name, nodes in sorted(pools.items()):
        settings = notice.cluster.pool(name) if notice.cluster else Pool(name, 0)
        for vm in sorted(nodes, key=lambda v: v.name)[: settings.batch(len(nodes))]:
            resources.update(vm_ids(vm)[:1])
    label = f"{AKS}{notice.cluster_name} {notice.kind}"
    return Planned(label, notice.start, notice.end, frozenset(resources), "AksUpgrade")


def upcoming_more(
    budgets: Sequence[Budget],
    fleet: FleetView,
    maintenance: Sequence[Maintenance],
    notices: Sequence[AksNotice],
    now: datetime,
    *,
    host_name: str,
    alongside: Sequence[Planned] = (),
) -> list[rt.Upcoming]:
    """An Upcoming record per VM a planned maintenance names and per cluster an upgrade is
    scheduled for, each with the budgets its window would break, counting the other
    disruptions and the runs `alongside` (the maintenance configurations', which have their
    own records) whose windows overlap it."""
    index = index_of(fleet.vms.values())
    planned = [maintenance_planned(m, index) for m in maintenance]
    by_notice = [(n, aks_planned(n, fleet)) for n in notices]
    runs = [*planned, *(p for _, p in by_notice)]
    broken: dict[tuple[str, datetime], list[str]] = {}
    for breach in ahead(budgets, fleet, runs, now, alongside=alongside):
        broken.setdefault((breach.configuration, breach.start), []).append(breach.line)
    events = {(p.name, p.start): m for p, m in zip(planned, maintenance, strict=True)}
    records: list[rt.Upcoming] = []
    for row in upcoming(fleet, planned):
        event = events[(row.configuration, row.start)]
        vm = fleet.vms.get(row.vm_id) if row.vm_id else None
        identity = identity_of(vm) if vm else VmIdentity(vm_name=row.vm)
        rid = record_id("upcoming", "servicehealth", event.tracking_id.lower(),
                        row.vm_id or row.vm)  # fmt: skip
        records.append({
            **Origin(identity, host_name).common("Upcoming", rid, now),
            rt.RECORD_TYPE: "Upcoming",
            "UpcomingSource": "ServiceHealth",
            "MaintenanceConfiguration": None,
            "MaintenanceConfigurationId": None,
            "WindowStart": iso(event.start),
            "WindowEnd": iso(event.end),
            "BudgetBreaks": list(broken.get((row.configuration, row.start), [])),
            "NoticeId": event.tracking_id,
            "NoticeTitle": event.title,
            "NoticeKind": None,
            "AksCluster": None,
        })  # fmt: skip
    for notice, aks in by_notice:
        cluster_id = notice.cluster_resource_id
        identity = VmIdentity(
            resource_id=cluster_id,
            subscription_id=cluster_id.split("/")[2],
            resource_group=cluster_id.split("/")[4],
        )
        rid = record_id("upcoming", "aksupgrade", notice.event_id.lower(), notice.cluster_id)
        records.append({
            **Origin(identity, host_name).common("Upcoming", rid, now),
            rt.RECORD_TYPE: "Upcoming",
            "UpcomingSource": "AksUpgrade",
            "MaintenanceConfiguration": None,
            "MaintenanceConfigurationId": None,
            "WindowStart": iso(notice.start),
            "WindowEnd": iso(notice.end),
            "BudgetBreaks": broken.get((aks.name, aks.start), []),
            "NoticeId": notice.event_id,
            "NoticeTitle": notice.title,
            "NoticeKind": notice.kind,
            "AksCluster": cluster_id,
        })  # fmt: skip
    return records


def _read(  # noqa: PLR0917 - a reader's arguments and where its sentences go
    what: str,
    reader: Callable[[Rows, Sequence[str], datetime], tuple[list[T], list[str]]],
    rows: Rows,
    subscriptions: Sequence[str],
    now: datetime,
    problems: list[str],
) -> list[T]:
    """What `reader` reads, its sentences added to `problems`; nothing, and a sentence, when
    Resource Graph does not answer for it."""
    try:
        found, said = reader(rows, subscriptions, now)
    except (RetryableError, PermanentError) as err:
        problems.append(
            f"{what} not read: {err} (the consumer's identity needs Reader on the subscriptions)"
        )
        return []
    problems += said
    return found


@dataclass(frozen=True)
class MoreAhead:
    """What the other sources tell of the days ahead."""

    maintenance: list[Maintenance]
    notices: list[AksNotice]
    problems: list[str]

    def planned(self, fleet: FleetView) -> list[Planned]:
        """Their windows as the budgets count them (`fleet`'s VMs)."""
        index = index_of(fleet.vms.values())
        return [*(maintenance_planned(m, index) for m in self.maintenance),
                *(aks_planned(n, fleet) for n in self.notices)]  # fmt: skip


def read_more(rows: Rows, subscriptions: Sequence[str], now: datetime) -> MoreAhead:
    """Service Health's planned maintenance and AKS's upgrade notices in `subscriptions`
    within 14 days, and a sentence per row or source that cannot be read (a source Resource
    Graph does not answer for is said and the other is still read)."""
    problems: list[str] = []
    maintenance = _read("Service Health's planned maintenance was", read_service_health, rows,
                        subscriptions, now, problems)  # fmt: skip
    notices = _read("AKS's upgrade notices were", read_aks_notices, rows, subscriptions, now,
                    problems)  # fmt: skip
    return MoreAhead(maintenance, notices, problems)


def more_upcoming(  # noqa: PLR0917 - the week ahead's call, as read_runs'
    rows: Rows,
    subscriptions: Sequence[str],
    fleet: FleetView,
    budgets: Sequence[Budget],
    now: datetime,
    host_name: str,
    *,
    alongside: Sequence[Planned] = (),
) -> tuple[list[rt.Upcoming], list[str]]:
    """The Upcoming records of Service Health's planned maintenance and AKS's upgrade notices
    in `subscriptions` within 14 days, and a sentence per row or source that cannot be read.
    `rows(query, subscriptions)` is ResourceGraph.rows; a source Resource Graph does not
    answer for is said and the other is still read. `alongside`: the maintenance
    configurations' runs (weekahead.read_runs), counted where their windows overlap."""
    more = read_more(rows, subscriptions, now)
    records = upcoming_more(budgets, fleet, more.maintenance, more.notices, now,
                            host_name=host_name, alongside=alongside)  # fmt: skip
    return records, more.problems
