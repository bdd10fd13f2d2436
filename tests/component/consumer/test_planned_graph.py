"""The week ahead's other sources over the wire (issue 40, item 2): Service Health's planned
maintenance and AKS's upgrade notices read by the real Resource Graph client over HTTPS (the
Resource Graph double), paged, its 429s waited out, only in the subscriptions asked about, and
turned into Upcoming records with the budgets their windows would break."""

from __future__ import annotations

from datetime import timedelta

from bridge.consumer.planned import more_upcoming
from bridge.consumer.sources.planned import read_aks_notices, read_service_health
from bridge.consumer.sources.resourcegraph import RequestsTransport, ResourceGraph
from bridge.retry import Backoff
from tests.component.consumer.test_resource_graph import Token
from tests.doubles.resourcegraph import ResourceGraphDouble
from tests.support.records import assert_valid
from tests.unit.consumer.test_planned import (
    CLUSTER,
    EVENT_ID,
    NODES,
    ONE,
    OTHER,
    SUB,
    TUESDAY,
    WEB,
    cluster_row,
    compute,
    event_row,
    impacted_row,
    notice_row,
)
from tests.unit.policy.test_model import NOW, fleet


def client(graph: ResourceGraphDouble, slept: list[float] | None = None) -> ResourceGraph:
    def sleep(seconds: float) -> bool:
        (slept if slept is not None else []).append(seconds)
        return True

    return ResourceGraph(graph.url, Token(), RequestsTransport(), sleep=sleep,
                         backoff=Backoff(initial=0.01, maximum=60.0))  # fmt: skip


def test_planned_maintenance_and_its_impacted_vms_come_across_pages(
    graph: ResourceGraphDouble,
) -> None:
    vms = [compute("virtualMachines", f"web{n}") for n in range(1001)]
    graph.tables["servicehealthresources"] += [
        event_row(),
        event_row("OTHER-1"),  # no compute resource of it: not ahead of any VM
        event_row(sub=OTHER),
        *(impacted_row(v, n=n) for n, v in enumerate(vms)),
        impacted_row(compute("virtualMachines", "theirs", sub=OTHER), sub=OTHER),
    ]
    found, problems = read_service_health(client(graph).rows, [SUB], NOW)
    assert problems == []
    assert [m.tracking_id for m in found] == ["PYN_-ZL8"]
    assert found[0].resources == {v.lower() for v in vms}
    assert [(r.table, r.page) for r in graph.requests] == [
        ("servicehealthresources", 0), ("servicehealthresources", 0),
        ("servicehealthresources", 1)]  # fmt: skip
    assert all(r.authorized and r.status == 200 for r in graph.requests)


def test_aks_notices_and_their_clusters_pools_come_over_the_wire_429_waited(
    graph: ResourceGraphDouble,
) -> None:
    graph.tables["containerserviceeventresources"] += [
        notice_row(),
        notice_row(event_id="theirs", cluster=CLUSTER.replace(SUB, OTHER)),
        {**notice_row(event_id="broken"), "properties": "{"},
    ]
    graph.tables["resources"].append(cluster_row(user={"count": 4, "upgradeSettings": {
        "maxSurge": "50%"}}))  # fmt: skip
    graph.throttle, graph.retry_after = 1, 3
    slept: list[float] = []
    notices, problems = read_aks_notices(client(graph, slept).rows, [SUB], NOW)
    assert [(n.event_id, n.kind, n.start.date()) for n in notices] == [
        (EVENT_ID, "NodeOSUpgrade", TUESDAY.date())]  # fmt: skip
    assert notices[0].cluster is not None
    assert notices[0].cluster.pool("user").batch(4) == 2
    assert len(problems) == 1
    assert "AKS notice 'broken'" in problems[0]
    assert [r.status for r in graph.requests] == [429, 200, 200]
    assert slept[0] >= 3


def test_the_week_aheads_records_of_both_sources_over_https(graph: ResourceGraphDouble) -> None:
    graph.tables["servicehealthresources"] += [
        event_row(), impacted_row(compute("virtualMachineScaleSets", "web"),
                                  kind="Microsoft.Compute/virtualMachineScaleSets")]  # fmt: skip
    graph.tables["containerserviceeventresources"].append(notice_row())
    graph.tables["resources"].append(cluster_row(
        system={"count": 3, "upgradeSettings": {"maxSurge": "1"}},
        user={"count": 4, "upgradeSettings": {"maxSurge": "1"}}))  # fmt: skip
    records, problems = more_upcoming(client(graph).rows, [SUB], fleet(*WEB, *NODES), ONE, NOW,
                                      "consumer-1")  # fmt: skip
    assert problems == []
    for record in records:
        assert_valid(record)
    assert [(r["UpcomingSource"], r["VmName"]) for r in records] == [
        ("ServiceHealth", "vm0"), ("ServiceHealth", "vm1"), ("ServiceHealth", "vm2"),
        ("ServiceHealth", "vm3"), ("AksUpgrade", None)]  # fmt: skip
    # The scale set's 4 VMs at once break one-at-a-time; the upgrade drains one node a pool.
    assert all(len(r["BudgetBreaks"]) == 1 for r in records[:4])
    assert records[4]["BudgetBreaks"] == []
    assert records[4]["WindowStart"].startswith("2024-06-18T02:00:00")
    again, _ = more_upcoming(client(graph).rows, [SUB], fleet(*WEB, *NODES), ONE,
                             NOW + timedelta(hours=1), "consumer-1")  # fmt: skip
    assert [r["RecordId"] for r in again] == [r["RecordId"] for r in records]
