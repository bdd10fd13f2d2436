"""A patch run's VMs in the budgets (issue 40, item 1): counted from the run's start to its
post-event, or to its window's end and the grace when the post-event never comes; never
before the start, never once cancelled. Pure."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from bridge.policy.patchruns import RunView, counted_until, impact, members
from tests.unit.policy.test_model import NOW, vm

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
