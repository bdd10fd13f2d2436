"""The drain gate's decision table: an approving action waits for the drains of the event's
Kubernetes nodes, grants those not granted yet, and holds the event when one ended without its
node ready. Pure: no storage."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest

from bridge.policy.gates import drain
from bridge.policy.model import Blocker, DrainView, EventView, FleetView, VerdictKind
from tests.unit.policy.test_model import APPROVE_ALL, NOW, event, fleet, node, vm

GRANTED = frozenset({"id0"})
BLOCKED = DrainView("Blocked", NOW, NOW - timedelta(minutes=4),
                    (Blocker("shop", "web-1", "EvictionRefused", "web-pdb"),))  # fmt: skip
SILENT = node(0, last_seen=NOW - timedelta(hours=1))


@dataclass(frozen=True)
class Row:
    name: str
    fleet: FleetView
    event: EventView
    kind: VerdictKind | None  # None: the gate lets the event through
    grant: tuple[str, ...] = ()
    says: str = ""
    lines: tuple[str, ...] = ()  # the explanation's lines it adds


ROWS = [
    Row("not a node", fleet(vm(0)), event(), None),
    Row("a node not granted yet", fleet(node(0), vm(1)), event("id0", "id1"), "Defer", ("id0",),
        "waiting for drains: drain not granted yet on aks-0"),
    Row("granted, not finished", fleet(node(0)), event(granted=GRANTED), "Defer", (),
        "drain not finished on aks-0"),
    Row("drained", fleet(node(0)), event(granted=GRANTED, ready=GRANTED), None),
    Row("a Spot eviction drains at once", fleet(node(0)), event(event_type="Preempt"), None),
    Row("its agent refused the grant", fleet(node(0)),
        event(granted=GRANTED, no_drain=GRANTED), None),
    Row("its agent is silent", fleet(SILENT), event(), None),
    Row("ended without the node ready", fleet(node(0)),
        event(granted=GRANTED, drains={"id0": DrainView("GaveUp", NOW, failed=True)}), "Hold",
        (), "the drain on aks-0 ended without the node ready (see its Hook record)"),
    Row("blocked: its pods and PDBs said", fleet(node(0)),
        event(granted=GRANTED, drains={"id0": BLOCKED}), "Defer", (),
        "waiting for drains: drain blocked on aks-0",
        ("drain on aks-0 blocked 4 min: pod shop/web-1 (PDB web-pdb refused eviction)",)),
    Row("two nodes, one granted", fleet(node(0), node(1)),
        event("id0", "id1", granted=GRANTED), "Defer", ("id1",),
        "drain not finished on aks-0; drain not granted yet on aks-1"),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_the_drain_gate(row: Row) -> None:
    notes: list[str] = []
    verdict = drain.check(APPROVE_ALL, row.fleet, row.event, NOW, notes)
    assert tuple(notes) == row.lines
    if row.kind is None:
        assert verdict is None
        return
    assert verdict is not None
    assert (verdict.kind, verdict.rule, verdict.grant) == (row.kind, APPROVE_ALL.name, row.grant)
    assert row.says in verdict.reason
