"""A patch run's VMs in the budgets (issue 40, item 1): counted from the run's start to its
post-event, or to its window's end and the grace when the post-event never comes; never
before the start, never once cancelled. Pure."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from bridge.policy.budgets import check_budgets
from bridge.policy.model import Budget, FleetView
from bridge.policy.patchruns import RunView, counted, counted_until, impact, members
from tests.unit.policy.test_model import NOW, event, vm

MIN = timedelta(minutes=1)
GRACE = 30 * MIN
BASE = "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/"
SET = BASE + "virtualmachinescalesets/web"
START, END = NOW + 35 * MIN, NOW + 35 * MIN + timedelta(hours=3)
RUN = RunView("run1", "cfg", START, END, START - 10 * MIN, frozenset({SET}))
VMS = {f"id{n}": vm(n, subscription_id="s", scale_set="web") for n in range(4)}
FOUR = frozenset(VMS)


def test_a_run_counts_nothing_before_its_start() -> None:
    assert impact([RUN], VMS, START - 1 * MIN / 60, GRACE) == {}


def test_a_run_counts_its_scale_sets_vms_from_its_start() -> None:
    assert impact([RUN], VMS, START, GRACE) == {"patch:run1": FOUR}


def test_a_run_counts_until_its_post_event() -> None:
    done = replace(RUN, post_at=START + 50 * MIN)
    assert impact([done], VMS, START + 49 * MIN, GRACE) == {"patch:run1": FOUR}
    assert impact([done], VMS, START + 50 * MIN, GRACE) == {}


def test_a_run_whose_post_event_never_comes_counts_to_its_end_and_the_grace() -> None:
    assert counted_until(RUN, GRACE) == END + GRACE
    assert impact([RUN], VMS, END + GRACE - 1 * MIN / 60, GRACE) == {"patch:run1": FOUR}
    assert impact([RUN], VMS, END + GRACE, GRACE) == {}


def test_a_cancelled_run_counts_nothing() -> None:
    assert impact([replace(RUN, cancelled=True)], VMS, START, GRACE) == {}


def test_a_vm_is_found_by_its_own_id_or_its_scale_sets() -> None:
    alone = vm(9, subscription_id="s", resource_id=BASE + "virtualmachines/db1")
    named = vm(8, subscription_id="s")  # no resource id said: built from its name
    resources = frozenset({BASE + "virtualmachines/db1", BASE + "virtualmachines/vm8", SET})
    found, unknown = members(resources, [alone, named, *VMS.values()])
    assert found == {"id9", "id8", *FOUR}
    assert unknown == []


def test_vms_no_agent_reports_count_by_name() -> None:
    resources = frozenset({BASE + "virtualmachines/lonely", SET})
    found, unknown = members(resources, [])
    assert found == set()
    assert unknown == ["lonely", "web"]


# Issue 40 leftovers 1 and 2: every instance of a scale set counts, agent or not, and a name
# no agent reports counts where Resource Graph says it is, anywhere only when it cannot say.

DB = BASE.replace("/rg/", "/rg-db/")
INSTANCES = frozenset(f"{SET}/virtualmachines/{n}" for n in range(4))


def test_a_read_scale_set_counts_its_instances_by_name_never_its_own_name() -> None:
    found, unknown = members(INSTANCES | {SET}, [], whole=frozenset({SET}))
    assert (found, unknown) == (frozenset(), ["web_0", "web_1", "web_2", "web_3"])
    # Its agents' VMs count too, found by the instance id a Uniform name gives.
    agents = [vm(n, name=f"web_{n}", subscription_id="s", scale_set="web") for n in range(2)]
    found, unknown = members(INSTANCES | {SET}, agents, whole=frozenset({SET}))
    assert found == {"id0", "id1"}
    assert unknown == ["web_2", "web_3"]


def test_names_resource_graph_placed_count_where_they_are_and_the_rest_anywhere() -> None:
    run = replace(
        RUN,
        resources=INSTANCES | {SET, DB + "virtualmachines/db1", DB + "virtualmachines/ghost"},
        whole=frozenset({SET}),
        placed={DB + "virtualmachines/db1": ""},
    )
    found, reach = counted([run], {}, START, GRACE)
    assert found == {
        "patch:run1": {"ghost"},  # Resource Graph could not say where: any group
        "patch:0:run1": {"web_0", "web_1", "web_2", "web_3"},
        "patch:1:run1": {"db1"},
    }
    assert reach == {"patch:0:run1": {("s", "rg", "web")}, "patch:1:run1": {("s", "rg-db", None)}}
    assert all(run.owns(key) for key in found)
    assert not run.owns("patch:run10")
    assert not run.owns("patch:0:run10")


def test_another_events_budget_counts_a_runs_names_only_where_they_may_be() -> None:
    # Before, every name a run counted that no agent reports was in every group: the web
    # set's patch run held db's slot too.
    db = {"id0": vm(0, subscription_id="s", scale_set="db")}
    one = (Budget("one-at-a-time", "scale_set", max_vms=1),)
    placed = replace(RUN, resources=INSTANCES | {SET}, whole=frozenset({SET}))
    found, reach = counted([placed], db, START, GRACE)
    view = FleetView(db, found, reach=reach, patch_runs=tuple(found))
    assert check_budgets(one, view, event("id0"), START) is None
    # A VM Resource Graph could not place may be in db's set: the worst case stays.
    ghost = replace(RUN, resources=frozenset({DB + "virtualmachines/ghost"}))
    found, reach = counted([ghost], db, START, GRACE)
    view = FleetView(db, found, reach=reach, patch_runs=tuple(found))
    verdict = check_budgets(one, view, event("id0"), START)
    assert verdict is not None
    assert verdict[0] == "Defer"
    assert "(1 by patch run " in verdict[1]


def test_a_budgets_explanation_names_a_run_once_whatever_its_parts() -> None:
    db = {"id0": vm(0, subscription_id="s", scale_set="db")}
    per_group = (Budget("ten", "resource_group", max_vms=10),)
    run = replace(RUN, resources=INSTANCES | {SET, DB + "virtualmachines/ghost"},
                  whole=frozenset({SET}))  # fmt: skip
    found, reach = counted([run], db, START, GRACE)
    assert len(found) == 2  # the names anywhere, and those of the web set
    notes: list[str] = []
    view = FleetView(db, found, reach=reach, patch_runs=tuple(found))
    assert check_budgets(per_group, view, event("id0"), START, notes=notes) is None
    assert notes == [
        "budget ten: s/rg has 5 of 1 VMs impacted (5 by patch run ?/run1, 1 of them VMs no agent "
        "reports that Resource Graph could not place, counted in every group); 1 more fit the "
        "limit of 10"
    ]
