"""Service Health's planned maintenance and AKS's upgrade notices days ahead (issue 40, item 2):
their Resource Graph rows read, malformed ones refused with a sentence while the others are
kept, and the Upcoming records they make, with the budgets their windows would break."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from bridge.consumer.planned import aks_planned, more_upcoming, upcoming_more
from bridge.consumer.sources.planned import (
    AksNotice,
    Cluster,
    Maintenance,
    Pool,
    moment,
    parse_cluster,
    parse_event,
    parse_impacted,
    parse_notice,
    read_aks_notices,
    read_service_health,
)
from bridge.consumer.weekahead import week_ahead
from bridge.policy.model import Budget, VmView
from bridge.policy.patchruns import members
from bridge.policy.upcoming import Planned
from bridge.retry import PermanentError
from tests.support.records import assert_valid
from tests.unit.policy.test_model import NOW, fleet, vm
from tools.kql.workbook import ROOT

SUB = "8d5f9c8e-1111-4222-8333-444455556666"
OTHER = "22222222-2222-2222-2222-222222222222"
TUESDAY = datetime(2024, 6, 18, 2, 0, tzinfo=timezone.utc)  # NOW is Wednesday the 12th
EPOCH = datetime(1, 1, 1, tzinfo=timezone.utc)
ONE = (Budget("one-at-a-time", "scale_set", max_vms=1),)


def ticks(at: datetime) -> int:
    return (at - EPOCH) // timedelta(microseconds=1) * 10


def compute(kind: str, name: str, rg: str = "rg-web", sub: str = SUB) -> str:
    return f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/{kind}/{name}"


def event_row(tracking: str = "PYN_-ZL8", sub: str = SUB, **props: Any) -> dict[str, Any]:
    """A planned maintenance event as Resource Graph keeps it (servicehealthresources)."""
    properties: dict[str, Any] = {
        "EventType": "PlannedMaintenance", "EventSource": "ServiceHealth", "Status": "Active",
        "TrackingId": tracking, "Level": "Warning", "PlatformInitiated": True,
        "Title": "Planned maintenance for Azure Virtual Machines - West Europe",
        "Summary": "<p>A rebootful update of the hosts of your VMs.</p>",
        "ImpactStartTime": ticks(TUESDAY),
        "ImpactMitigationTime": ticks(TUESDAY + timedelta(hours=8)),
        "LastUpdateTime": ticks(NOW - timedelta(days=2)),
        "Impact": [{"ImpactedService": "Virtual Machines",
                    "ImpactedRegions": [{"ImpactedRegion": "West Europe"}]}],
    }  # fmt: skip
    properties.update(props)
    return {
        "id": f"/subscriptions/{sub}/providers/Microsoft.ResourceHealth/events/{tracking}",
        "name": tracking, "type": "microsoft.resourcehealth/events", "subscriptionId": sub,
        "resourceGroup": "", "location": "global", "properties": properties,
    }  # fmt: skip


def impacted_row(
    target: str, *, tracking: str = "PYN_-ZL8", kind: str = "Microsoft.Compute/virtualMachines",
    sub: str = SUB, n: int = 0,
) -> dict[str, Any]:  # fmt: skip
    return {
        "id": f"/subscriptions/{sub}/providers/Microsoft.ResourceHealth/events/{tracking}"
              f"/impactedResources/abc-123-ghj-{n:03d}",
        "name": f"abc-123-ghj-{n:03d}", "type": "microsoft.resourcehealth/events/impactedresources",
        "subscriptionId": sub,
        "properties": {"targetRegion": "westeurope", "targetResourceId": target,
                       "targetResourceType": kind, "resourceName": target.rpartition("/")[2]},
    }  # fmt: skip


CLUSTER = (
    f"/subscriptions/{SUB}/resourcegroups/rg-aks/providers/Microsoft.ContainerService/"
    "managedClusters/aks-prod"
)
NODES_RG = "MC_rg-aks_aks-prod_westeurope"
EVENT_ID = "bbe82027-0444-4f73-897a-0bbfe3af66f1"


def notice_row(
    *, status: str = "Scheduled", at: datetime = TUESDAY, event_id: str = EVENT_ID,
    details: str = "NodeOSUpgrade: the node image of every pool", cluster: str = CLUSTER,
    updated: datetime | None = None, as_text: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """An AKS Communication Manager notice (containerserviceeventresources), camelCase."""
    properties = {
        "description": "ScheduledEvents", "eventId": event_id, "eventSource": "AutoUpgrader",
        "eventStatus": status, "eventDetails": details,
        "scheduledTime": at.strftime("%Y-%m-%dT%H:%M:%S.103268606Z"),
        "startTime": "0001-01-01T00:00:00.0000000Z",
        "lastUpdateTime": (updated or NOW - timedelta(days=1)).strftime(
            "%Y-%m-%dT%H:%M:%S.0000000Z"),
        "resources": [cluster], "resourceType": "ManagedCluster",
    }  # fmt: skip
    return {
        "id": f"{cluster}/scheduledEvents/{event_id}", "name": event_id,
        "type": "microsoft.containerservice/managedclusters/scheduledevents",
        "subscriptionId": cluster.split("/")[2], "location": "westeurope",
        "properties": json.dumps(properties) if as_text else properties,
    }  # fmt: skip


def cluster_row(**pools: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": CLUSTER, "name": "aks-prod", "type": "microsoft.containerservice/managedclusters",
        "subscriptionId": SUB, "resourceGroup": "rg-aks", "location": "westeurope",
        "properties": {"nodeResourceGroup": NODES_RG, "kubernetesVersion": "1.30.5",
                       "agentPoolProfiles": [{"name": n, **p} for n, p in pools.items()]},
    }  # fmt: skip


WEB = [vm(n, vm_id=f"0000000a-0000-4000-8000-00000000000{n}", subscription_id=SUB,
          resource_group="rg-web", scale_set="web") for n in range(4)]  # fmt: skip


def node(pool: str, n: int) -> VmView:
    return vm(
        10 + n + (10 if pool == "user" else 0), name=f"aks-{pool}-1234-vmss00000{n}",
        subscription_id=SUB, resource_group=NODES_RG, scale_set=f"aks-{pool}-1234-vmss",
        node_name=f"aks-{pool}-1234-vmss00000{n}", node_pool=pool,
    )  # fmt: skip


NODES = [node("system", n) for n in range(3)] + [node("user", n) for n in range(4)]


class Graph:
    """Resource Graph as the consumer's client returns its rows: by the query's table."""

    def __init__(self, **tables: list[dict[str, Any]]) -> None:
        self.tables = tables
        self.asked: list[str] = []
        self.failing: set[str] = set()

    def __call__(self, query: str, subscriptions: list[str]) -> Iterable[Mapping[str, Any]]:
        table = query.split("|", 1)[0].strip()
        self.asked.append(table)
        if table in self.failing:
            raise PermanentError("Resource Graph answered 403: AuthorizationFailed")
        return [r for r in self.tables.get(table, []) if r.get("subscriptionId") in subscriptions]


# --- Service Health ---------------------------------------------------------------------------


def test_a_planned_maintenance_event_is_read_with_its_ticks() -> None:
    event = parse_event(event_row())
    assert event.tracking_id == "PYN_-ZL8"
    assert event.title == "Planned maintenance for Azure Virtual Machines - West Europe"
    assert (event.start, event.end) == (TUESDAY, TUESDAY + timedelta(hours=8))
    assert event.subscriptions == {SUB}


def test_times_are_ticks_their_digits_or_iso_text() -> None:
    assert moment(ticks(TUESDAY)) == TUESDAY
    assert moment(str(ticks(TUESDAY))) == TUESDAY
    assert moment("2024-06-18T02:00:00.1234567Z") == TUESDAY + timedelta(microseconds=123456)
    # Microsoft's samples skip ticks of 0 and 1: no time said.
    assert moment(0) is None
    assert moment(1) is None
    assert moment("0001-01-01T00:00:00.0000000Z") is None
    assert moment(True) is None
    assert moment(float("nan")) is None
    assert moment(10**30) is None
    assert moment("next Tuesday") is None


@pytest.mark.parametrize(
    ("row", "said"),
    [
        (event_row(ImpactStartTime=None), "ImpactStartTime None"),
        (event_row(ImpactMitigationTime=ticks(TUESDAY - timedelta(hours=1))), "are not a window"),
        (event_row(TrackingId="x'); drop"), "is not a tracking id"),
        ({**event_row(), "properties": "{not json"}, "properties are not JSON"),
        ({**event_row(), "properties": None}, "has no properties"),
    ],
)
def test_an_event_that_cannot_be_read_is_refused_by_name(row: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError, match="Service Health event") as raised:
        parse_event(row)
    assert said in str(raised.value)


def test_impacted_vms_scale_sets_and_their_instances_count_other_resources_do_not() -> None:
    vm0 = compute("virtualMachines", "vm0")
    instance = compute("virtualMachineScaleSets", "web") + "/virtualMachines/3"
    assert parse_impacted(impacted_row(vm0)) == ("PYN_-ZL8", vm0.lower())
    kind = "Microsoft.Compute/virtualMachineScaleSets/virtualMachines"
    assert parse_impacted(impacted_row(instance, kind=kind)) == ("PYN_-ZL8", instance.lower())
    sql = f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Sql/servers/s/databases/d"
    assert parse_impacted(impacted_row(sql, kind="Microsoft.Sql/servers/databases")) is None
    with pytest.raises(ValueError, match="not a resource of the event's subscription"):
        parse_impacted(impacted_row(compute("virtualMachines", "theirs", sub=OTHER)))
    with pytest.raises(ValueError, match="names no Service Health event"):
        parse_impacted({**impacted_row(vm0), "id": "/subscriptions/x/impactedResources/y"})


def test_the_read_keeps_the_events_ahead_with_their_vms_and_says_what_it_refuses() -> None:
    vm0, vm1 = compute("virtualMachines", "vm0"), compute("virtualMachines", "vm1")
    graph = Graph(servicehealthresources=[
        event_row(),
        event_row(sub=OTHER),  # the same event in a subscription not asked about
        event_row("BAD-1", ImpactStartTime="soon"),
        event_row("DONE-1", Status="Resolved"),
        event_row("PAST-1", ImpactStartTime=ticks(NOW - timedelta(days=3)),
                  ImpactMitigationTime=ticks(NOW - timedelta(days=2))),
        event_row("FAR-1", ImpactStartTime=ticks(NOW + timedelta(days=20)),
                  ImpactMitigationTime=ticks(NOW + timedelta(days=21))),
        event_row("ISSUE-1", EventType="ServiceIssue"),
        event_row("SQL-1"),
        impacted_row(vm0), impacted_row(vm1, n=1),
        {**impacted_row(vm0, n=2), "properties": "{"},
        impacted_row(compute("virtualMachines", "x"), tracking="FAR-1", n=3),
        impacted_row(f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Sql/servers/s",
                     tracking="SQL-1", kind="Microsoft.Sql/servers", n=4),
    ])  # fmt: skip
    found, problems = read_service_health(graph, [SUB.upper()], NOW)
    assert [(m.tracking_id, m.resources) for m in found] == [
        ("PYN_-ZL8", frozenset({vm0.lower(), vm1.lower()}))
    ]
    assert len(problems) == 2
    assert "Service Health event BAD-1" in problems[0]
    assert "'soon'" in problems[0]
    assert "properties are not JSON" in problems[1]
    assert graph.asked == ["servicehealthresources", "servicehealthresources"]


def test_no_event_ahead_costs_no_query_for_impacted_resources() -> None:
    graph = Graph(servicehealthresources=[event_row(Status="Resolved")])
    assert read_service_health(graph, [SUB], NOW) == ([], [])
    assert graph.asked == ["servicehealthresources"]


def _maintenance(*resources: str, start: datetime = TUESDAY) -> Maintenance:
    return Maintenance("PYN_-ZL8", "Planned maintenance for Azure Virtual Machines", start,
                       start + timedelta(hours=8), frozenset({SUB}),
                       frozenset(r.lower() for r in resources))  # fmt: skip


def test_a_record_per_impacted_vm_with_the_budgets_the_window_would_break() -> None:
    scale_set = compute("virtualMachineScaleSets", "web")
    gone = compute("virtualMachines", "gone")
    records = upcoming_more(ONE, fleet(*WEB), [_maintenance(scale_set, gone)], [], NOW,
                            host_name="consumer-1")  # fmt: skip
    for record in records:
        assert_valid(record)
    assert [r["VmName"] for r in records] == ["vm0", "vm1", "vm2", "vm3", "gone"]
    first = records[0]
    assert first["UpcomingSource"] == "ServiceHealth"
    assert first["NoticeId"] == "PYN_-ZL8"
    assert first["NoticeTitle"] == "Planned maintenance for Azure Virtual Machines"
    assert first["MaintenanceConfiguration"] is None
    assert first["WindowStart"] == "2024-06-18T02:00:00.000Z"
    assert first["WindowEnd"] == "2024-06-18T10:00:00.000Z"
    assert first["VmScaleSetName"] == "web"
    assert len(first["BudgetBreaks"]) == 1
    assert first["BudgetBreaks"][0].startswith(
        "PYN_-ZL8 at 2024-06-18 02:00Z: budget one-at-a-time"
    )
    assert "more than the 1 allowed" in first["BudgetBreaks"][0]
    assert records[4]["VmId"] is None
    assert len({r["RecordId"] for r in records}) == 5


def test_a_scale_sets_vm_is_the_fleets_vm_of_that_name_when_its_agent_gave_no_id() -> None:
    named = vm(7, vm_id="0000000a-0000-4000-8000-000000000007", name="web_2",
               subscription_id=SUB, resource_group="rg-web", scale_set="web")  # fmt: skip
    instance = compute("virtualMachineScaleSets", "web") + "/virtualMachines/2"
    records = upcoming_more(ONE, fleet(named), [_maintenance(instance)], [], NOW, host_name="c")
    assert [(r["VmName"], r["VmId"]) for r in records] == [("web_2", named.vm_id)]


def test_the_workbooks_budget_group_view_reads_the_lines_the_records_carry() -> None:
    query = (ROOT / "infra/workbook/queries/next-14-days-breaks-grid.kql").read_text("utf-8")
    patterns = dict(re.findall(r"(\w+) = (?:toint\()?extract\(@\"([^\"]+)\", 1", query))
    assert set(patterns) == {"Budget", "BudgetGroup", "Disruption", "Limit"}
    records = upcoming_more(ONE, fleet(*WEB), [_maintenance(compute("virtualMachineScaleSets",
                            "web"))], [], NOW, host_name="c")  # fmt: skip
    line = records[0]["BudgetBreaks"][0]
    read = {name: re.search(pattern, line) for name, pattern in patterns.items()}
    assert {name: m.group(1) if m else None for name, m in read.items()} == {
        "Budget": "one-at-a-time", "BudgetGroup": f"{SUB}/rg-web/web", "Disruption": "PYN_-ZL8",
        "Limit": "1"}  # fmt: skip


def test_a_maintenance_that_fits_breaks_nothing_and_read_again_is_the_same_record() -> None:
    once = upcoming_more(ONE, fleet(*WEB), [_maintenance(compute("virtualMachines", "vm0"))], [],
                         NOW, host_name="c")  # fmt: skip
    again = upcoming_more(ONE, fleet(*WEB), [_maintenance(compute("virtualMachines", "vm0"))], [],
                          NOW + timedelta(hours=1), host_name="c")  # fmt: skip
    assert [r["VmName"] for r in once] == ["vm0"]
    assert once[0]["BudgetBreaks"] == []
    assert once[0]["RecordId"] == again[0]["RecordId"]


def test_a_maintenance_configurations_run_overlapping_the_window_counts_with_it() -> None:
    vm0, vm1 = compute("virtualMachines", "vm0"), compute("virtualMachines", "vm1")
    config = (f"/subscriptions/{SUB}/resourceGroups/rg-patch/providers/Microsoft.Maintenance/"
              "maintenanceConfigurations/web-tue")  # fmt: skip
    run = Planned(config, TUESDAY + timedelta(hours=1), TUESDAY + timedelta(hours=3),
                  frozenset({vm1.lower()}))  # fmt: skip
    alone = upcoming_more(ONE, fleet(*WEB), [_maintenance(vm0)], [], NOW, host_name="c")
    together = upcoming_more(ONE, fleet(*WEB), [_maintenance(vm0)], [], NOW, host_name="c",
                             alongside=[run])  # fmt: skip
    assert alone[0]["BudgetBreaks"] == []
    assert len(together) == 1  # the run's own records are the maintenance configurations'
    assert "has 1 of 4 VMs impacted" in together[0]["BudgetBreaks"][0]


# --- AKS ----------------------------------------------------------------------------------------


def test_an_aks_notice_is_read_from_its_camel_case_properties_or_their_text() -> None:
    notice = parse_notice(notice_row())
    assert notice.event_id == EVENT_ID
    assert notice.cluster_id == CLUSTER.lower()
    assert notice.cluster_name == "aks-prod"
    assert notice.kind == "NodeOSUpgrade"
    assert notice.status == "Scheduled"
    assert notice.start == TUESDAY + timedelta(microseconds=103268)
    assert notice.end - notice.start == timedelta(hours=4)
    assert parse_notice(notice_row(as_text=True)) == notice
    other = parse_notice(notice_row(details="Start to upgrade security vhd"))
    assert other.kind == "AutoUpgrader"
    k8s = parse_notice(notice_row(details=json.dumps({"upgradeType": "K8sVersionUpgrade"})))
    assert k8s.kind == "K8sVersionUpgrade"


@pytest.mark.parametrize(
    ("row", "said"),
    [
        ({**notice_row(), "id": f"/subscriptions/{SUB}/scheduledEvents/{EVENT_ID}"},
         "names no managed cluster"),
        ({**notice_row(), "properties": 7}, "has no properties"),
        ({**notice_row(), "properties": {"eventStatus": "Scheduled"}}, "scheduledTime None"),
        ({**notice_row(), "properties": {"scheduledTime": "2024-06-18T02:00:00Z"}},
         "no eventStatus"),
    ],
)  # fmt: skip
def test_a_notice_that_cannot_be_read_is_refused_by_name(row: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError, match="AKS notice") as raised:
        parse_notice(row)
    assert said in str(raised.value)


@pytest.mark.parametrize(
    ("pool", "nodes", "batch"),
    [
        (Pool("a", 3, "33%"), 3, 1),
        (Pool("a", 3, "50%"), 3, 2),
        (Pool("a", 4, "5"), 4, 4),  # never more than the pool
        (Pool("a", 20), 20, 2),  # AKS's default: 10%, rounded up
        (Pool("a", 4), 4, 1),
        (Pool("a", 4, "0", "2"), 4, 2),  # maxUnavailable without surge
        (Pool("a", 0, "33%"), 6, 2),  # the pool's count unknown: the nodes known
        (Pool("a", 4, "many"), 4, 1),
    ],
)
def test_an_upgrade_drains_a_batch_of_each_pool_at_once(pool: Pool, nodes: int, batch: int) -> None:
    assert pool.batch(nodes) == batch


def test_a_clusters_row_gives_its_node_resource_group_and_pools() -> None:
    cluster = parse_cluster(cluster_row(system={"count": 3, "upgradeSettings": {"maxSurge": "33%"}},
                                        user={"count": 4}))  # fmt: skip
    assert cluster.node_resource_group == NODES_RG
    assert cluster.pool("USER") == Pool("user", 4)
    assert cluster.pool("system").max_surge == "33%"
    with pytest.raises(ValueError, match="names no nodeResourceGroup"):
        parse_cluster({**cluster_row(), "properties": {"agentPoolProfiles": []}})


def _cluster(**pools: Pool) -> Cluster:
    return Cluster(CLUSTER.lower(), NODES_RG, tuple(pools.values()))


def _notice(cluster: Cluster | None, at: datetime = TUESDAY) -> AksNotice:
    return AksNotice(EVENT_ID, CLUSTER.lower(), "NodeOSUpgrade", "NodeOSUpgrade of every pool",
                     "Scheduled", at, None, cluster, resource_id=CLUSTER)  # fmt: skip


def test_an_upgrade_counts_each_pools_batch_of_the_clusters_nodes() -> None:
    cluster = _cluster(system=Pool("system", 3, "33%"), user=Pool("user", 4, "2"))
    planned = aks_planned(_notice(cluster), fleet(*NODES, *WEB))
    assert planned.name == "aks-prod NodeOSUpgrade"
    assert (planned.start, planned.end) == (TUESDAY, TUESDAY + timedelta(hours=4))
    known, unknown = members(planned.resources, [*NODES, *WEB])
    assert unknown == []
    assert sorted(v.name for v in NODES if v.vm_id in known) == [
        "aks-system-1234-vmss000000",
        "aks-user-1234-vmss000000",
        "aks-user-1234-vmss000001",
    ]


def test_a_record_per_cluster_naming_the_budget_its_upgrade_would_break() -> None:
    cluster = _cluster(system=Pool("system", 3, "33%"), user=Pool("user", 4, "2"))
    records = upcoming_more(ONE, fleet(*NODES), [], [_notice(cluster)], NOW, host_name="c")
    assert len(records) == 1
    record = records[0]
    assert_valid(record)
    assert record["UpcomingSource"] == "AksUpgrade"
    assert record["AksCluster"] == CLUSTER
    assert record["ResourceId"] == CLUSTER
    assert record["SubscriptionId"] == SUB
    assert record["ResourceGroup"] == "rg-aks"
    assert record["VmName"] is None
    assert record["NoticeId"] == EVENT_ID
    assert record["NoticeKind"] == "NodeOSUpgrade"
    assert record["WindowEnd"] == "2024-06-18T06:00:00.000Z"
    # The user pool drains 2 nodes at once: over one-at-a-time; the system pool's 1 fits.
    assert len(record["BudgetBreaks"]) == 1
    assert "aks-user-1234-vmss" in record["BudgetBreaks"][0]
    assert "patches 2 of them at once" in record["BudgetBreaks"][0]


def test_a_cluster_whose_row_is_unknown_counts_its_tagged_nodes_with_the_default_surge() -> None:
    tagged = [
        replace(
            v,
            resource_group="custom-nodes",
            tags={"aks-managed-cluster-name": "aks-prod", "aks-managed-cluster-rg": "rg-aks"},
        )
        for v in NODES
    ]
    planned = aks_planned(_notice(None), fleet(*tagged))
    assert len(planned.resources) == 2  # a node of each pool: 10% of 3 and of 4, rounded up
    assert aks_planned(_notice(None), fleet(*WEB)).resources == frozenset()


def test_the_read_drops_notices_whose_event_has_moved_on_and_keeps_the_latest() -> None:
    moved = "5bdb52cf-5489-4845-86c8-7fe94a4fc6c1"
    graph = Graph(
        containerserviceeventresources=[
            notice_row(),
            notice_row(at=TUESDAY + timedelta(days=1), updated=NOW),  # rescheduled later
            notice_row(event_id=moved),
            notice_row(event_id=moved, status="Canceled", updated=NOW),
            notice_row(event_id="far", at=NOW + timedelta(days=30)),
            {**notice_row(event_id="broken"), "properties": {"eventStatus": "Scheduled"}},
            notice_row(cluster=CLUSTER.replace(SUB, OTHER), event_id="theirs"),
        ],
        resources=[cluster_row(user={"count": 4, "upgradeSettings": {"maxSurge": "2"}})],
    )
    notices, problems = read_aks_notices(graph, [SUB], NOW)
    assert [(n.event_id, n.start.date()) for n in notices] == [
        (EVENT_ID, TUESDAY.date() + timedelta(days=1))
    ]
    assert notices[0].cluster is not None
    assert notices[0].cluster.pool("user").max_surge == "2"
    assert len(problems) == 1
    assert "AKS notice broken" in problems[0]
    assert graph.asked == ["containerserviceeventresources", "resources"]


# --- Both, as the week ahead reads them ---------------------------------------------------------


def test_more_upcoming_reads_both_sources_and_one_failing_loses_not_the_other() -> None:
    vm0 = compute("virtualMachines", "vm0")
    graph = Graph(
        servicehealthresources=[event_row(), impacted_row(vm0)],
        containerserviceeventresources=[notice_row()],
        resources=[cluster_row(system={"count": 3}, user={"count": 4})],
    )
    records, problems = more_upcoming(graph, [SUB], fleet(*WEB, *NODES), ONE, NOW, "c")
    assert problems == []
    assert [(r["UpcomingSource"], r["VmName"]) for r in records] == [
        ("ServiceHealth", "vm0"), ("AksUpgrade", None)]  # fmt: skip
    graph.failing = {"servicehealthresources"}
    records, problems = more_upcoming(graph, [SUB], fleet(*WEB, *NODES), ONE, NOW, "c")
    assert [r["UpcomingSource"] for r in records] == ["AksUpgrade"]
    assert len(problems) == 1
    assert "Service Health's planned maintenance was not read" in problems[0]
    assert "403" in problems[0]


TWO = (Budget("two-at-a-time", "scale_set", max_vms=2),)
WEB_TUE = (f"/subscriptions/{SUB}/resourceGroups/rg-patch/providers/Microsoft.Maintenance/"
           "maintenanceConfigurations/web-tue")  # fmt: skip


def _configuration_rows(*vms: str) -> dict[str, list[dict[str, Any]]]:
    """A Tuesday 03:00 UTC configuration assigned to `vms` one by one, as Resource Graph
    holds them (bridge.policy.upcoming.parse_schedule's sample, bridge.consumer.sources.
    patchruns' assignment rows)."""
    configuration = {
        "id": WEB_TUE, "name": "web-tue", "type": "microsoft.maintenance/maintenanceconfigurations",
        "subscriptionId": SUB, "properties": {"maintenanceScope": "InGuestPatch",
            "maintenanceWindow": {"startDateTime": "2024-06-01 03:00", "duration": "03:00",
                                  "timeZone": "UTC", "recurEvery": "Week Tuesday"}},
    }  # fmt: skip
    assignments = [{
        "id": f"{vm}/providers/Microsoft.Maintenance/configurationAssignments/a{n}",
        "type": "microsoft.maintenance/configurationassignments", "subscriptionId": SUB,
        "properties": {"maintenanceConfigurationId": WEB_TUE, "resourceId": vm},
    } for n, vm in enumerate(vms)]  # fmt: skip
    return {"resources": [configuration], "maintenanceresources": assignments}


def test_a_configurations_records_count_the_other_sources_windows_and_name_them() -> None:
    vm0, vm1, vm2 = (compute("virtualMachines", f"vm{n}") for n in range(3))
    alone = Graph(**_configuration_rows(vm0, vm1))
    fitted, _ = week_ahead(alone, [SUB], fleet(*WEB), TWO, NOW, host_name="c")
    assert [r["BudgetBreaks"] for r in fitted] == [[]] * 4  # two Tuesdays of vm0 and vm1
    graph = Graph(**_configuration_rows(vm0, vm1),
                  servicehealthresources=[event_row(), impacted_row(vm2)])  # fmt: skip
    records, problems = week_ahead(graph, [SUB], fleet(*WEB), TWO, NOW, host_name="c")
    assert problems == []
    for record in records:
        assert_valid(record)
    said = {(r["UpcomingSource"], r["VmName"], r["WindowStart"]): r["BudgetBreaks"]
            for r in records}  # fmt: skip
    group = f"{SUB}/rg-web/web"
    assert said[("MaintenanceConfiguration", "vm0", "2024-06-18T03:00:00.000Z")] == [
        f"web-tue at 2024-06-18 03:00Z: budget two-at-a-time: {group} has 1 of 4 VMs impacted; "
        "the run patches 2 of them at once, more than the 2 allowed; with Service Health's "
        "planned maintenance PYN_-ZL8 (1 VM)"
    ]
    assert said[("MaintenanceConfiguration", "vm1", "2024-06-25T03:00:00.000Z")] == []
    assert said[("ServiceHealth", "vm2", "2024-06-18T02:00:00.000Z")] == [
        f"PYN_-ZL8 at 2024-06-18 02:00Z: budget two-at-a-time: {group} has 2 of 4 VMs "
        "impacted; the run patches 1 of them at once, more than the 2 allowed; with "
        "maintenance configuration web-tue's run at 2024-06-18 03:00Z (2 VMs)"
    ]


def test_an_aks_upgrade_overlapping_a_run_is_named_in_the_runs_break() -> None:
    nodes = [compute("virtualMachines", v.name, rg=NODES_RG) for v in NODES[4:6]]
    graph = Graph(**_configuration_rows(*nodes), containerserviceeventresources=[
        notice_row(at=TUESDAY + timedelta(hours=2))])  # fmt: skip
    graph.tables["resources"].append(cluster_row(system={"count": 3}, user={"count": 4}))
    records, _ = week_ahead(graph, [SUB], fleet(*NODES), TWO, NOW, host_name="c")
    run = next(r for r in records if r["UpcomingSource"] == "MaintenanceConfiguration")
    assert run["BudgetBreaks"][0].endswith(
        "more than the 2 allowed; with AKS upgrade aks-prod NodeOSUpgrade (1 VM)"
    )
