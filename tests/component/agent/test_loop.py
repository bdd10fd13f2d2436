"""The agent in-process against the IMDS simulator, one poll cycle at a time."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge.agent.loop import Agent
from bridge.agent.wiring import build_agent
from bridge.config import Config, HooksSettings
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import EventSpec
from tests.support.agentharness import VM, AgentHarness
from tests.support.wait import eventually


class Harness(AgentHarness):
    def __init__(self, server: SimulatorServer, root: Path, **imds: Any) -> None:
        super().__init__(server, root)
        self.imds = imds

    def start(self, boot: str = "b1", hooks: HooksSettings | None = None) -> Agent:
        config = Config(
            agent=self.agent_settings(),
            imds=self.imds_settings(**self.imds),
            hooks=hooks or HooksSettings(),
        )
        self.agent = build_agent(config, boot_id=boot)
        self.agent.start()
        return self.agent


@pytest.fixture
def harness(sim: tuple[Simulator, SimulatorServer], tmp_path: Path) -> Iterator[Harness]:
    h = Harness(sim[1], tmp_path)
    yield h
    h.stop()


def transitions(records: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    return [(r["EventId"], r["Transition"], r["Inferred"]) for r in records]


def test_scheduled_started_completed_with_identity(
    sim: tuple[Simulator, SimulatorServer], harness: Harness
) -> None:
    simulator, _ = sim
    harness.start()
    event = simulator.add_event(EventSpec("Reboot", (VM,), event_source="User"))
    harness.poll()
    simulator.start_event(event)
    harness.poll()
    simulator.complete_event(event)
    harness.poll()
    records = harness.records()
    assert transitions(records) == [
        (event, "Scheduled", False),
        (event, "Started", False),
        (event, "Completed", False),
    ]
    vm = simulator.fleet.vm(VM)
    assert {(r["VmId"], r["VmName"], r["AffectsThisVm"]) for r in records} == {(vm.vm_id, VM, True)}
    assert records[0]["EventSource"] == "User"


def test_unchanged_document_writes_nothing(
    sim: tuple[Simulator, SimulatorServer], harness: Harness
) -> None:
    sim[0].add_event(EventSpec("Freeze", (VM,)))
    agent = harness.start()
    harness.poll()
    seq = agent.spool.last_seq()
    harness.poll(5)
    assert agent.spool.last_seq() == seq


def test_heartbeats_at_start_and_stop(harness: Harness) -> None:
    harness.start()
    harness.poll()
    harness.stop()
    beats = harness.records("Heartbeat")
    assert [b["HeartbeatReason"] for b in beats] == ["Start", "Stop"]
    assert beats[-1]["ImdsHealthy"] is True
    assert beats[-1]["LastImdsSuccess"] is not None


def test_heartbeats_say_whether_the_agent_has_a_prepare_hook(harness: Harness) -> None:
    # approve_when_ready waits for this VM's prepare hook only if it has one (issue 27).
    harness.start()
    harness.stop()
    harness.start(boot="b2", hooks=HooksSettings(prepare="exit 0"))
    harness.stop()
    beats = harness.records("Heartbeat")
    assert [b["HasPrepareHook"] for b in beats] == [False, False, True, True]


def test_restart_gives_canceled_for_an_event_gone_while_down(
    sim: tuple[Simulator, SimulatorServer], harness: Harness
) -> None:
    simulator, _ = sim
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    harness.start()
    harness.poll()
    harness.stop()
    simulator.cancel_event(event)
    harness.start()
    harness.poll()
    assert transitions(harness.records()) == [
        (event, "Scheduled", False),
        (event, "Canceled", False),
    ]


def test_reboot_across_restart_is_completed_inferred(
    sim: tuple[Simulator, SimulatorServer], harness: Harness
) -> None:
    simulator, _ = sim
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    harness.start(boot="boot-1")
    harness.poll()
    harness.stop()
    simulator.cancel_event(event)  # from the VM's view: gone while it was rebooting
    harness.start(boot="boot-2")
    harness.poll()
    assert transitions(harness.records()) == [
        (event, "Scheduled", False),
        (event, "Completed", True),
    ]


def test_bad_api_version_is_an_error_with_imds_body_and_the_agent_goes_on(
    sim: tuple[Simulator, SimulatorServer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    harness = Harness(sim[1], tmp_path, api_version="1999-01-01")
    try:
        with caplog.at_level(logging.WARNING, logger="bridge"):
            agent = harness.start()
            for _ in range(3):
                agent.cycle()
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1, "one ERROR per failure streak, not one per poll"
        assert "400" in errors[0].getMessage()
        assert "newest-versions" in errors[0].getMessage()
    finally:
        harness.stop()
    beats = harness.records("Heartbeat")
    assert beats[-1]["ImdsHealthy"] is False


def test_body_that_is_not_json_is_skipped_and_said_once(
    sim: tuple[Simulator, SimulatorServer], harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    simulator, _ = sim
    harness.start()
    simulator.set_faults({"rateNotJson": 1.0}, vm=VM)
    with caplog.at_level(logging.WARNING, logger="bridge.agent.loop"):
        harness.poll(3)
    simulator.clear_faults()
    event = simulator.add_event(EventSpec("Freeze", (VM,)))
    harness.poll()
    warnings = [r.getMessage() for r in caplog.records if "not JSON" in r.getMessage()]
    assert len(warnings) == 1
    assert transitions(harness.records()) == [(event, "Scheduled", False)]


def test_identity_unknown_then_known_updates_affects_this_vm(
    sim: tuple[Simulator, SimulatorServer], harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    simulator, _ = sim
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    simulator.set_faults({"rate500": 1.0}, vm=VM)
    with caplog.at_level(logging.WARNING, logger="bridge.agent.loop"):
        agent = harness.start()
    assert "instance metadata is unavailable" in caplog.text
    simulator.clear_faults()
    harness.poll()
    first = harness.records()
    assert (first[0]["VmId"], first[0]["AffectsThisVm"]) == (None, None)
    agent._refresh_identity()  # what the periodic refresh does
    harness.poll()
    second = harness.records()[-1]
    assert (second["Transition"], second["ChangedFields"]) == ("Updated", ["AffectsThisVm"])
    assert (second["VmName"], second["AffectsThisVm"]) == (VM, True)
    assert transitions(harness.records())[0] == (event, "Scheduled", False)


def test_hooks_run_and_leave_hook_records(
    sim: tuple[Simulator, SimulatorServer], harness: Harness, tmp_path: Path
) -> None:
    import sys

    simulator, _ = sim
    marker = tmp_path / "ran.txt"
    script = (
        "import os, sys, json; r = json.load(sys.stdin); "
        f"open({str(marker)!r}, 'a').write(os.environ['SE_BRIDGE_HOOK_PHASE'] + ' ' + "
        "r['Transition'] + '\\n')"
    )
    hooks = HooksSettings(
        prepare=[sys.executable, "-c", script], recover=[sys.executable, "-c", script]
    )
    harness.start(hooks=hooks)
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    harness.poll()
    simulator.cancel_event(event)
    harness.poll()
    eventually(lambda: marker.exists() and len(marker.read_text().splitlines()) == 2)
    harness.stop()
    assert marker.read_text().splitlines() == ["prepare Scheduled", "recover Canceled"]
    hook_records = harness.records("Hook")
    assert [(h["HookPhase"], h["HookExitCode"]) for h in hook_records] == [
        ("prepare", 0),
        ("recover", 0),
    ]


def test_hook_queued_at_stop_runs_at_next_start(
    sim: tuple[Simulator, SimulatorServer], harness: Harness, tmp_path: Path
) -> None:
    import sys

    simulator, _ = sim
    marker = tmp_path / "ran.txt"
    script = (
        "import os, time; time.sleep(0.5); "
        f"open({str(marker)!r}, 'a').write(os.environ['SE_BRIDGE_EVENT_ID'] + '\\n')"
    )
    hooks = HooksSettings(prepare=[sys.executable, "-c", script], max_concurrent=1)
    harness.start(hooks=hooks)
    first = simulator.add_event(EventSpec("Reboot", (VM,)))
    second = simulator.add_event(EventSpec("Redeploy", (VM,)))
    harness.poll()
    harness.stop()  # at most the running hook finishes; a queued one stays due in the spool
    ran_before = marker.read_text().splitlines() if marker.exists() else []
    assert len(ran_before) <= 1
    harness.start(hooks=hooks)
    eventually(lambda: marker.exists() and len(marker.read_text().splitlines()) == 2)
    harness.stop()
    assert sorted(marker.read_text().splitlines()) == sorted([first, second])
    assert len(harness.records("Hook")) == 2


def test_spool_write_failure_loses_nothing_and_the_agent_goes_on(
    sim: tuple[Simulator, SimulatorServer],
    harness: Harness,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import sqlite3

    simulator, _ = sim
    agent = harness.start()
    real_commit = agent.spool.commit

    def full_disk(*args: Any, **kwargs: Any) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(agent.spool, "commit", full_disk)
    event = simulator.add_event(EventSpec("Reboot", (VM,)))
    with caplog.at_level(logging.WARNING, logger="bridge.agent.loop"):
        harness.poll(3)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "cannot write 1 records to the spool" in errors[0].getMessage()
    monkeypatch.setattr(agent.spool, "commit", real_commit)
    harness.poll()
    assert transitions(harness.records()) == [(event, "Scheduled", False)]


def test_an_unexpected_error_in_a_cycle_does_not_end_the_agent(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    agent = harness.start()
    calls = []

    def broken() -> float:
        calls.append(1)
        raise KeyError("bug")

    monkeypatch.setattr(agent, "cycle", broken)
    with caplog.at_level(logging.ERROR, logger="bridge.agent.loop"):
        delay = agent._guarded_cycle()
    assert (calls, delay) == ([1], 0.2)
    assert "unexpected error in the poll loop" in caplog.text


def test_a_deeply_nested_document_is_one_clear_warning(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    agent = harness.start()
    harness.poll()
    deep = b"[" * 100_000 + b"]" * 100_000
    for _ in range(3):
        agent._observe(deep)  # no RecursionError escapes the observe step
    warned = [r for r in caplog.records if "not JSON" in r.getMessage()]
    assert len(warned) == 1
    assert warned[0].exc_info is None
    harness.poll()  # and the agent goes on


def test_a_document_with_200000_resources_makes_no_huge_log_line(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bridge")
    agent = harness.start()
    harness.poll()
    resources = [f"vm-{i}" for i in range(200_000)]
    event = {"EventId": "E-big", "EventType": "Freeze", "ResourceType": "VirtualMachine",
             "Resources": resources, "EventStatus": "Scheduled", "NotBefore": "",
             "Description": "", "EventSource": "Platform", "DurationInSeconds": 5}  # fmt: skip
    agent._observe(json.dumps({"DocumentIncarnation": 9, "Events": [event]}).encode())
    lines = [r.getMessage() for r in caplog.records]
    assert any("E-big" in line for line in lines)
    assert max(len(line) for line in lines) < 2000
    assert any("200000 in all" in line for line in lines)
