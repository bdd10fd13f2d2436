"""`se-bridge policy replay` of a history recorded by real processes (issue 40, item 4): the
simulator, an agent per VM and a consumer with a budget of one VM per scale set record a
morning of reboots into their jsonl sinks; replayed with the same policy nothing differs
(exit 0), and with a budget of two exactly the reboot that waited for a slot does (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_approvals import Loop, Transport
from tests.support.processes import Processes, Record, read_records, run_bridge, scrape
from tests.support.wait import eventually

pytestmark = pytest.mark.e2e

POLICY = """
version: 1
budgets:
  - {name: one-per-set, group: scale_set, max_vms: %d}
rules:
  - {name: user-initiated, match: {event_source: User}, action: approve}
  - {name: everything-else, action: hold}
"""
FLEET = {"scaleSets": [{"name": "web", "count": 4}]}


def record(procs: Processes) -> tuple[Loop, dict[str, str], Path]:
    """The history: web_0 rebooted by its user, then web_1 while web_0 holds the slot (it
    waits for it), a platform reboot of web_2 held. Each event is shown to the VM it names
    only, so which VM reported first decides nothing."""
    root = procs.workdir
    (root / "policy.yaml").write_text(POLICY % 1, encoding="utf-8")
    config = root / "consumer.toml"
    config.write_text(
        f'[consumer]\npolicy = "{root / "policy.yaml"}"\nreevaluate_interval = 0.5\n',
        encoding="utf-8",
    )
    loop = Loop(procs, Transport(root), ["--config", str(config), "--metrics-address", "0"],
                fleet_spec=FLEET).start()  # fmt: skip
    consumer = loop.consumer
    assert consumer is not None
    eventually(
        lambda: scrape(consumer.output)["se_bridge_consumer_records_total"] >= 4,
        what="every VM's first heartbeat folded",
        details=loop.describe,
    )
    events = {}
    for name, vm, source in (("first", "web_0", "User"), ("second", "web_1", "User"),
                             ("platform", "web_2", "Platform")):  # fmt: skip
        events[name] = loop.sim.add_event(EventType="Reboot", EventSource=source,
                                          Resources=[vm], audience=[vm], notice=900.0)  # fmt: skip
        if name == "first":
            # web_0's record before web_1's, in time and as read: two VMs reporting at once
            # may be read in another order than their times say, which a replay cannot know.
            decided(loop, events["first"], "Approve")
    said = decided(loop, events["second"], "Defer")
    assert "1 more would exceed 1" in str(said["DecisionReason"])
    decided(loop, events["platform"], "Hold")
    assert loop.wait_approved(events["first"])["vm"] == "web_0"
    loop.agents["web_0"].wait_transition(events["first"], "Started")
    loop.sim.act(events["first"], "complete")
    assert loop.wait_approved(events["second"])["vm"] == "web_1"
    loop.agents["web_1"].wait_transition(events["second"], "Started")
    loop.sim.act(events["second"], "complete")
    loop.agents["web_1"].wait_transition(events["second"], "Completed")
    for agent in loop.agents.values():
        assert agent.stop() == 0
    assert consumer.stop() == 0
    return loop, events, config


def decided(loop: Loop, event_id: str, action: str) -> Record:
    def found() -> Record | None:
        mine = [d for d in read_records(loop.decisions) if d["EventId"] == event_id]
        return next((d for d in mine if d["DecisionAction"] == action), None)

    return eventually(found, what=f"a {action} of {event_id}", details=loop.describe)


def replay(loop: Loop, config: Path, budget: int) -> tuple[int, dict[str, Any]]:
    policy = loop.procs.workdir / f"policy-{budget}.yaml"
    policy.write_text(POLICY % budget, encoding="utf-8")
    files = [a.sink for a in loop.agents.values()] + [loop.decisions]
    done = run_bridge("policy", "replay", "--config", str(config), "--policy", str(policy),
                      *(w for f in files for w in ("--records", str(f))), "--json")  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    said: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, said


def test_a_recorded_history_replays_to_the_same_decisions_and_a_larger_budget_to_one_more(
    procs: Processes,
) -> None:
    loop, events, config = record(procs)
    recorded = [d for d in read_records(loop.decisions) if d["EventId"] in events.values()]
    assert sorted(d["DecisionAction"] for d in recorded) == ["Approve", "Approve", "Defer", "Hold"]

    code, same = replay(loop, config, 1)
    assert (code, same["Differing"], same["Marked"]) == (0, 0, 0), json.dumps(same, indent=2)
    assert same["Same"] == 3
    assert same["RecordedDecisions"] == 4

    code, larger = replay(loop, config, 2)
    assert code == 1, json.dumps(larger, indent=2)
    assert (larger["Differing"], larger["Marked"], larger["Same"]) == (1, 0, 2)
    [second] = larger["EventsReplayed"]
    assert second["EventId"] == events["second"]
    assert [d["DecisionAction"] for d in second["Recorded"]] == ["Defer", "Approve"]
    assert [d["DecisionAction"] for d in second["Replayed"]] == ["Approve"]
    assert second["Replayed"][0]["TargetVmName"] == "web_1"
    assert second["Replayed"][0]["Budgets"][0].endswith("1 more fit the limit of 2")
    assert second["Recorded"][0]["Budgets"][0].endswith("1 more would exceed 1")
