"""The demo asks a person (issue 29): its policy asks the db owner about the availability-set
scenario's reboot, the live view shows the ask and how to answer it, and the command it shows
approves the event through the demo consumer's loopback page."""

from __future__ import annotations

import io
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge import cli
from bridge import recordtypes as rt
from bridge.demo import ASKED, SCENARIOS, Answering, Demo, View, se_bridge
from tests.support.processes import read_records
from tests.support.wait import eventually


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    running = Demo(tmp_path, scale=30.0, poll=0.2, view=View(io.StringIO(), live=True))
    running.start()
    try:
        yield running
    finally:
        running.stop()


def frame(demo: Demo) -> str:
    return demo.view.render(demo.simulator.vm_names, demo.scale)


def test_the_live_view_shows_the_ask_and_its_command_approves_it(
    demo: Demo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    demo.play(SCENARIOS.index(ASKED))
    [(_, [event_id])] = demo.played

    def asked() -> str | None:
        shown = frame(demo)
        return shown if "se-bridge approve" in shown else None

    shown = eventually(asked, what="the view to show the ask", details=lambda: frame(demo))
    waiting = shown.split("Waiting for a person\n", 1)[1]
    head = waiting.splitlines()[0]
    assert head.startswith(f"  Reboot {event_id} on db-0: asked db-owner at ")
    assert ", waits until " in head
    assert "(NotBefore " in head
    page = next(line for line in waiting.splitlines() if "answer on the page" in line)
    assert "http://127.0.0.1:" in page
    assert "/login?code=" in page
    command = next(line for line in waiting.splitlines() if "or approve it:" in line)
    shell = shlex.split(command.split("or approve it: ", 1)[1])
    assert shell[: len(se_bridge())] == se_bridge()  # what runs this se-bridge from a shell
    argv = shell[len(se_bridge()) :]
    assert argv[:2] == ["approve", event_id]
    assert argv[argv.index("--state-dir") + 1] == str(tmp_path / "consumer")

    assert cli.main(argv) == 0, capsys.readouterr()
    assert "Accepted: " in capsys.readouterr().out

    def approved() -> list[rt.Approval]:
        return [
            a
            for a in demo.view.answers.values()
            if a["EventId"] == event_id and a["ApprovalOutcome"] == "Approved"
        ]

    [answer] = eventually(approved, what="db-0's Approval record", details=lambda: frame(demo))
    assert answer["VmName"] == "db-0"
    eventually(
        lambda: "Waiting for a person" not in frame(demo),
        what="the ask to leave the view",
        details=lambda: frame(demo),
    )
    decisions = [
        d
        for d in read_records(tmp_path / "decisions.jsonl")
        if d["EventId"] == event_id and d["DecisionAction"] == "Approve"
    ]
    assert [(d["DecisionRule"], d["OperatorReason"]) for d in decisions] == [
        ("(person)", "checked db-0")
    ]
    assert str(decisions[0]["DecidedBy"]).startswith("local:")
    # The summary says how the ask ended, and who answered it.
    [ended] = [line for line in demo.view.event_lines() if line.startswith(f"  {event_id[:8]} ")]
    assert ended.startswith(f"  {event_id[:8]} Reboot on db-0: approved by "), ended


ASK = {
    "RecordType": "Decision",
    "RecordId": "r1",
    "TimeGenerated": "2026-11-27T08:30:12.000Z",
    "VmName": None,
    "EventId": "E1",
    "EventType": "Reboot",
    "Resources": ["db-0"],
    "NotBefore": "2026-11-27T08:31:12.000Z",
    "DecisionAction": "Ask",
    "DecisionRule": "ask-the-db-owner",
    "AskedTarget": "db-owner",
    "AskDeadline": "2026-11-27T08:30:42.000Z",
    "TargetVmName": None,
}


def test_off_a_terminal_an_ask_is_printed_once_and_a_later_decision_ends_it() -> None:
    out = io.StringIO()
    view = View(out, live=False)
    ask = dict(ASK)
    held = {**ask, "RecordId": "r3", "DecisionAction": "Hold", "AskDeadline": None}
    for record in (ask, {**ask, "RecordId": "r2"}, held):
        view.add("central", record)  # type: ignore[arg-type]
    said = out.getvalue()
    assert said.count("asked db-owner at 08:30:12, waits until 08:30:42 (NotBefore 08:31:12)") == 1
    assert view.asks == {}
    assert "Waiting for a person" not in view.render(["db-0"], 1.0)
    assert view.event_lines() == [
        "events 1: 0 approved, 1 held; 1 still open",
        "asked a person 1:",
        "  E1 Reboot on db-0: nobody answered; held at its deadline, 08:30:12",
    ]


def test_three_asks_at_once_fit_80x24_the_first_whole() -> None:
    view = View(io.StringIO(), live=True)
    view.answering = Answering(
        "http://127.0.0.1:40807", Path("/tmp/se-bridge-demo-9v0xfuw5/consumer"), lambda: "c0de"
    )
    for n in range(3):
        event = f"{n}713B912-BC70-461D-A9B0-3C8BD629AF35"
        view.add("central", {**ASK, "RecordId": f"r{n}", "EventId": event})  # type: ignore[arg-type]
    vms = [f"vm-{n}" for n in range(8)]
    lines = view.render(vms, 30.0, 80, 24).splitlines()
    assert len(lines) <= 24
    assert max(len(line) for line in lines) <= 80
    assert lines[0].startswith("se-bridge demo: 8 VMs")
    assert "  Reboot 0713B912-BC70-461D-A9B0-3C8BD629AF35 on db-0: asked db-owner at" in lines
    assert lines[-1] == "  and 2 more: see the page"
    # On a larger terminal, more.
    larger = view.render(vms, 30.0, 120, 44).splitlines()
    assert len([line for line in larger if line.startswith("  Reboot ")]) == 3
    assert "Recent records" in larger
