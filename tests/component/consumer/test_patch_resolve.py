"""A patch run's VMs (issue 40, item 1): the configuration's assignments and dynamic scopes,
read through Resource Graph by the real client over HTTPS (the Resource Graph double), paged,
its 429s waited out, and only in the run's trusted subscriptions."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from bridge.consumer.sources.patchruns import RunNotice, resolve, takes
from bridge.consumer.sources.resourcegraph import RequestsTransport, ResourceGraph
from bridge.retry import Backoff
from tests.component.consumer.test_resource_graph import Token
from tests.doubles.resourcegraph import ResourceGraphDouble

SUB = "8d5f9c8e-1111-4222-8333-444455556666"
OTHER = "22222222-2222-2222-2222-222222222222"
CONFIG = (
    f"/subscriptions/{SUB}/resourceGroups/rg-patch/providers/Microsoft.Maintenance/"
    "maintenanceConfigurations/tuesday"
)
START = datetime(2026, 12, 8, 2, 0, tzinfo=timezone.utc)  # a Tuesday


def run(*subscriptions: str) -> RunNotice:
    return RunNotice(
        "pre", f"{CONFIG}/providers/microsoft.maintenance/applyupdates/20261208020000".lower(),
        CONFIG, "20261208020000", START, START + timedelta(hours=3), START - timedelta(minutes=10),
        None, subscriptions or (SUB,), START - timedelta(minutes=35), "d1",
    )  # fmt: skip


def compute(kind: str, name: str, sub: str = SUB, rg: str = "rg-web") -> str:
    return f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/{kind}/{name}"


def assignment(target: str, config: str = CONFIG, sub: str = SUB, **filter_: Any) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "maintenanceConfigurationId": config.lower(),
        "resourceId": target,
    }
    if filter_:
        properties["filter"] = filter_
    return {
        "id": f"{target}/providers/microsoft.maintenance/configurationassignments/a",
        "name": "a", "type": "microsoft.maintenance/configurationassignments",
        "subscriptionId": sub, "resourceGroup": "", "properties": properties,
    }  # fmt: skip


def vm_row(
    name: str, rg: str = "rg-web", *, tags: dict[str, str] | None = None, os: str = "Linux"
) -> dict[str, Any]:
    return {
        "id": compute("virtualMachines", name, SUB, rg), "name": name,
        "type": "microsoft.compute/virtualmachines", "subscriptionId": SUB,
        "resourceGroup": rg, "location": "westeurope", "tags": tags or {}, "osType": os,
    }  # fmt: skip


def client(graph: ResourceGraphDouble, slept: list[float]) -> ResourceGraph:
    def sleep(seconds: float) -> bool:
        slept.append(seconds)
        return True

    return ResourceGraph(graph.url, Token(), RequestsTransport(), sleep=sleep,
                         backoff=Backoff(initial=0.01, maximum=60.0))  # fmt: skip


def test_a_scale_set_and_a_vm_assigned_one_by_one_are_the_runs(graph: ResourceGraphDouble) -> None:
    scale_set = compute("virtualMachineScaleSets", "web")
    graph.tables["maintenanceresources"] += [
        assignment(scale_set),
        assignment(compute("virtualMachines", "db1")),
        assignment(compute("virtualMachines", "other"), config=CONFIG.replace("tuesday", "friday")),
        assignment(compute("availabilitySets", "as1")),  # not a VM nor a scale set
    ]
    resolved = resolve(run(), client(graph, []).rows)
    assert resolved.resources == {scale_set.lower(), compute("virtualMachines", "db1").lower()}
    assert all(r.authorized for r in graph.requests)


def test_a_dynamic_scope_takes_the_vms_its_filter_names_across_pages(
    graph: ResourceGraphDouble,
) -> None:
    graph.tables["maintenanceresources"].append(
        assignment(
            f"/subscriptions/{SUB}",
            resourceTypes=["Microsoft.Compute/virtualMachines"],
            resourceGroups=["rg-web"],
            tagSettings={"filterOperator": "Any", "tags": {"patch": ["tuesday"]}},
        )
    )
    tuesday = [vm_row(f"web{n}", tags={"Patch": "tuesday"}) for n in range(1001)]
    graph.tables["resources"] += [
        *tuesday,
        vm_row("friday", tags={"patch": "friday"}),
        vm_row("elsewhere", rg="rg-db", tags={"patch": "tuesday"}),
    ]
    resolved = resolve(run(), client(graph, []).rows)
    assert resolved.dynamic_scopes == 1
    assert resolved.resources == {str(r["id"]).lower() for r in tuesday}
    assert [r.page for r in graph.requests if r.table == "resources"] == [0, 1]


def test_a_throttled_query_waits_its_retry_after(graph: ResourceGraphDouble) -> None:
    graph.tables["maintenanceresources"].append(assignment(compute("virtualMachines", "db1")))
    graph.throttle, graph.retry_after = 1, 7
    slept: list[float] = []
    resolved = resolve(run(), client(graph, slept).rows)
    assert resolved.resources == {compute("virtualMachines", "db1").lower()}
    assert [r.status for r in graph.requests] == [429, 200]
    assert slept[0] >= 7


def test_vms_of_a_subscription_not_trusted_are_never_the_runs(graph: ResourceGraphDouble) -> None:
    graph.tables["maintenanceresources"] += [
        assignment(compute("virtualMachines", "theirs", sub=OTHER), sub=OTHER),
        assignment(compute("virtualMachines", "mine")),
    ]
    resolved = resolve(run(SUB), client(graph, []).rows)
    assert resolved.resources == {compute("virtualMachines", "mine").lower()}


@pytest.mark.parametrize(
    ("filter_", "row", "taken"),
    [
        ({}, vm_row("a"), True),
        ({"locations": ["northeurope"]}, vm_row("a"), False),
        ({"ostypes": ["Windows"]}, vm_row("a"), False),
        ({"tagsettings": {"filterOperator": "All", "tags": {"a": ["1"], "b": ["2"]}}},
         vm_row("a", tags={"a": "1"}), False),
        ({"tagsettings": {"filterOperator": "Any", "tags": {"a": ["1"], "b": ["2"]}}},
         vm_row("a", tags={"a": "1"}), True),
        ({"tagsettings": {"tags": {"a": []}}}, vm_row("a", tags={"a": "anything"}), True),
        ({"resourcetypes": ["Microsoft.Compute/virtualMachineScaleSets"]}, vm_row("a"), False),
    ],
)  # fmt: skip
def test_a_dynamic_scopes_filter(filter_: dict[str, Any], row: dict[str, Any], taken: bool) -> None:
    assert takes(filter_, row) is taken
