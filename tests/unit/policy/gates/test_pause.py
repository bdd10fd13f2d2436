"""The pause gate's decision table: a pause people set stops every early approval in its scope
until its time, fleet-wide ones first; one whose scope cannot be read stops everything. Pure."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import pytest

from bridge.policy.gates import pause
from bridge.policy.groups import AKS_POOL_TAG
from bridge.policy.model import Pause, Person
from tests.unit.policy.test_model import NOW, event, fleet, vm

BOB = Person("oid-bob", "Bob")
LATER = NOW + timedelta(hours=1)
WEB = vm(0, scale_set="web", subscription_id="s", node_pool="pool1")


def paused(scope: str | None, until: datetime | None = None) -> Pause:
    return Pause(scope, until, BOB, "release", NOW - timedelta(minutes=5))


@dataclass(frozen=True)
class Row:
    name: str
    pauses: tuple[Pause, ...]
    stops: Pause | None  # the pause that stops the event; None: none does


FLEET_WIDE, WEB_ONLY = paused(None, LATER), paused("scale_set:web")
ROWS = [
    Row("no pause", (), None),
    Row("fleet-wide, until later", (FLEET_WIDE,), FLEET_WIDE),
    Row("lifted by its time", (paused(None, NOW),), None),
    Row("its scale set", (WEB_ONLY,), WEB_ONLY),
    Row("its scale set, by its whole key", (paused("scale_set:s/rg/web"),),
        paused("scale_set:s/rg/web")),
    Row("another scale set", (paused("scale_set:db"),), None),
    Row("its resource group, case-blind", (paused("resource_group:RG"),),
        paused("resource_group:RG")),
    Row("a scope that cannot be read stops everything", (paused("pool:x"),), paused("pool:x")),
    Row("the pool its heartbeat names", (paused("node_pool:pool1"),), paused("node_pool:pool1")),
    Row("another pool", (paused("node_pool:pool2"),), None),
    Row("fleet-wide first", (WEB_ONLY, FLEET_WIDE), FLEET_WIDE),
    Row("then the one that lasts longest", (paused("zone:1", LATER), WEB_ONLY), WEB_ONLY),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_the_pause_gate(row: Row) -> None:
    notes: list[str] = []
    view = replace(fleet(replace(WEB, zone="1")), pauses=row.pauses)
    verdict = pause.check(view, event(), NOW, "approve-all", notes)
    if row.stops is None:
        assert (verdict, notes) == (None, [])
        return
    assert verdict is not None
    assert (verdict.kind, verdict.rule, verdict.pause) == ("Defer", "approve-all", row.stops)
    assert verdict.recheck_at == row.stops.until
    assert verdict.reason.startswith(f"paused ({row.stops.where}) by Bob")
    assert verdict.explanation == (verdict.reason,)


def test_a_pool_pause_covers_azures_pool_and_no_other_vm() -> None:
    tagged = vm(1, scale_set="vmss-7", subscription_id="s", tags={AKS_POOL_TAG: "pool1"})
    other = vm(2, scale_set="vmss-8", subscription_id="s", node_pool="pool2")
    assert pause.covers(paused("node_pool:pool1"), [tagged])
    assert not pause.covers(paused("node_pool:pool1"), [other])
    assert pause.covers(paused("node_pool:pool1"), [other, tagged])
