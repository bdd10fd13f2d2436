"""A patch run in the consumer's budgets (issue 40, item 1): its pre-event, delivered through
the second source's intake, counts its VMs in the budgets an agent's event is checked against,
from the run's start to its post-event; the real consumer core over a real SQLite state."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from bridge.config import PatchRunSettings
from bridge.consumer.patchruns import Parts, PatchRuns, attach
from bridge.consumer.secondsource import EventGridIntake
from bridge.consumer.sources.eventgrid import Trust
from bridge.consumer.sources.patchruns import Resolved
from tests.component.consumer.test_core import E1
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
