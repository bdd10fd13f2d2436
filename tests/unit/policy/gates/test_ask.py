"""The ask gate's decision table: an ask waits for a person until its deadline (never past
NotBefore), then approves or holds as its on_deadline says. Pure: no storage."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

import pytest

from bridge.policy.gates import ask
from bridge.policy.model import Action, EventView, Match, Rule, VerdictKind
from tests.unit.policy.test_model import NOW, event

MIN = timedelta(minutes=1)
NOT_BEFORE = NOW + 15 * MIN  # the table's events' NotBefore


def asking(deadline: timedelta | None, on_deadline: Literal["approve", "hold"] = "hold") -> Rule:
    return Rule("ask-dba", Match(), Action("ask", deadline, on_deadline, target="dba"))


@dataclass(frozen=True)
class Row:
    name: str
    rule: Rule
    event: EventView
    now: datetime
    kind: VerdictKind | None  # None: the gate lets the event through
    recheck_at: datetime | None = None
    says: str = ""  # in the reason, or in the notes when the gate lets it through


ROWS = [
    Row("not asked yet: waits from now", asking(30 * MIN), event(), NOW, "Ask", NOT_BEFORE,
        "waiting for a person's answer until 2024-06-12 10:15:00Z, then the event starts"),
    Row("asked, deadline first", asking(10 * MIN), event(asked_at=NOW - 5 * MIN), NOW, "Ask",
        NOW + 5 * MIN, "until 2024-06-12 10:05:00Z, then hold"),
    Row("no deadline: until NotBefore", asking(None), event(), NOW, "Ask", NOT_BEFORE,
        "then the event starts"),
    Row("nobody answered, hold", asking(10 * MIN), event(asked_at=NOW - 10 * MIN), NOW, "Hold",
        None, "nobody answered dba by 2024-06-12 10:00:00Z: the event starts at NotBefore"),
    Row("nobody answered, approve", asking(10 * MIN, "approve"), event(asked_at=NOW - 11 * MIN),
        NOW, None, None, "nobody answered dba by 2024-06-12 09:59:00Z: approved"),
    Row("NotBefore came first: never approved by the deadline",
        asking(30 * MIN, "approve"), event(asked_at=NOW - 5 * MIN), NOT_BEFORE, "Hold", None,
        "by 2024-06-12 10:15:00Z: the event starts at NotBefore"),
    Row("no NotBefore, no deadline: waits", asking(None), event(not_before=None), NOW, "Ask",
        None, "until NotBefore"),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_the_ask_gate(row: Row) -> None:
    notes: list[str] = []
    verdict = ask.check(row.rule, row.event, row.now, notes)
    if row.kind is None:
        assert verdict is None
        assert any(row.says in line for line in notes), notes
        return
    assert verdict is not None
    assert (verdict.kind, verdict.rule, verdict.recheck_at) == (row.kind, "ask-dba", row.recheck_at)
    assert row.says in verdict.reason
    assert verdict.asked == "dba"
    assert not notes


def test_an_ask_ends_at_its_deadline_from_the_first_ask_or_at_not_before() -> None:
    assert ask.ends_at(asking(10 * MIN).action, event(asked_at=NOW - MIN), NOW) == NOW + 9 * MIN
    assert ask.ends_at(asking(60 * MIN).action, event(), NOW) == NOT_BEFORE
    assert ask.ends_at(Action("approve"), event(), NOW) is None
