"""`policy replay`'s core over a history recorded by a real consumer (issue 40, item 4): the
same policy reproduces every recorded decision; a changed budget shows exactly the events it
changes, with the budgets' arithmetic; a Log Analytics export replays as the records do."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from bridge import recordtypes as rt
from bridge.cli import build_parser
from bridge.config import ConsumerSettings
from bridge.consumer import explain, whatif
from bridge.consumer.core import Consumer
from bridge.consumer.explain import read_records
from bridge.consumer.replay import replay
from bridge.consumer.state.memory import MemoryStore
from bridge.policy.file import loads
from bridge.policy.model import Policy
from bridge.records import parse_time
from tests.support.fleetrecords import FleetRecords
from tests.support.laexport import az_rows, every_column
from tests.support.records import Sender

T0 = datetime(2026, 11, 21, 10, tzinfo=timezone.utc)
POLICY = """
version: 1
budgets:
  - {name: one-per-set, group: scale_set, max_vms: %d}
rules:
  - {name: user-initiated, match: {event_source: User}, action: approve}
  - {name: everything-else, action: hold}
"""
READ_LAG = 0.4  # how long after its TimeGenerated the live consumer reads each record


def policy(max_vms: int) -> Policy:
    return loads(POLICY % max_vms, "policy.yaml")


class Recording:
    """A real consumer deciding as records come, each read READ_LAG after it was written,
    with its re-evaluation pass every 5 s; the agents answer its approvals. What it keeps:
    every record, the agents' and its Decision records, as Log Analytics would."""

    def __init__(self, budget: int = 1) -> None:
        self.fleet = FleetRecords(T0)
        for n in range(4):
            self.fleet.vm(f"web_{n}", scale_set="web")
        self.clock = T0
        self.sender = Sender()
        self.decisions: list[rt.Decision] = []
        self.agents: list[dict[str, Any]] = []
        self.consumer = Consumer(MemoryStore(), self.sender, policy(budget),
                                 self.decisions.extend, ConsumerSettings(),
                                 now=lambda: self.clock)  # fmt: skip
        self._ticked = T0

    def write(self, *records: dict[str, Any]) -> None:
        for record in records:
            self.agents.append(record)
            stamped = parse_time(record["TimeGenerated"])
            assert stamped is not None
            self._until(stamped + timedelta(seconds=READ_LAG))
            self.consumer.process([record])

    def after(self, seconds: float) -> None:
        self.fleet.advance(seconds)
        self._until(self.fleet.now)

    def _until(self, moment: datetime) -> None:
        while self._ticked + timedelta(seconds=5) <= moment:
            self._ticked += timedelta(seconds=5)
            self.clock = self._ticked
            self.consumer.tick()
        self.clock = moment

    def answer(self) -> None:
        """The VM of the last approval sent approves it a second later."""
        self.after(1)
        self.write(self.fleet.approval(self.sender.sent[-1]))

    def history(self) -> list[dict[str, Any]]:
        return [*self.agents, *(dict(d) for d in self.decisions)]


def a_week_day() -> Recording:
    """web_0 and web_1 rebooted by their users a second apart, one budget slot: web_1 waits
    for web_0's reboot to end. A platform reboot of web_2 is held."""
    live = Recording()
    fleet = live.fleet
    live.write(*(fleet.heartbeat(f"web_{n}", "Start") for n in range(4)))
    live.after(10)
    live.write(fleet.event("web_0", "E1"))
    live.after(1)
    live.write(fleet.event("web_1", "E2"))
    live.after(1)
    live.write(fleet.event("web_2", "E3", source="Platform"))
    live.answer()
    live.after(30)
    live.write(fleet.event("web_0", "E1", transition="Started"))
    live.after(60)
    live.write(fleet.event("web_0", "E1", transition="Completed"))
    live.after(5)  # the next pass approves E2
    live.answer()
    live.after(20)
    live.write(fleet.event("web_1", "E2", transition="Started"))
    live.after(60)
    live.write(fleet.event("web_1", "E2", transition="Completed"))
    live.write(*(fleet.heartbeat(f"web_{n}") for n in range(4)))
    return live


