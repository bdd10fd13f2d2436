"""The demo's summary of approvals (issue 27): an approve decision that never reached IMDS is
shown, with why, and not only the ones that did."""

from __future__ import annotations

import io
import json
from typing import Any

from bridge.demo import View, ViewSink
from bridge.sinks import SpooledRecord
from tests.component.consumer.test_core import E1, E2, Rig, rig, two_vms

__all__ = ["rig"]  # the fixture
E3 = "E3E3E3E3-0000-4000-8000-000000000003"


def three_approvals(rig: Rig) -> list[dict[str, Any]]:
    """E1 approved, E2's approval read after the event Started (Late), E3's never read:
    the agents' records and the consumer's decisions, in the order they were made."""
    made = two_vms(rig)
    rig.consumer.process(made)
    for event, vm, answer in (
        (E1, "web_0", "Approved"),
        (E2, "web_1", "Late"),
        (E3, "web_0", None),
    ):
        batch = [rig.fleet.event(vm, event, resources=[vm])]
        before = len(rig.decisions)
        rig.consumer.process(batch)
        made += batch + [dict(d) for d in rig.decisions[before:]]
        rig.fleet.advance(1)
        if answer == "Approved":
            batch = [rig.fleet.approval(rig.sender.sent[-1])]
        elif answer == "Late":
            late = f"Late: event {event} has already Started: the approval came 10.0 s late"
            batch = [rig.fleet.approval(rig.sender.sent[-1], "Refused", detail=late)]
        else:
            batch = []
        rig.fleet.advance(9)
        batch += [
            rig.fleet.event(vm, event, resources=[vm], transition=t)
            for t in ("Started", "Completed")
        ]
        rig.consumer.process(batch)
        made += batch
    return made


def show(view: View, record: dict[str, Any]) -> None:
    """Hand `record` to the view as the demo does: through its sink, as the spool keeps it."""
    spooled = SpooledRecord(0, record["RecordId"], record["RecordType"], json.dumps(record))
    ViewSink(str(record["VmName"] or "central"), view).send([spooled])


def test_the_summary_shows_each_approval_that_never_reached_imds(rig: Rig) -> None:
    view = View(io.StringIO(), live=True)
    for record in three_approvals(rig):
        show(view, record)
    lines = view.approvals()
    assert lines[0].split() == ["approve", "decisions", "3:", "1", "reached", "IMDS,", "1",
                                "came", "too", "late,", "1", "never", "answered"]  # fmt: skip
    [late] = [line for line in lines if E2[:8] in line]
    assert "via web_1: came too late: event" in late
    assert "has already Started" in late
    [unanswered] = [line for line in lines if E3[:8] in line]
    assert "via web_0: never answered" in unanswered
    assert "the event Started 10.0 s after the decision" in unanswered
    assert not [line for line in lines if E1[:8] in line]
    assert "Refused Late" in view.render(["web_0", "web_1"], 1.0)  # the live view says why


def test_a_command_read_past_its_expiry_came_too_late_too(rig: Rig) -> None:
    view = View(io.StringIO(), live=True)
    for record in three_approvals(rig):
        if record["RecordType"] == "Approval" and record["ApprovalOutcome"] == "Refused":
            record["ApprovalDetail"] = "Expired: it expired at 10:00:30; it came 31 s"
        show(view, record)
    [expired] = [line for line in view.approvals() if E2[:8] in line]
    assert "via web_1: came too late: Expired: it expired at 10:00:30" in expired
    assert "Refused Expired" in view.render(["web_0", "web_1"], 1.0)
