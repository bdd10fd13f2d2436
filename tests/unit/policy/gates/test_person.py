"""The person gate's decision table: what a person decided comes before the rules; a hold
holds, an approval still meets the budgets unless it overrides them (break-glass). Pure.

The pauses and the drains a person's approval also goes through are the pause and drain
gates' own tables (tests/unit/policy/test_people.py has them together)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta

import pytest

from bridge.policy.gates import person
from bridge.policy.model import (
    PERSON_RULE,
    Budget,
    EventView,
    FleetView,
    Person,
    PersonDecision,
    Policy,
    VerdictKind,
)
from tests.unit.policy.test_model import NOW, event, fleet, vm

ALICE = Person("oid-alice", "Alice")
APPROVE = PersonDecision("approve", ALICE, "failover done", NOW - timedelta(minutes=1))
HOLD = replace(APPROVE, kind="hold")
OVERRIDE = replace(APPROVE, override_budget=True)
ONE = Policy(rules=(), budgets=(Budget("one", "fleet", max_vms=1),))
NONE = Policy(rules=())
TWO_VMS = fleet(vm(0), vm(1))
BUSY = fleet(vm(0), vm(1), impacted={"other": frozenset({"id1"})})
SILENT = fleet(vm(0, last_seen=NOW - timedelta(hours=1)))


@dataclass(frozen=True)
class Row:
    name: str
    decision: PersonDecision
    policy: Policy
    fleet: FleetView
    event: EventView
    kind: VerdictKind
    says: str
    target: str | None = None
    override: bool = False


ROWS = [
    Row("a hold holds", HOLD, NONE, TWO_VMS, event(), "Hold",
        "held by Alice: the event starts at NotBefore (failover done)"),
    Row("an approval", APPROVE, NONE, TWO_VMS, event(), "Approve",
        "approved by Alice (failover done); approval sent through vm0", "id0"),
    Row("no reason given", replace(APPROVE, reason=""), NONE, TWO_VMS, event(), "Approve",
        "approved by Alice (no reason given)", "id0"),
    Row("a full budget still applies", APPROVE, ONE, BUSY, event(), "Defer",
        "approved by Alice, and the budgets still apply: budget one: fleet has 1 of 2"),
    Row("the event alone over a budget", APPROVE, ONE, TWO_VMS, event("id0", "id1"), "Hold",
        "approved by Alice, and the budgets still apply: budget one: the event alone"),
    Row("break-glass over a full budget", OVERRIDE, ONE, BUSY, event(), "Approve",
        "approved by Alice over the budget (failover done)", "id0", True),
    Row("break-glass within the budget overrides nothing", OVERRIDE, ONE, TWO_VMS, event(),
        "Approve", "approved by Alice (failover done)", "id0"),
    Row("no live VM to carry it", APPROVE, NONE, SILENT, event(), "Defer",
        "no live VM reports the event to carry the approval"),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_the_person_gate(row: Row) -> None:
    notes: list[str] = ["rule x: does not match"]
    verdict = person.check(row.policy, row.fleet, row.event, row.decision, NOW, notes)
    got = (verdict.kind, verdict.rule, verdict.target, verdict.override, verdict.person)
    assert got == (row.kind, PERSON_RULE, row.target, row.override, row.decision)
    assert row.says in verdict.reason
    assert verdict.explanation[:2] == (
        "rule x: does not match",
        f"{row.decision.kind} by Alice (oid-alice) at 2024-06-12 09:59:00Z: "
        f"{row.decision.reason or 'no reason given'}; a person's decision comes before the rules",
    )
