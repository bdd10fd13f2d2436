"""Approver.consider: a verified command goes to the approver once and comes back as what
became of it, its Approval record written (or, for a repeat, deliberately not)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TypeVar

import pytest

from bridge.agent.approver import Approver, Request
from bridge.commands import message as commands
from bridge.outbox.spool import Spool, StateKey
from bridge.records import ApprovalOutcome
from bridge.retry import RetryableError
from tests.support.records import ORIGIN

T = TypeVar("T")
NOW = datetime(2026, 11, 27, 5, 0, tzinfo=timezone.utc)
VM_ID = ORIGIN.identity.vm_id or ""
EVENT = "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7"


class Imds:
    """This VM's Scheduled Events as IMDS would answer them, and the approvals POSTed."""

    def __init__(self) -> None:
        self.events: dict[str, str] = {EVENT: "Scheduled"}  # EventId -> EventStatus
        self.event_type = "Reboot"
        self.reads = 0
        self.posts: list[list[str]] = []
        self.down = False

    def scheduled_events(self) -> bytes:
        self.reads += 1
        if self.down:
            raise RetryableError("IMDS did not answer")
        events = [
            {"EventId": event_id, "EventType": self.event_type, "ResourceType": "VirtualMachine",
             "Resources": ["WestNO_0"], "EventStatus": status, "NotBefore": "",
             "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}
            for event_id, status in self.events.items()
        ]  # fmt: skip
        return json.dumps({"DocumentIncarnation": 2, "Events": events}).encode()

    def start_events(self, event_ids: list[str]) -> int:
        self.posts.append(event_ids)
        return 200


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.imds = Imds()
        self.spool = Spool(tmp_path / "spool.db", ["jsonl"])
        self.outcomes: list[ApprovalOutcome] = []
        self.approver = self.fresh()

    def fresh(self) -> Approver:
        """An approver on this spool, as after a restart."""
        return Approver(self.imds, run, self.spool, lambda: ORIGIN, lambda: NOW,
                        on_record=self.outcomes.append)  # fmt: skip

    def observe(self, **events: str) -> None:
        """The agent's last look: these events (EventId -> status)."""
        self.approver.observe(
            {"events": {e.lower(): {"EventId": e, "EventStatus": s} for e, s in events.items()}}
        )


def run(call: Callable[[], T]) -> T:
    return call()


def command(*, expires: timedelta = timedelta(minutes=5), rule: str = "ops") -> commands.Command:
    return commands.approve(vm_id=VM_ID, event_id=EVENT, document_incarnation=2,
                            issued_at=NOW - timedelta(seconds=1), expires_at=NOW + expires,
                            rule=rule, reason="approve at once")  # fmt: skip


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path)
    yield rig
    rig.spool.close()


def test_a_command_is_approved_in_one_hand_off_and_its_record_written(rig: Rig) -> None:
    attempt = rig.approver.consider(command())
    assert attempt.kind == "Approved"
    assert rig.imds.posts == [[EVENT]]
    [outcome] = rig.outcomes
    assert (outcome.outcome, outcome.command_id, outcome.rule) == ("Approved", command().command_id,
                                                                   "ops")  # fmt: skip
    assert attempt.outcome == outcome
    assert rig.approver.approved(EVENT)
    seen = rig.spool.load_state(StateKey.SEEN_COMMANDS) or {}
    assert seen["seen"][command().command_id]["outcome"] == "Approved"


def test_a_replay_is_refused_with_no_ids_and_a_redelivery_is_not_recorded_again(rig: Rig) -> None:
    rig.approver.consider(command())
    replayed = rig.fresh().consider(command())  # remembered across a restart, in the spool
    assert replayed.kind == "Replayed"
    assert replayed.outcome is not None
    assert (replayed.outcome.command_id, replayed.outcome.event_id) == (None, None)
    assert replayed.detail.startswith(f"Replayed: command {command().command_id} was approved")
    redelivered = rig.approver.consider(command(), redelivered=True)
    assert (redelivered.kind, redelivered.detail) == ("Redelivered", "already approved here")
    assert rig.imds.posts == [[EVENT]]
    assert [o.outcome for o in rig.outcomes] == ["Approved", "Refused"]


