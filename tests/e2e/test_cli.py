"""The `se-bridge` command line as a user meets it, and the local demo."""

from __future__ import annotations

import argparse
import json
import os
import pty
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bridge import __version__
from bridge.simulator.vms import demo_vms
from tests.support.processes import (
    PYTHON,
    Agent,
    Processes,
    Simulator,
    agent_reporting_a_freeze,
    assert_all_valid,
    child_env,
    read_records,
    run_bridge,
)

pytestmark = pytest.mark.e2e


def console_script() -> Path:
    """The installed `se-bridge` entry point beside this interpreter."""
    folder = Path(PYTHON).parent
    script = folder / ("se-bridge.exe" if sys.platform == "win32" else "se-bridge")
    if not script.exists():
        pytest.skip(f"se-bridge is not installed beside {PYTHON}")
    return script


def test_version_from_the_console_script() -> None:
    done = subprocess.run(
        [str(console_script()), "--version"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"se-bridge {__version__}")


def test_module_help_lists_the_commands() -> None:
    done = run_bridge("--help")
    assert done.returncode == 0, done.stderr
    for command in ("agent", "simulate", "demo"):
        assert command in done.stdout


@pytest.mark.parametrize(
    ("flags", "env", "origin"),
    [
        (["--poll-interval", "0"], {}, "from the command line"),
        ([], {"SE_BRIDGE_AGENT_POLL_INTERVAL": "0"}, "from SE_BRIDGE_AGENT_POLL_INTERVAL"),
    ],
)
def test_bad_poll_interval_names_the_setting(
    tmp_path: Path, flags: list[str], env: dict[str, str], origin: str
) -> None:
    done = run_bridge("agent", "--state-dir", str(tmp_path / "state"), *flags, env=env)
    assert done.returncode == 2
    assert f"agent.poll_interval ({origin})" in done.stderr
    assert "Traceback" not in done.stderr
    # Refused before anything was created.
    assert not (tmp_path / "state").exists()


def test_unknown_sink_names_the_sink(tmp_path: Path) -> None:
    done = run_bridge("agent", "--state-dir", str(tmp_path / "state"), "--sink", "kafka:x")
    assert done.returncode == 2
    assert "agent.sinks" in done.stderr
    assert "kafka" in done.stderr
    assert "Traceback" not in done.stderr


def test_demo_runs_and_leaves_valid_records(tmp_path: Path) -> None:
    state = tmp_path / "demo"
    done = run_bridge(
        "demo", "--duration", "12", "--every", "2", "--state-dir", str(state),
        "--log-level", "info", timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert " INFO " in done.stderr  # quiet by default, for the live view; not when asked
    # Not a terminal: one line per record instead of a redrawn screen.
    assert "\x1b[" not in done.stdout
    assert "Event " in done.stdout
    assert "\nSummary\n" in done.stdout
    assert "scenarios played: live-migration, user-reboot, availability-set" in done.stdout
    # A person is asked about db-0's reboot: how to answer is printed with the ask.
    assert "on db-0: asked db-owner at " in done.stdout
    assert "answer on the page (signs you in once: http://127.0.0.1:" in done.stdout
    assert " approve " in done.stdout

    kinds: Counter[str] = Counter()
    for vm in demo_vms():
        records = read_records(state / vm.name / "records.jsonl")
        assert records, f"{vm.name} has no records\n{done.stdout}"
        assert_all_valid(records)
        assert {r["VmName"] for r in records} == {vm.name}
        reasons = [r["HeartbeatReason"] for r in records if r["RecordType"] == "Heartbeat"]
        assert (reasons[0], reasons[-1]) == ("Start", "Stop")
        kinds.update(r["RecordType"] for r in records)
        kinds.update(f"Event {r['Transition']}" for r in records if r["RecordType"] == "Event")
    assert kinds["Event Scheduled"] >= 1, kinds
    assert kinds["Hook"] >= 1, kinds
    _assert_the_summary_counts_events(done.stdout, state)


def _assert_the_summary_counts_events(stdout: str, state: Path) -> None:
    """The summary counts events, not the records each VM wrote of them (several VMs see one
    event, and each records its every transition), says what the consumer decided of them,
    and how each ask ended (issue 39)."""
    summary = stdout.split("\nSummary\n", 1)[1].splitlines()
    events = {
        str(r["EventId"]).lower()
        for vm in demo_vms()
        for r in read_records(state / vm.name / "records.jsonl")
        if r["RecordType"] == "Event"
    }
    actions: dict[str, set[str]] = {}
    for decision in read_records(state / "decisions.jsonl"):
        if decision["EventId"]:
            actions.setdefault(decision["EventId"].lower(), set()).add(decision["DecisionAction"])
    approved = {e for e, did in actions.items() if "Approve" in did}
    held = {e for e, did in actions.items() if "Hold" in did} - approved
    asked = {e for e, did in actions.items() if "Ask" in did}
    [line] = [line for line in summary if line.startswith("  events ")]
    said = f"  events {len(events)}: {len(approved)} approved, {len(held)} held, "
    assert line.startswith(said), line
    [asks] = [line for line in summary if line.startswith("  asked a person ")]
    assert asks == f"  asked a person {len(asked)}:", summary
    for event in asked:
        [ended] = [line for line in summary if line.lower().startswith(f"    {event[:8]} ")]
        assert " on db-0: " in ended, ended
    assert not [line for line in summary if line.split()[:2] == ["Event", "Scheduled"]], summary


def test_the_live_view_draws_on_the_alternate_screen_and_leaves_the_scrollback(
    tmp_path: Path,
) -> None:
    # On a terminal the view is redrawn twice a second: on the alternate screen, so what the
    # user had in the terminal stays, and the summary prints on the normal screen after.
    leader, follower = pty.openpty()
    argv = [PYTHON, "-m", "bridge", "demo", "--duration", "3", "--state-dir", str(tmp_path)]
    child = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE, env=child_env()
    )
    os.close(follower)
    shown = bytearray()
    while chunk := _read_pty(leader):
        shown += chunk
    os.close(leader)
    assert child.wait(timeout=60) == 0, child.stderr.read() if child.stderr else ""
    if child.stderr:
        child.stderr.close()
    text = shown.decode("utf-8", "replace")
    enter, leave = text.find("\x1b[?1049h"), text.rfind("\x1b[?1049l")
    assert 0 <= enter < leave, text[:300]
    assert "\x1b[2J" not in text  # never wipes the screen
    assert "\x1b[3J" not in text  # nor the scrollback
    assert text.count("\x1b[1;1H") >= 3  # redrawn in place
    assert "\nSummary" in text[leave:]
    assert "\x1b[?25h" in text[leave - 10 :]  # the cursor is shown again


def _read_pty(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the child closed its end
        return b""


def test_stdout_sink_carries_the_same_records_as_jsonl(procs: Processes) -> None:
    sim = Simulator.launch(procs, "sim", "--vms", "1")
    agent = Agent(procs, "vm-0", sim.vm_url("vm-0"), args=["--sink", "stdout"]).start()
    sim.wait_polls({"vm-0": 2})
    event_id = sim.add_event(EventType="Freeze", Resources=["vm-0"], notice=3600.0)
    agent.wait_transition(event_id, "Scheduled")
    assert agent.stop() == 0

    # stdout holds records only; the agent's log went to stderr.
    printed = [json.loads(line) for line in agent.proc.stdout().splitlines()]
    assert printed == agent.records()
    assert [r.get("Transition") or r["HeartbeatReason"] for r in printed] == [
        "Start",
        "Scheduled",
        "Stop",
    ]
    assert_all_valid(printed)
    assert "INFO" in agent.stderr()


def test_json_logs_are_one_object_per_line_with_the_fields_a_pipeline_wants(
    procs: Processes,
) -> None:
    sim = Simulator.launch(procs, "sim", "--vms", "1")
    args = ["--log-format", "json", "--log-level", "info"]
    agent = Agent(procs, "vm-0", sim.vm_url("vm-0"), args=args).start()
    sim.wait_polls({"vm-0": 2})
    event_id = sim.add_event(EventType="Freeze", Resources=["vm-0"], notice=3600.0)
    agent.wait_transition(event_id, "Scheduled")
    assert agent.stop() == 0
    lines = [json.loads(line) for line in agent.stderr().splitlines() if line.strip()]
    assert lines, "the agent logged nothing"
    for line in lines:
        assert {"time", "level", "logger", "message", "program", "version", "pid", "thread"} <= set(
            line
        ), line
        assert line["program"] == "agent"
        assert line["time"].endswith("Z")
    assert "INFO" in {line["level"] for line in lines}
    assert any(event_id in line["message"] for line in lines)

    quiet = Agent(procs, "vm-0b", sim.vm_url("vm-0"), args=["--log-level", "WARNING"]).start()
    sim.wait_polls({"vm-0": 4})
    assert quiet.stop() == 0
    assert " INFO " not in quiet.stderr()


def test_every_sub_command_takes_the_log_options() -> None:
    from bridge.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        options = {o for a in sub._actions for o in a.option_strings}
        assert {"--log-level", "--log-format"} <= options, name


def test_status_reads_a_running_agents_state_and_exits_as_a_check(
    procs: Processes, tmp_path: Path
) -> None:
    _, agent, event_id = agent_reporting_a_freeze(procs)
    # Relative, as an operator types it in the agent's directory.
    done = run_bridge("status", "--state-dir", os.path.relpath(agent.state_dir), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    said = json.loads(done.stdout)
    assert said["status"] == "OK"
    assert said["identity"]["vm_name"] == "vm-0"
    assert said["heartbeat"]["reason"] == "Start"
    assert [e["EventId"] for e in said["document"]["events"]] == [event_id]
    assert [s["name"] for s in said["spool"]["sinks"]] == [f"jsonl:{agent.sink}"]
    text = run_bridge("status", "--state-dir", str(agent.state_dir))
    assert text.stdout.startswith("OK: se-bridge agent state in")
    assert f"{event_id} Freeze Scheduled" in text.stdout
    assert agent.stop() == 0
    stopped = run_bridge("status", "--state-dir", str(agent.state_dir))
    assert stopped.returncode == 2
    assert "CRITICAL: the agent stopped at" in stopped.stdout
    nothing = run_bridge("status", "--state-dir", str(tmp_path / "none"))
    assert nothing.returncode == 3
    assert nothing.stdout.startswith("UNKNOWN: there is no spool")


def test_status_says_unknown_for_every_failure_to_check(tmp_path: Path) -> None:
    """A monitoring system reads 1 as WARNING and 2 as CRITICAL: not being able to look is 3."""
    unknown = run_bridge("status", "--state-dir", str(tmp_path / "none"), "--json")
    assert unknown.returncode == 3
    said = json.loads(unknown.stdout)
    assert said["status"] == "UNKNOWN"
    assert "there is no spool" in said["problems"][0]
    (tmp_path / "spool.db").write_bytes(b"not a database" * 100)
    broken = run_bridge("status", "--state-dir", os.path.relpath(tmp_path))
    assert (broken.returncode, broken.stderr) == (3, ""), broken.stderr
    assert broken.stdout.startswith("UNKNOWN: cannot read the spool")
    for bad in (["--backlog-age", "soon"], ["--no-such-option"]):
        usage = run_bridge("status", "--state-dir", str(tmp_path), *bad)
        assert usage.returncode == 3, bad
        assert "error:" in usage.stderr


def test_a_settings_mistake_is_told_with_its_line_a_suggestion_and_the_form(
    tmp_path: Path,
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\npoll_intervall = 2\n\n[imds]\ntimeout = "5s"\n', encoding="utf-8")
    done = run_bridge("check", "--config", str(config))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{config}:2: unknown setting agent.poll_intervall (did you mean " in done.stderr
    config.write_text('[imds]\ntimeout = "5s"\n', encoding="utf-8")
    done = run_bridge("check", "--config", str(config))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{config}:2: imds.timeout: expected a number of seconds from 0.5 to 300 " in done.stderr
    assert "could not convert" not in done.stderr

    typo = run_bridge("check", "--sink", f"jsonl:{tmp_path / 'out.jsonl'}",
                      "--imds-url", "http://127.0.0.1:9",
                      env={"SE_BRIDGE_AGENT_POLL_INTERVALL": "3"})  # fmt: skip
    said = ("ignoring SE_BRIDGE_AGENT_POLL_INTERVALL: no setting has that name (did you mean "
            "SE_BRIDGE_AGENT_POLL_INTERVAL?)")  # fmt: skip
    assert said in typo.stderr, typo.stderr
