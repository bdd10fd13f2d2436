"""The ready gate's decision table (approve_when_ready): every VM the event affects finished
its prepare step (a prepare hook, or its node's drain), or the rule's deadline decides. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

import pytest

from bridge.policy.gates import ready
from bridge.policy.model import Action, DrainView, EventView, FleetView, Match, Rule, VerdictKind
from tests.unit.policy.test_model import NOW, event, fleet, node, vm

MIN = timedelta(minutes=1)
DEADLINE = NOW + 9 * MIN  # the table's events were first seen a minute ago
PAST = NOW + 10 * MIN


def when_ready(on_deadline: Literal["approve", "hold"] = "hold",
               deadline: timedelta | None = 10 * MIN) -> Rule:  # fmt: skip
    return Rule("ready", Match(), Action("approve_when_ready", deadline, on_deadline))


HOOK, NO_HOOK, UNSAID = vm(0, prepare_hook=True), vm(0, prepare_hook=False), vm(0)
ID0 = frozenset({"id0"})


@dataclass(frozen=True)
class Row:
    name: str
    rule: Rule
    fleet: FleetView
    event: EventView
    kind: VerdictKind | None  # None: the gate lets the event through
    says: str = ""  # in the reason, or in the notes when the gate lets it through
    recheck_at: datetime | None = None
    grant: tuple[str, ...] = ()
    now: datetime = NOW


ROWS = [
    Row("ready", when_ready(), fleet(HOOK), event(ready=ID0), None),
    Row("its hook not yet", when_ready(), fleet(HOOK), event(), "Defer",
        "waiting for prepare hooks: 1 of 1 VMs not ready: prepare hook not yet succeeded on vm0",
        DEADLINE),
    Row("no deadline: until NotBefore", when_ready(deadline=None), fleet(HOOK), event(),
        "Defer", "prepare hook not yet succeeded on vm0"),
    Row("its agent has not said", when_ready(), fleet(UNSAID), event(), "Defer",
        "VM vm0 has not said whether it has a prepare hook", DEADLINE),
    Row("a name not resolved", when_ready(), fleet(HOOK), event(ready=ID0, unresolved=("web_9",)),
        "Defer", "1 of 2 VMs not ready: web_9 not resolved to one known VM", DEADLINE),
    Row("no hook, hold: at once", when_ready(), fleet(NO_HOOK), event(), "Hold",
        "no prepare hook on VM vm0: never ready, so the event starts at NotBefore"),
    Row("no hook, approve: not waited for", when_ready("approve"), fleet(NO_HOOK), event(), None,
        "no prepare hook on VM vm0: not waited for (on_deadline approve)"),
    Row("past the deadline, hold", when_ready(), fleet(HOOK), event(), "Hold",
        "prepare deadline passed with 1 of 1 VMs not ready", now=PAST),
    Row("past the deadline, approve", when_ready("approve"), fleet(HOOK), event(), None,
        "approved anyway (on_deadline approve)", now=PAST),
    Row("a node not granted yet", when_ready(), fleet(node(0)), event(), "Defer",
        "1 of 1 VMs not ready: drain not granted yet on aks-0", DEADLINE, ("id0",)),
    Row("a node past the deadline, approve: its drain is waited for", when_ready("approve"),
        fleet(node(0)), event(granted=ID0), "Defer", "the drains are waited for", now=PAST),
    Row("a node refused the drain, hold", when_ready(), fleet(node(0)),
        event(granted=ID0, no_drain=ID0), "Hold", "vm0 refused the drain (Prepare): never ready"),
    Row("a drain ended without the node ready", when_ready(), fleet(node(0)),
        event(granted=ID0, drains={"id0": DrainView("Failed", NOW, failed=True)}), "Hold",
        "the drain on aks-0 ended without the node ready"),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_the_ready_gate(row: Row) -> None:
    notes: list[str] = []
    verdict = ready.check(row.rule, row.fleet, row.event, row.now, notes)
    if row.kind is None:
        assert verdict is None
        assert any(row.says in line for line in notes) if row.says else not notes, notes
        return
    assert verdict is not None
    got = (verdict.kind, verdict.rule, verdict.recheck_at, verdict.grant)
    assert got == (row.kind, "ready", row.recheck_at, row.grant)
    assert row.says in verdict.reason