def actions(decided: Sequence[Any]) -> list[tuple[str, str | None]]:
    return [(d.action, d.rule) for d in decided]


def test_the_same_policy_reproduces_every_recorded_decision() -> None:
    live = a_week_day()
    assert [(d["EventId"], d["DecisionAction"]) for d in live.decisions] == [
        ("E1", "Approve"), ("E2", "Defer"), ("E3", "Hold"), ("E2", "Approve")]  # fmt: skip
    done = replay(live.history(), policy(1), ConsumerSettings())
    assert [e.event_id for e in done.events] == ["E1", "E2", "E3"]
    assert [e for e in done.events if e.differs] == []
    assert done.decisions == 4
    assert done.records == len(live.agents)
    assert all(not e.assumed for e in done.events)
    replayed = {e.event_id: actions(e.replayed) for e in done.events}
    assert replayed["E2"] == [("Defer", "user-initiated"), ("Approve", "user-initiated")]


def test_a_larger_budget_shows_exactly_the_event_it_would_have_approved_sooner() -> None:
    done = replay(a_week_day().history(), policy(2), ConsumerSettings())
    assert [e.event_id for e in done.differing] == ["E2"]
    assert done.marked == ()
    e2 = done.differing[0]
    assert actions(e2.recorded) == [("Defer", "user-initiated"), ("Approve", "user-initiated")]
    assert actions(e2.replayed) == [("Approve", "user-initiated")]
    # The budgets' arithmetic, both ways: the slot web_0 held was full at 1, fits at 2.
    assert e2.recorded[0].budgets == (
        "budget one-per-set: 8d5f9c8e-0000-4000-8000-000000000001/rg-app/web has 1 of 4 VMs "
        "impacted; 1 more would exceed 1",)  # fmt: skip
    assert e2.replayed[0].budgets == (
        "budget one-per-set: 8d5f9c8e-0000-4000-8000-000000000001/rg-app/web has 1 of 4 VMs "
        "impacted; 1 more fit the limit of 2",)  # fmt: skip
    # The history sent its approval 95 s later: the replay's was taken as approved at once.
    assert len(e2.assumed) == 1
    tallied = {t.rule: t for t in done.rules}
    assert tallied["user-initiated"].recorded == {"Approve": 2, "Defer": 1}
    assert tallied["user-initiated"].replayed == {"Approve": 2}
    assert tallied["user-initiated"].differing == 1
    assert tallied["everything-else"].differing == 0


def test_a_smaller_budget_holds_back_what_two_slots_let_through() -> None:
    """Recorded with two slots (both approved at once), replayed with one."""
    live = Recording(budget=2)
    fleet = live.fleet
    live.write(*(fleet.heartbeat(f"web_{n}", "Start") for n in range(4)))
    live.after(10)
    live.write(fleet.event("web_0", "E1"))
    live.answer()
    live.write(fleet.event("web_1", "E2"))
    live.answer()
    live.after(30)
    live.write(fleet.event("web_0", "E1", transition="Started"),
               fleet.event("web_1", "E2", transition="Started"))  # fmt: skip
    live.after(60)
    live.write(fleet.event("web_0", "E1", transition="Completed"),
               fleet.event("web_1", "E2", transition="Completed"))  # fmt: skip
    assert replay(live.history(), policy(2), ConsumerSettings()).differing == ()
    done = replay(live.history(), policy(1), ConsumerSettings())
    assert [e.event_id for e in done.differing] == ["E2"]
    e2 = done.differing[0]
    assert actions(e2.recorded) == [("Approve", "user-initiated")]
    # Held back while E1 counts; the history's own approval of E2 answers nothing of the
    # replay's (it never sent one then), and E2 started as the history says: nothing left.
    assert actions(e2.replayed)[0] == ("Defer", "user-initiated")
    assert "1 more would exceed 1" in e2.replayed[0].budgets[0]


