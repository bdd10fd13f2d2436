"""A patch run in the consumer's budgets (issue 40, item 1): its pre-event, delivered through
the second source's intake, counts its VMs in the budgets an agent's event is checked against,
from the run's start to its post-event; the real consumer core over a real SQLite state."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from bridge.config import PatchRunSettings
from bridge.consumer.patchruns import Parts, PatchRuns, attach
from bridge.consumer.secondsource import EventGridIntake
from bridge.consumer.sources.eventgrid import Trust
from bridge.consumer.sources.patchruns import Resolved
from tests.component.consumer.test_core import E1, E2
from tests.component.consumer.test_second_source import Rig
from tests.support import eventgrid as eg
from tests.support.fleetrecords import SUBSCRIPTION

SET = eg.compute_id("rg-app", "virtualMachineScaleSets", "web").lower()


def patched(path: Path) -> tuple[Rig, PatchRuns]:
    rig = Rig(path, "web_0", "web_1", "web_2", "web_3")
    rig.intake = EventGridIntake(rig.consumer, Trust(frozenset({SUBSCRIPTION}), patch_runs=True))
    parts = Parts(
        resolve=lambda _notice: Resolved(frozenset({SET})),
        fleet=rig.consumer.fleet_view,
        budgets=lambda: rig.consumer.policy.budgets,
        emit=rig.decisions.extend,
    )
    runs = PatchRuns(rig.store, PatchRunSettings(enabled=True), parts,
                     rig.consumer.current_time, lock=rig.consumer.lock)  # fmt: skip
    attach(rig.consumer, runs)
    return rig, runs


def test_a_patch_runs_vms_hold_the_budget_from_its_start_to_its_post_event(
    tmp_path: Path,
) -> None:
    rig, runs = patched(tmp_path / "fleet.db")
    start = rig.fleet.now + timedelta(minutes=35)
    rig.intake.handle([eg.maintenance("pre", start, rig.fleet.now)])
    assert runs.outcomes == {"over_budget": 1}  # 4 VMs at once, max_vms 1: it runs, warned
    assert rig.intake.runs == 1
    rig.fleet.advance(36 * 60)  # the run has started
    rig.agent("web_0", E1, resources=["web_0"])
    assert rig.approved() == []  # the scale set's slot is the patch run's
    # web_0's own event aside, the run impacts the other three of the set.
    assert any("web has 3 of 4 VMs impacted" in line for line in rig.explain(E1))
    # ... and says which run fills it, as the run's own Decision record does.
    run = f"tuesday/{start:%Y%m%d%H%M%S}"
    assert any(f"3 by patch run {run}" in line for line in rig.explain(E1)), rig.explain(E1)
    rig.fleet.advance(60)
    rig.intake.handle([eg.maintenance("post", start, rig.fleet.now)])
    rig.consumer.tick()
    assert rig.approved() == [E1]


def test_with_patch_runs_off_the_events_are_left_aside(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db", "web_0")
    rig.intake.handle([eg.maintenance("pre", rig.fleet.now, rig.fleet.now)])
    assert rig.intake.counts().ignored == 1
    assert rig.intake.counts().refused == {}


def test_a_runs_agentless_scale_set_counts_where_resource_graph_placed_it(
    tmp_path: Path,
) -> None:
    # Issue 40 leftover 2: before, the run's VMs no agent reports counted in every group, and
    # the api set's run held the web set's slot.
    api = eg.compute_id("rg-app", "virtualMachineScaleSets", "api").lower()
    ghost = eg.compute_id("rg-app", "virtualMachines", "ghost").lower()
    instances = frozenset(f"{api}/virtualmachines/{n}" for n in range(3))
    rig, runs = patched(tmp_path / "fleet.db")
    resolved = Resolved(instances | {api}, whole=frozenset({api}))
    runs.parts = replace(runs.parts, resolve=lambda _notice: resolved)
    start = rig.fleet.now + timedelta(minutes=35)
    rig.intake.handle([eg.maintenance("pre", start, rig.fleet.now)])
    assert runs.outcomes == {"over_budget": 1}  # 3 instances of api at once, max_vms 1
    explanation = str(rig.decisions[-1]["DecisionExplanation"])
    assert "3 in " in explanation
    assert "/rg-app/api (api_0, api_1, api_2), where Resource Graph placed them" in explanation
    rig.fleet.advance(36 * 60)
    rig.agent("web_0", E1, resources=["web_0"])
    assert rig.approved() == [E1]  # api's instances are not web's
    # A VM Resource Graph could not place may be web's: the worst case holds web_1's event.
    rig.fleet.advance(60)
    later = rig.fleet.now + timedelta(minutes=35)
    runs.parts = replace(runs.parts, resolve=lambda _notice: Resolved(frozenset({ghost})))
    rig.intake.handle([eg.maintenance("pre", later, rig.fleet.now)])
    rig.fleet.advance(36 * 60)
    rig.agent("web_1", E2, resources=["web_1"])
    assert E2 not in rig.approved()
    said = " ".join(rig.explain(E2))
    assert (
        "VMs no agent reports that Resource Graph could not place, counted in every group" in said
    )
