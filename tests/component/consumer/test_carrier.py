"""Which VM carries an approval, in a placement group where every VM reports each event
(issue 27): the VM the event names when it is alive, even before its own report is folded in,
so that the approval is read at the fast interval rather than a neighbour's 10 s.

Each test drives the real consumer core over a real SQLite state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridge.consumer.ledger import UNREPORTED_TARGET_TIMEOUT
from bridge.policy.model import Action, Match, Policy, Rule
from tests.component.consumer.test_core import E1, Rig

APPROVE_ALL = Policy(rules=(Rule("all", Match(), Action("approve")),))
SET = ("web_0", "web_1", "web_2", "web_3")


def scale_set(rig: Rig) -> list[dict[str, Any]]:
    """Four instances of one scale set, each heard from (a heartbeat)."""
    for name in SET:
        rig.fleet.vm(name, scale_set="web")
    return [rig.fleet.heartbeat(name) for name in SET]


def targets(rig: Rig) -> list[str]:
    names = {rig.fleet.vm_id(name): name for name in SET}
    return [names[command.vm_id] for command in rig.sender.sent]


def test_a_neighbours_report_sends_the_approval_to_the_live_vm_the_event_names(
    tmp_path: Path,
) -> None:
    # Reproduced, black box: a neighbour's record read first made it the carrier, and a
    # neighbour reads its queue every commands.others_interval (10 s).
    rig = Rig(tmp_path / "fleet.db", APPROVE_ALL)
    rig.consumer.process(scale_set(rig))
    rig.fleet.advance(30)
    rig.consumer.process([rig.fleet.event("web_2", E1, resources=["web_0"])])
    assert targets(rig) == ["web_0"]
    explanation = rig.decisions[-1]["DecisionExplanation"]
    assert "web_0 has not reported the event yet" in explanation
    # Its own report and its neighbours' change nothing: one approver per event.
    rig.consumer.process([rig.fleet.event(n, E1, resources=["web_0"]) for n in SET])
    rig.consumer.tick()
    assert targets(rig) == ["web_0"]


def test_an_affected_vm_that_stays_silent_hands_the_approval_to_a_reporter_soon(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path / "fleet.db", APPROVE_ALL, approval_timeout=30.0)
    rig.consumer.process(scale_set(rig))
    rig.fleet.advance(30)
    rig.consumer.process([rig.fleet.event("web_2", E1, resources=["web_0"])])
    rig.fleet.advance(UNREPORTED_TARGET_TIMEOUT.total_seconds() - 1)
    rig.consumer.tick()
    assert targets(rig) == ["web_0"]
    # It never reported the event, nor answered: its agent is not there to read the queue.
    rig.fleet.advance(1)
    rig.consumer.tick()
    assert targets(rig) == ["web_0", "web_2"]
    assert [d["Attempt"] for d in rig.decisions] == [1, 2]


def test_an_affected_vm_that_reported_gets_the_whole_approval_timeout(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db", APPROVE_ALL, approval_timeout=30.0)
    rig.consumer.process(scale_set(rig))
    rig.fleet.advance(30)
    rig.consumer.process([rig.fleet.event("web_2", E1, resources=["web_0"])])
    rig.fleet.advance(2)
    rig.consumer.process([rig.fleet.event("web_0", E1, resources=["web_0"])])
    rig.fleet.advance(UNREPORTED_TARGET_TIMEOUT.total_seconds())
    rig.consumer.tick()
    assert targets(rig) == ["web_0"]
    rig.fleet.advance(30)
    rig.consumer.tick()
    assert targets(rig) == ["web_0", "web_2"]


def test_an_affected_vm_not_heard_from_leaves_the_approval_to_a_reporter(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db", APPROVE_ALL, alive_within=60.0)
    rig.consumer.process(scale_set(rig))
    rig.fleet.advance(120)
    rig.consumer.process([rig.fleet.heartbeat(n) for n in SET if n != "web_0"])
    rig.consumer.process([rig.fleet.event("web_2", E1, resources=["web_0"])])
    assert targets(rig) == ["web_2"]


def test_a_refusal_by_the_affected_vm_goes_to_the_next_reporter(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db", APPROVE_ALL)
    rig.consumer.process(scale_set(rig))
    rig.consumer.process([rig.fleet.event("web_3", E1, resources=["web_0"])])
    command = rig.sender.sent[0]
    rig.consumer.process([rig.fleet.approval(command, "Refused")])
    assert targets(rig) == ["web_0", "web_3"]