def test_a_log_analytics_export_replays_as_the_records_do(tmp_path: Path) -> None:
    """As `az monitor log-analytics query -o json` prints the table: every value as text."""
    export = tmp_path / "records.json"
    export.write_text(json.dumps(az_rows(a_week_day().history(), every_column())), "utf-8")
    history = read_records(export)
    assert replay(history, policy(1), ConsumerSettings()).differing == ()
    done = replay(history, policy(2), ConsumerSettings())
    assert [e.event_id for e in done.differing] == ["E2"]


# --- se-bridge policy replay -------------------------------------------------------------------


def run_replay(tmp_path: Path, budget: int, *argv: str, poison: Sequence[str] = ()) -> int:
    """`se-bridge policy replay` through the command line's parser, in this process, over
    a_week_day's history as the agents' and the consumer's jsonl sinks hold it (with the
    lines of `poison` among the agents' after their first record)."""
    live = a_week_day()
    agents, decisions = tmp_path / "agents.jsonl", tmp_path / "decisions.jsonl"
    lines = [json.dumps(r) + "\n" for r in live.agents]
    lines[1:1] = [line + "\n" for line in poison]
    agents.write_text("".join(lines), "utf-8")
    decisions.write_text("".join(json.dumps(r) + "\n" for r in live.decisions), "utf-8")
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY % budget, "utf-8")
    args = build_parser().parse_args(["policy", "replay", "--policy", str(policy_file),
                                      "--records", str(agents), "--records", str(decisions),
                                      *argv])  # fmt: skip
    code: int = args.func(args)
    return code


def test_the_command_exits_0_when_nothing_differed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_replay(tmp_path, 1)
    said = capsys.readouterr().out
    assert code == 0, said
    assert "3 events: 0 would differ, 0 marked" in said
    assert "user-initiated   Approve 2, Defer 1  Approve 2, Defer 1  0" in said


def test_the_command_exits_1_and_shows_each_sides_decisions_and_budgets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_replay(tmp_path, 2)
    said = capsys.readouterr().out
    assert code == 1, said
    assert "1 event would have been decided differently:" in said
    assert "  event E2: Reboot from User, web_1" in said
    assert "Defer by user-initiated: budget one-per-set:" in said
    assert "has 1 of 4 VMs impacted; 1 more fit the limit of 2" in said
    assert "event E1" not in said  # decided the same: listed only with --all


def test_the_commands_json_names_what_differs_as_records_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_replay(tmp_path, 2, "--json")
    said = json.loads(capsys.readouterr().out)
    assert code == 1
    assert (said["Events"], said["Differing"], said["Marked"], said["Same"]) == (3, 1, 0, 2)
    assert said["RecordedDecisions"] == 4
    [e2] = said["EventsReplayed"]
    assert (e2["EventId"], e2["Differs"], e2["Counted"]) == ("E2", True, True)
    assert [d["DecisionAction"] for d in e2["Recorded"]] == ["Defer", "Approve"]
    assert [d["DecisionAction"] for d in e2["Replayed"]] == ["Approve"]
    assert e2["Replayed"][0]["Budgets"][0].endswith("1 more fit the limit of 2")
    rules = {r["DecisionRule"]: r for r in said["Rules"]}
    assert rules["user-initiated"]["Replayed"] == {"Approve": 2}
    assert rules["user-initiated"]["EventsDiffering"] == 1


def test_decisions_alone_are_refused_naming_what_a_replay_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    decisions = tmp_path / "decisions.jsonl"
    decisions.write_text("".join(json.dumps(r) + "\n" for r in a_week_day().decisions), "utf-8")
    args = build_parser().parse_args(["policy", "replay", "--records", str(decisions)])
    assert args.func(args) == 2
    said = capsys.readouterr().err
    assert "no Event record: a replay needs the agents' records" in said


