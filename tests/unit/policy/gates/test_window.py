"""The window gate's decision table: approved inside one of the rule's weekly windows (in its
time zone), deferred to the next one outside, held when none opens before NotBefore. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time, timedelta

import pytest

from bridge.policy.gates import window
from bridge.policy.model import Action, EventView, Match, Rule, VerdictKind, Window
from tests.unit.policy.test_model import NOW, UTC, event

EVERY_DAY = frozenset(range(7))
WEDNESDAY = frozenset({2})  # NOW is a Wednesday, 10:00 UTC


def nights(*windows: Window, zone: str = "UTC") -> Rule:
    return Rule("nights", Match(), Action("approve_in_window", windows=windows, timezone=zone))


@dataclass(frozen=True)
class Row:
    name: str
    rule: Rule
    event: EventView
    kind: VerdictKind | None  # None: inside a window
    recheck_at: datetime | None = None
    says: str = ""


LATER = event(not_before=NOW + timedelta(days=3))
ROWS = [
    Row("inside", nights(Window(EVERY_DAY, time(9), time(11))), event(), None),
    Row("end is outside", nights(Window(EVERY_DAY, time(8), time(10))), LATER, "Defer",
        datetime(2024, 6, 13, 8, tzinfo=UTC), "outside the maintenance window until Thu 08:00Z"),
    Row("wraps past midnight, opened the day before",
        nights(Window(frozenset({1}), time(22), time(11))), event(), None),
    Row("wraps, but not opened the day before",
        nights(Window(WEDNESDAY, time(22), time(11))), LATER, "Defer",
        datetime(2024, 6, 12, 22, tzinfo=UTC)),
    Row("in the rule's time zone", nights(Window(EVERY_DAY, time(11), time(13)),
        zone="Europe/Amsterdam"), event(), None),
    Row("next opens after NotBefore", nights(Window(EVERY_DAY, time(1), time(2))), event(),
        "Hold", None, "no maintenance window opens before NotBefore"),
    Row("no NotBefore: waits for the next", nights(Window(EVERY_DAY, time(1), time(2))),
        event(not_before=None), "Defer", datetime(2024, 6, 13, 1, tzinfo=UTC)),
    Row("no window at all", nights(), event(not_before=None), "Hold", None,
        "no maintenance window opens before NotBefore"),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_the_window_gate(row: Row) -> None:
    verdict = window.check(row.rule, row.event, NOW)
    if row.kind is None:
        assert verdict is None
        return
    assert verdict is not None
    assert (verdict.kind, verdict.rule, verdict.recheck_at) == (row.kind, "nights", row.recheck_at)
    assert row.says in verdict.reason
