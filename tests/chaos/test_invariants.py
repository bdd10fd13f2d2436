"""The chaos checks themselves: each one flags what it is there to flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bridge.simulator.fleet import EventSpec
from tests.chaos import invariants as inv

USER = EventSpec("Reboot", ("web_0",), event_source="User")
USER_1 = EventSpec("Reboot", ("web_1",), event_source="User")
PLATFORM = EventSpec("Redeploy", ("web_0",))


def event(event_id: str, resources: list[str], **times: Any) -> dict[str, Any]:
    base = {"approvedAt": None, "startedAt": None, "endedAt": None, "status": "Completed"}
    return {"eventId": event_id, "resources": resources, **base, **times}


def approval(event_id: str, status: int = 200) -> dict[str, Any]:
    return {"eventId": event_id, "vm": "web_0", "status": status}


def decision(event_id: str) -> dict[str, Any]:
    return {"EventId": event_id, "DecisionAction": "Approve", "DecisionRule": "user-reboots"}


def test_two_approvals_overlapping_in_one_scale_set_exceed_the_budget() -> None:
    report = inv.Report()
    events = {"a": event("a", ["web_0"], approvedAt=1.0, startedAt=1.0, endedAt=5.0),
              "b": event("b", ["web_1"], approvedAt=4.0, startedAt=4.0, endedAt=6.0)}  # fmt: skip
    inv.check_budgets(report, {"a": USER, "b": USER_1}, events)
    assert len(report.problems) == 1
    assert "budget exceeded" in report.problems[0]
    events["b"] = event("b", ["web_1"], approvedAt=5.0, startedAt=5.0, endedAt=6.0)
    report = inv.Report()
    inv.check_budgets(report, {"a": USER, "b": USER_1}, events)
    assert report.problems == []


def test_an_approval_the_policy_holds_or_twice_or_unexplained_is_flagged() -> None:
    report = inv.Report()
    specs = {"a": USER, "h": PLATFORM}
    inv.check_approvals(report, specs, [approval("a"), approval("a"), approval("h")],
                        [decision("a")], [])  # fmt: skip
    text = "\n".join(report.problems)
    assert "received StartRequests for a 2 times" in text
    assert "which the policy does not allow" in text
    assert "no Approve decision explains" in text


def write(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_a_record_missing_from_a_sink_or_changed_in_one_is_flagged(tmp_path: Path) -> None:
    records = [{"RecordId": str(i), "RecordType": "Heartbeat"} for i in range(3)]
    write(tmp_path / "vm.jsonl", records)
    report = inv.Report()
    changed = {**records[1], "RecordType": "Event"}
    inv.check_delivery(report, {"vm": tmp_path / "vm.jsonl"},
                       {"good": records + records[:1], "bad": [records[0], changed]})  # fmt: skip
    assert [p.split(":")[0] for p in report.problems] == ["bad", "bad"]
    assert "missing 2" in report.problems[0]
    assert "differs" in report.problems[1]


def test_an_event_that_never_ended_or_ended_wrongly_is_flagged(tmp_path: Path) -> None:
    def record(rid: str, transition: str, inferred: bool = False) -> dict[str, Any]:
        return {"RecordId": rid, "RecordType": "Event", "EventId": "e", "Transition": transition,
                "Inferred": inferred}  # fmt: skip

    cases = {
        "never ended": ([record("1", "Scheduled")], "Completed"),
        "Completed, but it was canceled": ([record("1", "Scheduled"), record("2", "Completed")],
                                           "Canceled"),
        "after Completed": ([record("1", "Started"), record("2", "Completed"),
                             record("3", "Started")], "Completed"),
    }  # fmt: skip
    for expected, (records, status) in cases.items():
        write(tmp_path / "vm.jsonl", records)
        report = inv.Report()
        inv.check_transitions(report, {"vm": tmp_path / "vm.jsonl"}, {"e": {"status": status}})
        assert len(report.problems) == 1, (expected, report.problems)
        assert expected in report.problems[0]
