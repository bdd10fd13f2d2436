"""The rebalance gate's decision table: a Spot rebalance recommendation (an Advisory) is never
approved; with `rebalance: {drain: true}` the node of each VM it names is drained at once, the
drain granted within the budgets as any drain is. Pure: no storage."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta

import pytest

from bridge.policy.evaluation import evaluate
from bridge.policy.gates import rebalance
from bridge.policy.model import (
    REBALANCE_RULE,
    Budget,
    DrainView,
    EventView,
    FleetView,
    Pause,
    Person,
    PersonDecision,
    Policy,
    Rebalance,
    VerdictKind,
)
from tests.unit.policy.test_model import APPROVE_ALL, NOW, event, fleet, node, vm

GRANTED = frozenset({"id0"})
POOL_OF_ONE = Budget("one-node-per-pool", "node_pool", max_vms=1)
DRAIN = Policy(rules=(APPROVE_ALL,), budgets=(POOL_OF_ONE,), rebalance=Rebalance(drain=True))
RECORD_ONLY = Policy(rules=(APPROVE_ALL,), rebalance=Rebalance(drain=False))
NO_SECTION = Policy(rules=(APPROVE_ALL,))


def advice(*affected: str, **fields: object) -> EventView:
    """A recommendation naming `affected` (default id0), as the consumer folds it."""
    base = event(*affected, event_type="SpotRebalanceRecommendation", event_source=None)
    return replace(base, advisory=True, **fields)  # type: ignore[arg-type]


# Another node of the same pool already drained for some other event: the pool's one slot.
BUSY = fleet(node(0), node(1), impacted={"other": frozenset({"id1"})})


@dataclass(frozen=True)
class Row:
    name: str
    policy: Policy
    fleet: FleetView
    event: EventView
    kind: VerdictKind
    grant: tuple[str, ...] = ()
    says: str = ""


ROWS = [
    Row("no rebalance section: recorded, nothing more", NO_SECTION, fleet(node(0)), advice(),
        "Ignore", (), "nothing to approve"),
    Row("drain off", RECORD_ONLY, fleet(node(0)), advice(), "Ignore", (), "no rebalance.drain"),
    Row("not a Kubernetes node", DRAIN, fleet(vm(0)), advice(), "Ignore", (),
        "no VM it names drains a Kubernetes node"),
    Row("its agent is silent", DRAIN, fleet(node(0, last_seen=NOW - timedelta(hours=1))),
        advice(), "Ignore"),
    Row("a node: drained at once", DRAIN, fleet(node(0), node(1)), advice(), "Defer", ("id0",),
        "drain granted on aks-0 at once"),
    Row("the pool's slot is taken: not granted", DRAIN, BUSY, advice(), "Defer", (),
        "drain not granted: "),
    Row("granted, not finished", DRAIN, BUSY, advice(granted=GRANTED), "Defer", (),
        "drain not finished on aks-0"),
    Row("drained: the slot stays taken", DRAIN, fleet(node(0)),
        advice(granted=GRANTED, ready=GRANTED), "Defer", (), "drained aks-0: the slot stays"),
    Row("its agent refused the grant", DRAIN, fleet(node(0)),
        advice(granted=GRANTED, no_drain=GRANTED), "Ignore"),
    Row("the drain ended without the node ready", DRAIN, fleet(node(0)),
        advice(granted=GRANTED, drains={"id0": DrainView("GaveUp", NOW, failed=True)}), "Hold",
        (), "ended without the node ready"),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_the_rebalance_gate(row: Row) -> None:
    verdict = rebalance.check(row.policy, row.fleet, row.event, NOW, [])
    assert (verdict.kind, verdict.rule, verdict.grant) == (row.kind, REBALANCE_RULE, row.grant)
    assert row.says in verdict.reason
    assert verdict.explanation  # `policy explain` has its lines


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_evaluate_never_approves_an_advisory(row: Row) -> None:
    # The rule approves every event, and a person approves this one: neither counts.
    said = PersonDecision("approve", Person("oid", "ops"), "go", NOW, override_budget=True)
    verdict = evaluate(row.policy, row.fleet, replace(row.event, person=said), NOW)
    assert verdict.kind != "Approve"
    assert verdict.target is None
    assert (verdict.kind, verdict.grant) == (row.kind, row.grant)


def test_a_pause_stops_the_drain_as_it_stops_an_approval() -> None:
    pause = Pause(None, None, Person("oid", "ops"), "incident", NOW - timedelta(minutes=1))
    paused = replace(fleet(node(0)), pauses=(pause,))
    verdict = rebalance.check(DRAIN, paused, advice(), NOW, [])
    assert (verdict.kind, verdict.grant) == ("Defer", ())
    assert "paused" in verdict.reason


@pytest.mark.parametrize(
    ("policy", "kind"),
    [
        (Policy(rules=(APPROVE_ALL,), rebalance=Rebalance(notify="ops")), "Hold"),
        (replace(DRAIN, rebalance=Rebalance(drain=True, notify="ops")), "Defer"),
    ],
    ids=["told, nothing drained: a Hold, said", "told and drained"],
)
def test_notify_names_the_target_on_the_verdict(policy: Policy, kind: str) -> None:
    verdict = rebalance.check(policy, fleet(node(0)), advice(), NOW, [])
    assert (verdict.kind, verdict.notify) == (kind, "ops")
