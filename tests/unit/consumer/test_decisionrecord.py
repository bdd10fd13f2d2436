"""The one Decision record builder: the policy's, a person's, a pause's and a resume's
decisions each make a record the schema takes, with every field a Decision has."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from bridge import schema
from bridge.commands import message as commands
from bridge.consumer.decisionrecord import Voice, pause_record, verdict_record
from bridge.consumer.validation import problem
from bridge.policy.model import (
    PERSON_RULE,
    EventView,
    Pause,
    Person,
    PersonDecision,
    Verdict,
)
from bridge.recordtypes import Decision

VM = "1b1f0000-0000-4000-8000-000000000000"
NOW = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
BOB = Person("oid-bob", "Bob")
VOICE = Voice("policy.yaml", "consumer-0")
VIEW = EventView(
    event_id="C7061BAC-0000-4000-8000-000000000001",
    event_type="Reboot",
    event_source="Platform",
    duration=-1,
    status="Scheduled",
    not_before=NOW + timedelta(minutes=15),
    first_seen=NOW,
    affected=(VM,),
)


def _approved_over_budget() -> Decision:
    person = PersonDecision("approve", BOB, "the fix must go out", NOW, override_budget=True)
    verdict = Verdict("Approve", PERSON_RULE, "Bob approved it", target=VM,
                      explanation=("budget overridden",), person=person, override=True)  # fmt: skip
    command = commands.approve(kind="Approve", vm_id=VM, event_id=VIEW.event_id,
                               document_incarnation=3, issued_at=NOW,
                               expires_at=NOW + timedelta(minutes=2), rule=PERSON_RULE,
                               reason="Bob approved it", resources=["web_0"])  # fmt: skip
    return verdict_record(["web_0"], view=VIEW, verdict=verdict, action="Approve", target=None,
                          command=command, voice=VOICE, now=NOW, failing=("ops",))  # fmt: skip


def _asked() -> Decision:
    verdict = Verdict("Ask", "ask-dba", "waiting for dba", asked="dba",
                      ask_deadline=NOW + timedelta(minutes=5))  # fmt: skip
    return verdict_record(["web_0"], view=VIEW, verdict=verdict, action="Ask", target=None,
                          command=None, voice=VOICE, now=NOW)  # fmt: skip


def _paused() -> Decision:
    pause = Pause("scale_set:web", NOW + timedelta(hours=1), BOB, "launch", NOW)
    return pause_record(pause, resumed=False, voice=VOICE, now=NOW)


def _resumed() -> Decision:
    return pause_record(Pause(None, None, BOB, "done", NOW), resumed=True, voice=VOICE, now=NOW)


BUILT = {"over-budget": _approved_over_budget, "ask": _asked, "pause": _paused,
         "resume": _resumed}  # fmt: skip


@pytest.mark.parametrize("name", list(BUILT))
def test_each_decision_makes_a_record_the_schema_takes_with_every_field(name: str) -> None:
    record = BUILT[name]()
    assert problem(dict(record)) is None
    fields = {*schema.common_fields(), *schema.record_types()["Decision"]}
    assert set(record) == fields


def test_what_each_kind_of_decision_says_beyond_the_policy() -> None:
    over = _approved_over_budget()
    assert (over["DecidedBy"], over["BudgetOverride"], over["Attempt"]) == ("oid-bob", True, 1)
    assert (over["NotifyFailing"], over["PauseScope"]) == (["ops"], None)
    asked = _asked()
    assert (asked["AskedTarget"], asked["AskDeadline"]) == ("dba", "2026-11-21T10:05:00.000Z")
    assert (asked["DecidedBy"], asked["CommandId"], asked["Attempt"]) == (None, None, 0)
    paused, resumed = _paused(), _resumed()
    assert (paused["EventId"], paused["PauseUntil"]) == (
        "(scale_set:web)",
        "2026-11-21T11:00:00.000Z",
    )
    assert paused["DecisionReason"].startswith("scale_set:web paused by Bob until 2026-11-21T11")
    assert (resumed["EventId"], resumed["DecisionAction"], resumed["PauseUntil"]) == (
        "(fleet)", "Resume", None)  # fmt: skip
    assert (resumed["EventType"], resumed["Resources"]) == (None, [])
