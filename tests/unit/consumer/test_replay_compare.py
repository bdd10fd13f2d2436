"""`policy replay`'s comparison, pure (issue 40, item 4): the history's records as the replay
reads them, what tells two decisions apart, and what marks a difference the replay cannot
reproduce instead of counting it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

from bridge import recordtypes as rt
from bridge.consumer.replay import History, compare, tally
from bridge.records import iso
from tests.support.records import ORIGIN, T0, common_fields, event_record


def decision(event: str, action: str, at: float, **fields: Any) -> rt.Decision:
    record = common_fields(
        ORIGIN, "Decision", f"d-{event}-{action}-{at}", T0 + timedelta(seconds=at)
    )
    record.update(EventId=event, EventType="Reboot", EventSource="User", Resources=["web_0"],
                  DurationInSeconds=-1, NotBefore=None, EventStatus="Scheduled",
                  DecisionAction=action, DecisionRule="user-initiated",
                  DecisionReason=f"{action} reason", TargetVmId=None, TargetVmName=None,
                  CommandId=None, Attempt=0, PolicySource="policy.yaml",
                  DecisionMode="normal", DecisionExplanation=None)  # fmt: skip
    record.update(fields)
    return cast(rt.Decision, record)


def reported(event: str, at: float) -> dict[str, Any]:
    return event_record(EventId=event, TimeGenerated=iso(T0 + timedelta(seconds=at)),
                        RecordId=f"e-{event}-{at}")  # fmt: skip


def test_history_keeps_a_decision_delivered_twice_once_and_one_said_again_twice() -> None:
    once = decision("E1", "Defer", 1)
    again = decision("E1", "Defer", 9)
    again["RecordId"] = once["RecordId"]  # the same decision, said again later
    history = History.of([reported("E1", 0), once, dict(once), again])
    assert [d["TimeGenerated"] for d in history.decisions] == [once["TimeGenerated"],
                                                              again["TimeGenerated"]]  # fmt: skip


def test_history_orders_the_agents_records_by_time_then_as_given() -> None:
    late, early, tie = reported("A", 5), reported("B", 1), reported("C", 5)
    assert [r["EventId"] for r in History.of([late, early, tie]).agents] == ["B", "A", "C"]


def test_history_compares_the_live_consumers_decisions_not_a_shadows() -> None:
    live = decision("E1", "Approve", 1)
    shadow = decision("E1", "Defer", 1, DecisionMode="shadow", RecordId="s")
    history = History.of([reported("E1", 0), shadow, live])
    assert (history.mode, [d["DecisionAction"] for d in history.decisions]) == (
        "normal",
        ["Approve"],
    )
    assert History.of([reported("E1", 0), shadow]).mode == "shadow"


def test_the_same_decisions_are_no_difference_whenever_they_were_taken() -> None:
    history = History.of([reported("E1", 0), decision("E1", "Approve", 0.5)])
    [event] = compare(history, [decision("E1", "Approve", 0)])
    assert not event.differs


def test_a_different_reason_is_a_difference_and_counted() -> None:
    history = History.of([reported("E1", 0), decision("E1", "Defer", 0.5)])
    [event] = compare(history, [decision("E1", "Defer", 0, DecisionReason="budget fits")])
    assert event.differs
    assert event.counted
    assert tally([event])[0].differing == 1


def test_a_persons_decision_marks_the_event_instead_of_counting_it() -> None:
    history = History.of([reported("E1", 0), decision("E1", "Hold", 0.5),
                          decision("E1", "Approve", 60, DecisionRule="(person)",
                                   DecidedBy="0b5e")])  # fmt: skip
    [event] = compare(history, [decision("E1", "Hold", 0)])
    assert event.differs
    assert not event.counted
    assert [m.kind for m in event.marks] == ["person"]
    assert tally([event])[0].differing == 0


def test_an_ask_marks_the_event_on_either_side() -> None:
    history = History.of([reported("E1", 0), decision("E1", "Approve", 0.5)])
    [event] = compare(history, [decision("E1", "Ask", 0, AskedTarget="dba")])
    assert [m.kind for m in event.marks] == ["person"]


def test_a_release_or_a_missing_carrier_marks_the_agents_silence() -> None:
    history = History.of([reported("E1", 0), decision("E1", "Approve", 0.5)])
    no_carrier = "no live VM reports the event to carry the approval"
    for replayed in (decision("E1", "Release", 0, DecisionRule="(released)"),
                     decision("E1", "Defer", 0, DecisionReason=no_carrier)):  # fmt: skip
        [event] = compare(history, [replayed])
        assert [m.kind for m in event.marks] == ["silence"], replayed


def test_an_approval_no_record_answered_marks_the_agents_silence() -> None:
    sent = decision("E1", "Approve", 0.5, CommandId="c1", TargetVmId="vm-a")
    next_vm = decision("E1", "Approve", 31, CommandId="c2", TargetVmId="vm-b")
    history = History.of([reported("E1", 0), sent, next_vm])
    [event] = compare(history, [decision("E1", "Approve", 0, CommandId="c1", TargetVmId="vm-a")])
    assert [m.kind for m in event.marks] == ["silence"]


def test_a_difference_while_the_consumer_read_late_is_marked_timing() -> None:
    # E1 was first decided 300 s after its first record: the consumer was behind. E2's
    # decision, taken meanwhile, may have been on what it had not read yet.
    history = History.of([reported("E1", 0), reported("E2", 100), decision("E2", "Approve", 100.5),
                          decision("E1", "Approve", 300)])  # fmt: skip
    replayed = [decision("E1", "Approve", 0), decision("E2", "Defer", 100)]
    e1, e2 = compare(history, replayed)
    assert not e1.differs
    assert [m.kind for m in e2.marks] == ["timing"]
    assert "300 s after its first record" in e2.marks[0].why
    # Outside that window the same difference counts.
    [e3] = compare(History.of([reported("E3", 0), decision("E3", "Approve", 0.5)]),
                   [decision("E3", "Defer", 0)])  # fmt: skip
    assert e3.counted


def test_a_pause_or_resume_is_not_an_event() -> None:
    history = History.of([reported("E1", 0), decision("(fleet)", "Pause", 1),
                          decision("E1", "Defer", 1.5)])  # fmt: skip
    assert [e.event_id for e in compare(history, [decision("E1", "Defer", 0)])] == ["E1"]
