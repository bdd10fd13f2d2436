"""prepare and recover hooks run by a real agent, configured in a TOML file or the environment."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.processes import PYTHON, Agent, Processes, Record, Simulator, assert_all_valid

pytestmark = pytest.mark.e2e

FLEET = {"availabilitySets": [{"name": "app", "count": 2}]}
VM, NEIGHBOUR = "app-0", "app-1"
DESCRIPTION = "Host server is undergoing maintenance."
# One line, so it survives a shell command line as well as an argv list.
HOOK = (
    "import json, os, sys; "
    "env = {k: v for k, v in os.environ.items() if k.startswith('SE_BRIDGE_')}; "
    "entry = {'phase': sys.argv[2], 'env': env, 'stdin': sys.stdin.read()}; "
    "f = open(sys.argv[1], 'a', encoding='utf-8'); f.write(json.dumps(entry) + chr(10)); "
    "f.close(); print('hook', sys.argv[2], 'done')"
)
DOCUMENTED_ENV = (
    "SE_BRIDGE_HOOK_PHASE", "SE_BRIDGE_EVENT_ID", "SE_BRIDGE_EVENT_TYPE", "SE_BRIDGE_EVENT_STATUS",
    "SE_BRIDGE_TRANSITION", "SE_BRIDGE_NOT_BEFORE", "SE_BRIDGE_RESOURCES",
    "SE_BRIDGE_EVENT_SOURCE", "SE_BRIDGE_DURATION_SECONDS", "SE_BRIDGE_DESCRIPTION",
    "SE_BRIDGE_AFFECTS_THIS_VM", "SE_BRIDGE_RECORD_ID", "SE_BRIDGE_VM_NAME", "SE_BRIDGE_VM_ID",
)  # fmt: skip


def hook_argv(log: Path, phase: str) -> list[str]:
    return [PYTHON, "-c", HOOK, str(log), phase]


def hooked_agent(procs: Processes, sim: Simulator, how: str, log: Path) -> Agent:
    if how == "config-file":
        # An argv list runs without a shell; TOML basic strings take JSON's escapes.
        config = procs.workdir / "agent.toml"
        config.write_text(
            "[hooks]\n"
            f"prepare = {json.dumps(hook_argv(log, 'prepare'))}\n"
            f"recover = {json.dumps(hook_argv(log, 'recover'))}\n"
            "timeout = 30\n",
            encoding="utf-8",
        )
        return Agent(procs, VM, sim.vm_url(VM), args=["--config", str(config)])
    env = {
        "SE_BRIDGE_HOOKS_PREPARE": shlex.join(hook_argv(log, "prepare")),
        "SE_BRIDGE_HOOKS_RECOVER": shlex.join(hook_argv(log, "recover")),
    }
    return Agent(procs, VM, sim.vm_url(VM), env=env)


def hooks_done(phases: int) -> Callable[[list[Record]], bool]:
    def done(records: list[Record]) -> bool:
        return len([r for r in records if r["RecordType"] == "Hook"]) >= phases

    return done


@pytest.mark.parametrize(
    "how",
    [
        "config-file",
        pytest.param(
            "environment",
            marks=pytest.mark.skipif(sys.platform == "win32", reason="POSIX shell quoting"),
        ),
    ],
)
def test_prepare_and_recover_hooks(procs: Processes, how: str) -> None:
    fleet = procs.workdir / "fleet.json"
    fleet.write_text(json.dumps(FLEET), encoding="utf-8")
    sim = Simulator.launch(procs, "sim", "--fleet", str(fleet))
    log = procs.workdir / "hooks.log"
    agent = hooked_agent(procs, sim, how, log).start()
    sim.wait_polls({VM: 2})

    mine = sim.add_event(EventType="Reboot", Resources=[VM], Description=DESCRIPTION, notice=3600.0)
    # Shown to the whole set, but not this VM's: no hook may run for it.
    other = sim.add_event(EventType="Freeze", Resources=[NEIGHBOUR], notice=3600.0)
    for event_id in (mine, other):
        agent.wait_transition(event_id, "Scheduled")
    agent.wait_for(hooks_done(1), "the prepare hook")
    for action, transition in (("start", "Started"), ("complete", "Completed")):
        for event_id in (mine, other):
            sim.act(event_id, action)
        for event_id in (mine, other):
            agent.wait_transition(event_id, transition)
    agent.wait_for(hooks_done(2), "the recover hook")
    assert agent.stop() == 0

    records = agent.records()
    assert_all_valid(records)
    assert " WARNING " not in agent.stderr(), agent.stderr()
    events = {(r["EventId"], r["Transition"]): r for r in records if r["RecordType"] == "Event"}
    scheduled, completed = events[(mine, "Scheduled")], events[(mine, "Completed")]
    assert events[(other, "Scheduled")]["AffectsThisVm"] is False
    vm_id = sim.fleet()[VM]["vmId"]

    runs = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert [run["phase"] for run in runs] == ["prepare", "recover"], runs
    prepare, recover = runs
    assert {k: prepare["env"].get(k) for k in DOCUMENTED_ENV} == {
        "SE_BRIDGE_HOOK_PHASE": "prepare",
        "SE_BRIDGE_EVENT_ID": mine,
        "SE_BRIDGE_EVENT_TYPE": "Reboot",
        "SE_BRIDGE_EVENT_STATUS": "Scheduled",
        "SE_BRIDGE_TRANSITION": "Scheduled",
        "SE_BRIDGE_NOT_BEFORE": scheduled["NotBefore"],
        "SE_BRIDGE_RESOURCES": VM,
        "SE_BRIDGE_EVENT_SOURCE": "Platform",
        "SE_BRIDGE_DURATION_SECONDS": "-1",
        "SE_BRIDGE_DESCRIPTION": DESCRIPTION,
        "SE_BRIDGE_AFFECTS_THIS_VM": "true",
        "SE_BRIDGE_RECORD_ID": scheduled["RecordId"],
        "SE_BRIDGE_VM_NAME": VM,
        "SE_BRIDGE_VM_ID": vm_id,
    }
    assert json.loads(prepare["stdin"]) == scheduled
    assert recover["env"]["SE_BRIDGE_HOOK_PHASE"] == "recover"
    assert recover["env"]["SE_BRIDGE_TRANSITION"] == "Completed"
    assert recover["env"]["SE_BRIDGE_EVENT_STATUS"] == ""
    assert recover["env"]["SE_BRIDGE_RECORD_ID"] == completed["RecordId"]
    assert json.loads(recover["stdin"]) == completed

    hooks = [r for r in records if r["RecordType"] == "Hook"]
    summary = [(r["HookPhase"], r["EventId"], r["Transition"], r["TriggerRecordId"]) for r in hooks]
    assert summary == [
        ("prepare", mine, "Scheduled", scheduled["RecordId"]),
        ("recover", mine, "Completed", completed["RecordId"]),
    ]
    for hook in hooks:
        assert (hook["HookExitCode"], hook["HookTimedOut"], hook["HookError"]) == (0, False, None)
        assert f"hook {hook['HookPhase']} done" in hook["HookOutput"]
        assert hook["VmName"] == VM
    # Each Hook record follows the Event record that triggered it.
    order = [r["RecordId"] for r in records]
    for hook in hooks:
        assert order.index(hook["TriggerRecordId"]) < order.index(hook["RecordId"])
