"""Spot rebalance recommendations (issue 40, item 3): the agent in-process against the IMDS
simulator, one Spot VM (spot-0) and one regular VM (vm-0)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge.agent.loop import Agent
from bridge.agent.wiring import build_agent
from bridge.config import AgentSettings, Config, HooksSettings, ImdsSettings
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import EventSpec, Fleet
from bridge.simulator.vms import vms_from_spec
from tests.support.agentharness import AgentHarness
from tests.support.wait import eventually

SPOT, REGULAR = "spot-0", "vm-0"
PREVIEW, GA = "2024-07-09", "2020-07-01"
REBALANCE = "SpotRebalanceRecommendation"


class Harness(AgentHarness):
    def __init__(self, server: SimulatorServer, root: Path, vm: str) -> None:
        super().__init__(server, root)
        self.vm = vm

    def imds_settings(self, **imds: Any) -> ImdsSettings:
        return ImdsSettings(url=self.server.vm_url(self.vm), first_call_timeout=5, timeout=2)

    def start(self, *, rebalance: bool = True, hooks: HooksSettings | None = None) -> Agent:
        settings = self.agent_settings()
        agent = AgentSettings(
            poll_interval=settings.poll_interval,
            state_dir=settings.state_dir,
            sinks=settings.sinks,
            spot_rebalance=rebalance,
        )
        config = Config(agent=agent, imds=self.imds_settings(), hooks=hooks or HooksSettings())
        self.agent = build_agent(config, boot_id="b1")
        self.agent.start()
        return self.agent


@pytest.fixture
def sim() -> Iterator[tuple[Simulator, SimulatorServer]]:
    vms = vms_from_spec({"vms": [{"name": SPOT, "priority": "Spot"}, {"name": REGULAR}]})
    simulator = Simulator(Fleet(vms, time_scale=1.0))
    with SimulatorServer(simulator) as server:
        yield simulator, server


@pytest.fixture
def spot(sim: tuple[Simulator, SimulatorServer], tmp_path: Path) -> Iterator[Harness]:
    made = Harness(sim[1], tmp_path / "spot", SPOT)
    yield made
    made.stop()


@pytest.fixture
def regular(sim: tuple[Simulator, SimulatorServer], tmp_path: Path) -> Iterator[Harness]:
    made = Harness(sim[1], tmp_path / "regular", REGULAR)
    yield made
    made.stop()


def gets(simulator: Simulator, vm: str) -> dict[str, int]:
    """The Scheduled Events GETs `vm` made, by api-version."""
    counters = simulator.counters()[vm]
    return {v: counters.get(f"GET scheduledevents {v}", 0) for v in (PREVIEW, GA)}


def hook_command(tmp_path: Path) -> list[str]:
    """A prepare hook that appends the record it was given on stdin to a file."""
    script = tmp_path / "hook.py"
    out = tmp_path / "hooked.jsonl"
    script.write_text(
        "import sys\n"
        f"with open({str(out)!r}, 'a', encoding='utf-8') as f:\n"
        "    f.write(sys.stdin.read())\n"
    )
    return [sys.executable, str(script)]


def hooked_records(tmp_path: Path, count: int) -> list[dict[str, Any]] | None:
    """What the hooks were given on stdin, once `count` of them ran."""
    out = tmp_path / "hooked.jsonl"
    lines = out.read_text().splitlines() if out.exists() else []
    return [json.loads(line) for line in lines] if len(lines) >= count else None


def test_a_recommendation_is_an_advisory_never_an_event_and_never_approved(
    sim: tuple[Simulator, SimulatorServer], spot: Harness, tmp_path: Path
) -> None:
    simulator, _ = sim
    hooks = HooksSettings(prepare=hook_command(tmp_path), on_rebalance=True)
    spot.start(hooks=hooks)
    advice = simulator.add_event(EventSpec(REBALANCE, (SPOT,)))
    spot.poll()
    # The Preempt that follows comes on the same poll, as an Event record: its fast path.
    preempt = simulator.add_event(EventSpec("Preempt", (SPOT,), notice=30))
    spot.poll()
    simulator.cancel_event(advice)
    spot.poll()

    advisories = spot.records("Advisory")
    assert [(r["EventId"], r["AdvisoryState"]) for r in advisories] == [
        (advice, "Raised"),
        (advice, "Cleared"),
    ]
    assert advisories[0]["AffectsThisVm"] is True
    assert advisories[0]["EventType"] == REBALANCE
    events = spot.records("Event")
    assert [(r["EventId"], r["EventType"], r["Transition"]) for r in events] == [
        (preempt, "Preempt", "Scheduled")
    ]
    # Its prepare hook ran with the Advisory record on stdin (as the Preempt's did with its
    # Event record), and wrote a Hook record.
    hooked = eventually(lambda: hooked_records(tmp_path, 2), what="both prepare hooks")
    assert sorted((h["RecordType"], h["EventId"]) for h in hooked) == sorted(
        [("Advisory", advice), ("Event", preempt)]
    )
    hook = eventually(lambda: [h for h in spot.records("Hook") if h["EventId"] == advice])
    assert [(h["EventType"], h["HookPhase"], h["HookExitCode"]) for h in hook] == [
        (REBALANCE, "prepare", 0)
    ]
    # Nothing named it in a StartRequests; every poll asked the preview version, once.
    assert [a.event_id for a in simulator.approvals() if a.event_id == advice] == []
    assert gets(simulator, SPOT)[GA] == 0
    assert gets(simulator, SPOT)[PREVIEW] >= 3


def test_a_recommendation_for_another_vm_runs_no_hook(
    sim: tuple[Simulator, SimulatorServer], spot: Harness, tmp_path: Path
) -> None:
    simulator, _ = sim
    hooks = HooksSettings(prepare=hook_command(tmp_path), on_rebalance=True, max_concurrent=1)
    spot.start(hooks=hooks)
    simulator.add_event(EventSpec(REBALANCE, (REGULAR,), audience=(SPOT,)))
    spot.poll()
    [advisory] = spot.records("Advisory")
    assert advisory["AffectsThisVm"] is False
    assert_only_the_later_event_hooked(simulator, spot, tmp_path)


def assert_only_the_later_event_hooked(simulator: Simulator, spot: Harness, tmp_path: Path) -> None:
    """An event after the recommendation runs its hook: one hook at a time, in turn, so a
    hook the recommendation called for would have run first."""
    reboot = simulator.add_event(EventSpec("Reboot", (SPOT,)))
    spot.poll()
    hooked = eventually(lambda: hooked_records(tmp_path, 1), what="the Reboot's prepare hook")
    assert [(h["RecordType"], h["EventId"]) for h in hooked] == [("Event", reboot)]


def test_no_hook_without_on_rebalance(
    sim: tuple[Simulator, SimulatorServer], spot: Harness, tmp_path: Path
) -> None:
    simulator, _ = sim
    spot.start(hooks=HooksSettings(prepare=hook_command(tmp_path), max_concurrent=1))
    simulator.add_event(EventSpec(REBALANCE, (SPOT,)))
    spot.poll()
    assert len(spot.records("Advisory")) == 1
    assert_only_the_later_event_hooked(simulator, spot, tmp_path)


def test_a_regular_vm_never_polls_the_preview_version(
    sim: tuple[Simulator, SimulatorServer], regular: Harness
) -> None:
    simulator, _ = sim
    regular.start()
    regular.poll(5)
    assert gets(simulator, REGULAR) == {PREVIEW: 0, GA: 5}


def test_off_by_default_a_spot_vm_polls_as_before(
    sim: tuple[Simulator, SimulatorServer], spot: Harness
) -> None:
    simulator, _ = sim
    spot.start(rebalance=False)
    advice = simulator.add_event(EventSpec(REBALANCE, (SPOT,)))
    spot.poll(3)
    assert gets(simulator, SPOT) == {PREVIEW: 0, GA: 3}
    assert spot.records("Advisory") == []
    assert advice not in {r["EventId"] for r in spot.records("Event")}


def test_where_the_preview_is_not_served_the_agent_goes_back_to_ga(
    sim: tuple[Simulator, SimulatorServer], spot: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    simulator, _ = sim
    simulator.unserved_versions.add(PREVIEW)
    reboot = simulator.add_event(EventSpec("Reboot", (SPOT,)))
    spot.start()
    with caplog.at_level(logging.WARNING, logger="bridge.agent.loop"):
        spot.poll(4)
    # One refused request, then the GA version at once and for every poll after it.
    assert gets(simulator, SPOT) == {PREVIEW: 1, GA: 4}
    assert [r["EventId"] for r in spot.records("Event")] == [reboot]
    said = [r.getMessage() for r in caplog.records if PREVIEW in r.getMessage()]
    assert len(said) == 1
    assert "SpotPlus" in said[0]
