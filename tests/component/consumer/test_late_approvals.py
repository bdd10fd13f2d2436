"""An approval that reached its agent too late, or never (issue 27): the consumer asks no
other VM for an event that went ahead, and counts the approvals that never landed."""

from __future__ import annotations

import logging
from typing import Literal

import pytest

from tests.component.consumer.test_core import E1, Rig, rig, two_vms

__all__ = ["rig"]  # the fixture

# What the VM answers: an ApprovalOutcome, or Late (Refused with the detail LATE).
Answer = Literal["Late", "Refused", "Approved"]
LATE = f"Late: event {E1} has already Started: the approval came 10.4 s after it was issued"


def approve_on_both(rig: Rig) -> None:
    batch = two_vms(rig)
    batch += [rig.fleet.event(n, E1, resources=["web_0", "web_1"]) for n in ("web_0", "web_1")]
    rig.consumer.process(batch)
    assert [c.vm_id for c in rig.sender.sent] == [rig.fleet.vm_id("web_0")]


def test_a_late_answer_asks_no_other_vm(rig: Rig) -> None:
    """The agent can tell before the consumer does that the event started: its Approval
    record may be read before any Started record of the event."""
    approve_on_both(rig)
    rig.fleet.advance(1)
    rig.consumer.process([rig.fleet.approval(rig.sender.sent[0], "Refused", detail=LATE)])
    rig.fleet.advance(60)  # past approval_timeout: no answer is owed any more
    rig.consumer.tick()
    assert len(rig.sender.sent) == 1
    assert [d["DecisionAction"] for d in rig.decisions] == ["Approve"]


@pytest.mark.parametrize(
    ("answer", "missed"),
    [
        ("Late", {"late": 1}),
        (None, {"unanswered": 1}),  # the command lay unread: no record ever came
        ("Refused", {"refused": 1}),  # every VM asked refused it
        ("Approved", {}),
    ],
)
def test_an_approval_that_never_landed_is_counted_when_its_event_ends(
    rig: Rig, caplog: pytest.LogCaptureFixture, answer: Answer | None, missed: dict[str, int]
) -> None:
    approve_on_both(rig)
    rig.fleet.advance(1)
    if answer is not None:
        outcome = "Refused" if answer == "Late" else answer
        detail = LATE if answer == "Late" else None
        rig.consumer.process([rig.fleet.approval(rig.sender.sent[-1], outcome, detail=detail)])
        if answer == "Refused":  # then web_1 is asked, and refuses too
            rig.consumer.process([rig.fleet.approval(rig.sender.sent[-1], "Refused")])
    rig.fleet.advance(10)
    for transition in ("Started", "Completed"):
        both = ("web_0", "web_1")
        rig.consumer.process(
            [rig.fleet.event(n, E1, resources=list(both), transition=transition) for n in both]
        )
        rig.fleet.advance(5)
    assert dict(rig.consumer.ledger.missed) == missed
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert bool([w for w in warned if "never reached IMDS" in w]) == bool(missed)


def test_a_command_outlives_its_expiry_in_the_channel(rig: Rig) -> None:
    """A command expires at its event's NotBefore, when the platform starts the event: a
    channel that dropped it then would leave an agent reading after the start nothing to say
    Late about (the demo: 2 of 6 approvals never answered, and no record said why)."""
    approve_on_both(rig)
    [command], [ttl] = rig.sender.sent, rig.sender.ttls
    assert ttl >= (command.expires_at - rig.fleet.now).total_seconds() + 30