def poison() -> tuple[str, ...]:
    """A record the consumer refuses (a heartbeat of the history whose PendingEvents, a
    count, says "many"), a line that is not JSON, and a JSON value that is not a record."""
    heartbeat = next(r for r in a_week_day().agents if r["RecordType"] == "Heartbeat")
    refused = {**heartbeat, "RecordId": "bad-1", "PendingEvents": "many"}
    return json.dumps(refused), '{"RecordType": "Heartbeat", "VmId": ', "[1, 2]"


def test_refused_records_are_set_aside_and_the_replay_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_replay(tmp_path, 2, poison=poison())
    said = capsys.readouterr().out
    assert code == 1, said  # the decisions still differ, as without the poison
    assert "1 event would have been decided differently:" in said
    assert "3 records set aside (not replayed):" in said
    assert "agents.jsonl: line 2 is refused: PendingEvents" in said
    assert "agents.jsonl: line 3 is not JSON" in said
    assert "agents.jsonl: line 4 is not a JSON object" in said


def test_the_same_policy_still_exits_0_with_records_set_aside_and_json_lists_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_replay(tmp_path, 1, "--json", poison=poison())
    said = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (said["Events"], said["Differing"], said["Same"]) == (3, 0, 3)
    aside = said["SetAside"]
    assert [a["Where"] for a in aside] == ["line 2", "line 3", "line 4"]
    assert {a["File"] for a in aside} == {str(tmp_path / "agents.jsonl")}
    assert aside[0]["RecordId"] == "bad-1"
    assert aside[0]["Reason"].startswith("is refused: PendingEvents")


# A file as Log Analytics or a sink holds it: the history's lines in time order; a decision
# whose every "Decision" is escaped (not read ahead); the lines out of time order; poison.
ONE_FILE: dict[str, Callable[[list[str]], list[str]]] = {
    "in order": lambda lines: lines,
    "escaped": lambda lines: [line.replace("Decision", "\\u0044ecision") for line in lines],
    "out of order": lambda lines: lines[::-1],
    "poisoned": lambda lines: [*lines[:3], *poison(), *lines[3:]],
}


@pytest.mark.parametrize("shape", sorted(ONE_FILE))
@pytest.mark.parametrize("budget", [1, 2])
def test_a_large_file_replayed_as_it_is_read_says_what_it_says_read_whole(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    shape: str,
    budget: int,
) -> None:
    live = a_week_day()
    records = sorted(live.history(), key=lambda r: str(r["TimeGenerated"]))
    path = tmp_path / "history.jsonl"
    path.write_text(
        "".join(line + "\n" for line in ONE_FILE[shape]([json.dumps(r) for r in records])), "utf-8"
    )
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY % budget, "utf-8")
    argv = ["policy", "replay", "--policy", str(policy_file), "--records", str(path), "--json"]

    def said() -> tuple[int, str]:
        args = build_parser().parse_args(argv)
        code: int = args.func(args)
        return code, capsys.readouterr().out

    whole = said()
    monkeypatch.setattr(explain, "SPLIT_CHARS", 100)  # as it is read, a few lines a chunk
    monkeypatch.setattr(explain, "CHUNK_CHARS", 2_000)
    made: list[explain.Chunked | None] = []

    def chunked(path: Path, aside: list[explain.SetAside]) -> explain.Chunked | None:
        made.append(explain.chunked(path, aside))
        return made[-1]

    monkeypatch.setattr(whatif, "chunked", chunked)
    assert said() == whole
    assert made
    assert made[0] is not None
    assert whole[0] == (0 if budget == 1 else 1)
    assert json.loads(whole[1])["Events"] == 3


def test_a_file_that_is_not_utf8_is_bad_input_naming_its_first_bad_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It was a traceback and exit 1 (which says "something differed").
    path = tmp_path / "history.jsonl"
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in a_week_day().agents[:3]))
    path.write_bytes(path.read_bytes() + b'{"RecordType": "Heartbeat\xff"}\n')
    args = build_parser().parse_args(["policy", "replay", "--records", str(path)])
    assert args.func(args) == 2
    said = capsys.readouterr().err
    assert f"--records {path} is not UTF-8 text (JSON's encoding): byte 0xff at offset" in said
