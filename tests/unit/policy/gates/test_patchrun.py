"""The patch-run gate's decision table (issue 40, item 1): a run that fits runs; one that
would break a budget runs with a warning, waits for a person until two margins before its
cut-off, or is cancelled until one margin before it, never after. Pure: no storage."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

import pytest

from bridge.policy.gates.patchrun import PatchKind, PatchRule, breaches, decide
from bridge.policy.model import Budget, Scope
from bridge.policy.patchruns import RunView
from tests.unit.policy.test_model import NOW, fleet, vm

MIN = timedelta(minutes=1)
SET = "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachinescalesets/web"
# The pre-event came at NOW: the run starts 35 minutes on, its cut-off 10 minutes before that.
RUN = RunView("run1", "cfg", NOW + 35 * MIN, NOW + 35 * MIN + timedelta(hours=3), NOW + 25 * MIN,
              frozenset({SET}))  # fmt: skip
BROKEN = ["budget one-at-a-time: web has 0 of 4 VMs impacted; the run patches 4 of them at once"]
# Cancel until NOW + 23 min (2 minutes before the cut-off), ask until NOW + 21 min.
CANCEL = PatchRule("cancel", cancel=True)
ASK = PatchRule("ask", cancel=True, ask_target="ops")


@dataclass(frozen=True)
class Row:
    name: str
    rule: PatchRule
    broken: list[str]
    now: datetime
    kind: PatchKind
    says: str
    answer: Literal["run", "cancel"] | None = None
    warn: bool = False
    too_late: bool = False


ROWS = [
    Row("fits: runs, whatever the rule", CANCEL, [], NOW, "Run", "fits every budget"),
    Row("breaks, on_breach run: runs, warned", PatchRule(), BROKEN, NOW, "Run",
        "on_breach run: it runs over the budget", warn=True),
    Row("breaks, on_breach cancel: cancelled", CANCEL, BROKEN, NOW, "Cancel",
        "on_breach cancel: cancelled before its cut-off"),
    Row("breaks, cancel at the last moment", CANCEL, BROKEN, NOW + 23 * MIN, "Cancel",
        "cancelled before its cut-off"),
    Row("breaks, cancel too late: refused, runs", CANCEL, BROKEN, NOW + 23 * MIN + 1 * MIN / 60,
        "Run", "too late to cancel (se-bridge cancels until 2024-06-12 10:23:00Z", warn=True,
        too_late=True),
    Row("breaks, cancel after the cut-off: refused", CANCEL, BROKEN, NOW + 30 * MIN, "Run",
        "never after", warn=True, too_late=True),
    Row("breaks, cancel not allowed: runs, warned", PatchRule("cancel"), BROKEN, NOW, "Run",
        "patchruns.cancel is off", warn=True),
    Row("breaks, ask: waits until two margins before the cut-off", ASK, BROKEN, NOW, "Ask",
        "asked ops; waiting for an answer until 2024-06-12 10:21:00Z, then run"),
    Row("breaks, asked, answered run", ASK, BROKEN, NOW + 5 * MIN, "Run",
        "ops answered run: it runs over the budget", answer="run", warn=True),
    Row("breaks, asked, answered cancel", ASK, BROKEN, NOW + 5 * MIN, "Cancel",
        "ops answered cancel: cancelled", answer="cancel"),
    Row("breaks, asked, answered cancel too late", ASK, BROKEN, NOW + 24 * MIN, "Run",
        "too late to cancel", answer="cancel", warn=True, too_late=True),
    Row("breaks, nobody answered, on_deadline run", ASK, BROKEN, NOW + 21 * MIN, "Run",
        "nobody answered ops in time: on_deadline run", warn=True),
    Row("breaks, nobody answered, on_deadline cancel", replace(ASK, on_deadline="cancel"),
        BROKEN, NOW + 21 * MIN, "Cancel", "on_deadline cancel: cancelled before its cut-off"),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_the_patch_run_gate(row: Row) -> None:
    verdict = decide(row.rule, RUN, row.broken, row.now, row.answer)
    assert verdict.kind == row.kind
    assert row.says in verdict.reason
    assert verdict.warn is row.warn
    assert verdict.too_late is row.too_late
    if row.kind == "Cancel":
        assert RUN.cutoff is not None
        assert row.now < RUN.cutoff  # never after the cut-off


ONE = (Budget("one-at-a-time", "scale_set", max_vms=1),)
FOUR = frozenset(f"id{n}" for n in range(4))


def test_a_run_of_a_whole_max_vms_1_scale_set_breaks_its_budget() -> None:
    vms = [vm(n, subscription_id="s", scale_set="web") for n in range(4)]
    found = breaches(ONE, fleet(*vms), RUN, FOUR, NOW)
    assert found == [
        "budget one-at-a-time: s/rg/web has 0 of 4 VMs impacted; the run patches 4 of them at "
        "once, more than the 1 allowed"
    ]


def test_a_run_of_one_vm_fits_and_says_so() -> None:
    vms = [vm(n, subscription_id="s", scale_set="web") for n in range(4)]
    notes: list[str] = []
    assert breaches(ONE, fleet(*vms), RUN, frozenset({"id0"}), NOW, notes=notes) == []
    assert notes == ["budget one-at-a-time: s/rg/web has 0 of 4 VMs impacted; the run patches "
                     "1 of them at once, within the limit of 1"]  # fmt: skip


def test_a_run_of_one_vm_breaks_a_budget_another_event_fills() -> None:
    vms = [vm(n, subscription_id="s", scale_set="web") for n in range(4)]
    busy = fleet(*vms, impacted={"e1": frozenset({"id3"})})
    assert breaches(ONE, busy, RUN, frozenset({"id0"}), NOW)


def test_two_runs_that_each_fit_break_the_budget_together() -> None:
    vms = [vm(n, subscription_id="s", scale_set="web") for n in range(4)]
    other = {"patch:run2": frozenset({"id1"})}
    assert not breaches(ONE, fleet(*vms), RUN, frozenset({"id0"}), NOW)
    assert breaches(ONE, fleet(*vms), RUN, frozenset({"id0"}), NOW, overlapping=other)


def test_the_runs_own_counting_is_not_counted_twice() -> None:
    vms = [vm(n, subscription_id="s", scale_set="web") for n in range(4)]
    itself = fleet(*vms, impacted={RUN.key: frozenset({"id0"})})
    assert not breaches(ONE, itself, RUN, frozenset({"id0"}), NOW)


def test_vms_no_agent_reports_count_in_a_fleet_budget() -> None:
    budget = (Budget("fleet-two", "fleet", max_vms=2),)
    assert breaches(budget, fleet(), RUN, frozenset({"a", "b", "c"}), NOW)
    assert not breaches(budget, fleet(), RUN, frozenset({"a", "b"}), NOW)


# Issue 40 leftovers 1 and 2: the run's VMs no agent reports count in the groups that can hold
# them, as Resource Graph placed them; where it could not, in every group (worst case).

WEB: Scope = ("s", "rg", "web")


def test_a_scale_set_no_agent_reports_breaks_its_budget_instance_by_instance() -> None:
    names = {f"web_{n}": WEB for n in range(4)}
    notes: list[str] = []
    found = breaches(ONE, fleet(), RUN, frozenset(names), NOW, places=names, notes=notes)
    assert found == [
        "budget one-at-a-time: s/rg/web (VMs no agent reports) has 0 of 4 VMs impacted; the run "
        "patches 4 of them at once, more than the 1 allowed"
    ]
    assert notes[-1] == (
        "the run's VMs no agent reports: 4 in s/rg/web (web_0, web_1, web_2 and 1 more), "
        "where Resource Graph placed them"
    )


def test_names_count_in_the_group_that_holds_them_and_nowhere_else() -> None:
    vms = [vm(0, subscription_id="s", scale_set="web"), vm(1, subscription_id="s", scale_set="db")]
    places: dict[str, Scope | None] = {"db_1": ("s", "rg", "db")}
    assert not breaches(ONE, fleet(*vms), RUN, frozenset({"id0", "db_1"}), NOW, places=places)
    assert breaches(ONE, fleet(*vms), RUN, frozenset({"id0", "web_9"}), NOW,
                    places={"web_9": WEB})  # fmt: skip


def test_a_name_resource_graph_could_not_place_counts_in_every_group() -> None:
    vms = [vm(0, subscription_id="s", scale_set="web"), vm(1, subscription_id="s", scale_set="db")]
    notes: list[str] = []
    found = breaches(ONE, fleet(*vms), RUN, frozenset({"id0", "ghost"}), NOW,
                     places={"ghost": None}, notes=notes)  # fmt: skip
    assert found == [
        "budget one-at-a-time: s/rg/web has 0 of 2 VMs impacted; the run patches 2 of them at "
        "once, more than the 1 allowed"
    ]
    assert notes[-1] == (
        "the run's VMs no agent reports: 1 where nobody could tell (ghost), counted in every "
        "group (worst case)"
    )


def test_two_runs_that_split_a_scale_set_no_agent_reports_break_it_together() -> None:
    two = (Budget("two-at-a-time", "scale_set", max_vms=2),)
    places: dict[str, Scope | None] = {f"web_{n}": WEB for n in range(4)}
    half = frozenset({"web_0", "web_1"})
    assert not breaches(two, fleet(), RUN, half, NOW, places=places)
    other = {"patch:run2": frozenset({"web_2", "web_3"})}
    assert breaches(two, fleet(), RUN, half, NOW, overlapping=other, places=places) == [
        "budget two-at-a-time: s/rg/web (VMs no agent reports) has 2 of 4 VMs impacted; the run "
        "patches 2 of them at once, more than the 2 allowed"
    ]