def test_an_event_approved_by_the_local_policy_is_no_news(rig: Rig) -> None:
    local = Request(event_id=EVENT, command_id="local-1", source="Local", rule=None,
                    reason="local", issued_at=NOW)  # fmt: skip
    assert rig.approver.attempt(local).kind == "Approved"
    attempt = rig.approver.consider(command())
    assert (attempt.kind, attempt.detail) == ("Duplicate", f"event {EVENT} was approved already")
    assert len(rig.imds.posts) == 1
    assert len(rig.outcomes) == 1


@pytest.mark.parametrize(("looked", "late"), [({EVENT: "Started"}, "Started"), ({}, "Expired")])
def test_an_expired_command_is_refused_without_asking_imds(
    rig: Rig, looked: dict[str, str], late: str
) -> None:
    rig.observe(**looked)
    attempt = rig.approver.consider(command(expires=-timedelta(seconds=1), rule=""))
    assert attempt.kind == "Refused"
    assert attempt.outcome is not None
    assert (attempt.outcome.late, attempt.outcome.rule) == (late, "")  # the rule as sent
    assert attempt.outcome.incarnation == 2
    assert attempt.detail.startswith("Late:" if late == "Started" else "Expired:")
    assert (rig.imds.reads, rig.imds.posts) == (0, [])
    assert rig.outcomes == [attempt.outcome]


def test_a_refusal_by_the_fresh_document_is_recorded_and_remembered(rig: Rig) -> None:
    rig.imds.events[EVENT] = "Started"
    attempt = rig.approver.consider(command())
    assert attempt.kind == "Refused"
    assert attempt.outcome is not None
    assert attempt.outcome.late == "Started"
    assert rig.outcomes == [attempt.outcome]
    assert rig.approver.handled(command().command_id) == "Refused"
    assert rig.imds.posts == []


def test_a_command_imds_cannot_check_is_left_for_the_next_read(rig: Rig) -> None:
    rig.imds.down = True
    attempt = rig.approver.consider(command())
    assert attempt.kind == "Retry"
    assert (rig.outcomes, rig.imds.posts) == ([], [])
    assert rig.approver.handled(command().command_id) is None


def test_the_record_goes_to_the_spool_for_the_sinks(rig: Rig) -> None:
    rig.approver.consider(command())
    records = [json.loads(r.body) for r in rig.spool.read_batch("jsonl", 10)]
    assert [(r["RecordType"], r["ApprovalOutcome"]) for r in records] == [("Approval", "Approved")]


def test_a_prepare_command_is_never_taken_for_an_approval(rig: Rig) -> None:
    prepare = commands.approve(vm_id=VM_ID, event_id=EVENT, document_incarnation=2,
                               issued_at=NOW, expires_at=NOW + timedelta(minutes=5), rule="ops",
                               reason="drain granted", kind="Prepare")  # fmt: skip
    attempt = rig.approver.consider(prepare)
    assert attempt.kind == "Refused"
    assert attempt.detail.startswith("Prepare: ")
    assert (rig.imds.reads, rig.imds.posts) == (0, [])
    assert rig.outcomes == [attempt.outcome]
    assert not rig.approver.approved(EVENT)


def test_a_spot_rebalance_recommendation_is_never_approved(rig: Rig) -> None:
    # Should IMDS list the recommendation where the approvals read (their api-version),
    # and a command name it, no StartRequests goes out: an advisory is approved by nobody.
    rig.imds.event_type = "SpotRebalanceRecommendation"
    attempt = rig.approver.consider(command())
    assert attempt.kind == "Refused"
    assert "Spot rebalance recommendation" in attempt.detail
    assert rig.imds.posts == []
    assert not rig.approver.approved(EVENT)
    assert [o.outcome for o in rig.outcomes] == ["Refused"]
