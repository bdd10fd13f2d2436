"""A patch run's VMs (issue 40, item 1): the configuration's assignments and dynamic scopes,
read through Resource Graph by the real client over HTTPS (the Resource Graph double), paged,
its 429s waited out, and only in the run's trusted subscriptions."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from bridge.consumer.sources import patchruns as patchruns_source
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
    # The assignments' query (then where db1 is: one more query, issue 40's leftover 2).
    assert [r.status for r in graph.requests if r.table == "maintenanceresources"] == [429, 200]
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


# Issue 40 leftovers 1 and 2: a scale set counts instance by instance, agent or not, and each
# VM's scale set is read where Resource Graph holds it.

SET = compute("virtualMachineScaleSets", "web").lower()
FLEX = compute("virtualMachineScaleSets", "flex").lower()


def instance_row(n: int, scale_set: str = SET) -> dict[str, Any]:
    """A Uniform set's instance as `computeresources` holds it, with the projected scaleSet."""
    return {
        "id": f"{scale_set}/virtualmachines/{n}", "name": f"web_{n}",
        "type": "microsoft.compute/virtualmachinescalesets/virtualmachines",
        "subscriptionId": SUB, "resourceGroup": "rg-web", "scaleSet": scale_set,
    }  # fmt: skip


def flexible_row(name: str, scale_set: str = FLEX) -> dict[str, Any]:
    """A Flexible set's VM as `resources` holds it, with the projected scaleSet."""
    return {**vm_row(name), "scaleSet": scale_set}


def test_a_scale_set_counts_each_instance_uniform_or_flexible_across_pages(
    graph: ResourceGraphDouble,
) -> None:
    graph.tables["maintenanceresources"] += [assignment(SET), assignment(FLEX)]
    uniform = [instance_row(n) for n in range(1001)]
    graph.tables["computeresources"] = [*uniform, instance_row(0, SET + "x")]
    graph.tables["resources"] += [flexible_row("flex_a"), flexible_row("flex_b"),
                                  flexible_row("other", scale_set=SET + "x")]  # fmt: skip
    resolved = resolve(run(), client(graph, []).rows)
    flexible = {compute("virtualMachines", n).lower() for n in ("flex_a", "flex_b")}
    assert resolved.resources == {SET, FLEX} | {r["id"] for r in uniform} | flexible
    assert resolved.whole == {SET, FLEX}
    assert resolved.unread == frozenset()
    assert {resolved.placed[r["id"]] for r in uniform} == {"web"}
    assert {resolved.placed[v] for v in flexible} == {"flex"}
    assert [r.page for r in graph.requests if r.table == "computeresources"] == [0, 1]


def test_instances_that_cannot_be_read_leave_the_set_unread_worst_case(
    graph: ResourceGraphDouble,
) -> None:
    graph.tables["maintenanceresources"].append(assignment(SET))
    graph.refuse["computeresources"] = 403
    resolved = resolve(run(), client(graph, []).rows)
    assert resolved.resources == {SET}
    assert resolved.whole == frozenset()
    assert resolved.unread == {SET}
    assert any("could not be read" in n and "worst case" in n for n in resolved.notes)


def test_more_instances_than_the_bound_leave_the_set_unread(
    graph: ResourceGraphDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(patchruns_source, "MAX_INSTANCES", 3)
    graph.tables["maintenanceresources"].append(assignment(SET))
    graph.tables["computeresources"] = [instance_row(n) for n in range(5)]
    resolved = resolve(run(), client(graph, []).rows)
    assert resolved.resources == {SET}
    assert resolved.unread == {SET}
    assert any("more than 3 instances" in n for n in resolved.notes)


def test_the_scale_set_of_each_vm_is_read_where_resource_graph_holds_it(
    graph: ResourceGraphDouble,
) -> None:
    alone, in_flex = compute("virtualMachines", "db1"), compute("virtualMachines", "flex_a")
    graph.tables["maintenanceresources"] += [
        assignment(alone), assignment(in_flex),
        assignment(compute("virtualMachines", "ghost")),  # Resource Graph has no row of it
    ]  # fmt: skip
    graph.tables["resources"] += [{**vm_row("db1"), "scaleSet": ""}, flexible_row("flex_a")]
    resolved = resolve(run(), client(graph, []).rows)
    assert resolved.placed == {alone.lower(): "", in_flex.lower(): "flex"}
