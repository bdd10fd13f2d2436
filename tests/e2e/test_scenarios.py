"""Every simulator scenario end to end: `se-bridge simulate` plus one `se-bridge agent` per VM.

All scenarios play at once, each on VMs of its own (so every document holds one scenario's
events only), in one module-wide run; each test then checks one scenario's records exactly.
Every event state lasts STATE real seconds, ten agent polls, so no state can slip between
two polls even on a loaded machine.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import socket
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest

from bridge import __version__
from bridge.simulator import scenarios
from tests.support.processes import (
    Agent,
    Processes,
    Record,
    Simulator,
    assert_all_valid,
)

pytestmark = pytest.mark.e2e

STATE = 2.5  # real seconds each event state lasts
SCALE = 150.0  # lets vmss-terminate keep a legal notice (300..900 s) of STATE real seconds
SIM_STATE = STATE * SCALE
# The spot simulator runs slower so the Preempt scenario's own 30 s notice lasts STATE.
SPOT_SCALE = 30.0 / STATE
LIFECYCLE = ("Scheduled", "Started", "Completed")

MAIN_FLEET = {
    "resourceGroupName": "rg-e2e",
    "location": "norwayeast",
    "vms": [
        {"name": name}
        for name in ("user-0", "platform-0", "redeploy-0", "cancel-0", "hw-0", "reset-0")
    ],
    "availabilitySets": [{"name": "db", "count": 3}],
    "scaleSets": [
        {"name": "lm", "count": 3, "zones": ["1", "2", "3"]},
        {"name": "web", "count": 2},
        {"name": "old", "count": 1},
    ],
}
# Spot instance last, so the scenario's own choice of VM is what is tested.
SPOT_FLEET = {"scaleSets": [{"name": "spot", "count": 2, "spot": [1]}]}
LEGACY_API_VERSION = "2017-03-01"  # Resources carry a leading underscore; fewer fields
TIMES = {"notice": SIM_STATE, "runTime": SIM_STATE}


@dataclass(frozen=True)
class Case:
    site: str  # which simulator: "main" or "spot"
    scenario: str
    audience: tuple[str, ...]  # VMs whose documents show the event, each with an agent
    resources: tuple[str, ...]  # the event's Resources
    request: Mapping[str, Any]  # the POST /control/scenarios body beyond the name
    event_type: str
    source: str
    description: str
    duration: int = -1
    transitions: tuple[str, ...] = LIFECYCLE


CASES: dict[str, Case] = {
    "live-migration": Case(
        "main", "live-migration", ("lm_0", "lm_1", "lm_2"), ("lm_0", "lm_1"),
        {"vms": ["lm_0", "lm_1"], **TIMES}, "Freeze", "Platform", scenarios.LIVE_MIGRATION, 5,
    ),
    "user-reboot": Case(
        "main", "user-reboot", ("user-0",), ("user-0",), {"vms": ["user-0"], **TIMES},
        "Reboot", "User", scenarios.USER_REBOOT,
    ),
    "platform-reboot": Case(
        "main", "platform-reboot", ("platform-0",), ("platform-0",),
        {"vms": ["platform-0"], **TIMES}, "Reboot", "Platform", scenarios.HOST_MAINTENANCE,
    ),
    "redeploy": Case(
        "main", "redeploy", ("redeploy-0",), ("redeploy-0",), {"vms": ["redeploy-0"], **TIMES},
        "Redeploy", "User", scenarios.USER_REDEPLOY,
    ),
    # The scenario's own VM choice (the Spot instance) and its own 30 s notice.
    "spot-preempt": Case(
        "spot", "spot-preempt", ("spot_0", "spot_1"), ("spot_1",), {"runTime": 30.0},
        "Preempt", "Platform", scenarios.SPOT_EVICTION,
    ),
    "vmss-terminate": Case(
        "main", "vmss-terminate", ("web_0", "web_1"), ("web_0",), {"vms": ["web_0"], **TIMES},
        "Terminate", "User", scenarios.SCALE_IN,
    ),
    "canceled": Case(
        "main", "canceled", ("cancel-0",), ("cancel-0",),
        {"vms": ["cancel-0"], "notice": 2 * SIM_STATE, "cancelAfter": SIM_STATE},
        "Reboot", "Platform", scenarios.HOST_MAINTENANCE,
        transitions=("Scheduled", "Canceled"),
    ),
    "hardware-failure": Case(
        "main", "hardware-failure", ("hw-0",), ("hw-0",), {"vms": ["hw-0"], "runTime": SIM_STATE},
        "Reboot", "Platform", scenarios.HARDWARE_FAILURE, transitions=("Started", "Completed"),
    ),
    # The scenario's own VM choice: the first member of the set.
    "availability-set": Case(
        "main", "availability-set", ("db-0", "db-1", "db-2"), ("db-0",), TIMES,
        "Reboot", "Platform", scenarios.HOST_MAINTENANCE,
    ),
}  # fmt: skip
# The same scale-in seen through a 2017 api-version, by an agent configured for it.
LEGACY = Case(
    "main", "vmss-terminate", ("old_0",), ("old_0",), {"vms": ["old_0"], **TIMES},
    "Terminate", "User", scenarios.SCALE_IN,
)  # fmt: skip
RESET_VM = "reset-0"
TWIN_OF = "platform-0"
ALL_CASES = {**CASES, "vmss-terminate-2017": LEGACY}
SITE_OF = {vm: case.site for case in ALL_CASES.values() for vm in case.audience}
SITE_OF[RESET_VM] = "main"
ENDS = frozenset({"Completed", "Canceled"})


@dataclass
class Run:
    """Everything the scenario run produced, collected after every process stopped."""

    event_ids: dict[str, str] = field(default_factory=dict)  # case -> EventId
    baseline: dict[str, int] = field(default_factory=dict)  # VM -> incarnation before events
    fleet: dict[str, dict[str, Any]] = field(default_factory=dict)  # VM -> /control/fleet entry
    compute: dict[str, dict[str, Any]] = field(default_factory=dict)  # VM -> instance metadata
    sim_events: dict[str, dict[str, Any]] = field(default_factory=dict)  # EventId -> summary
    records: dict[str, list[Record]] = field(default_factory=dict)  # VM -> its jsonl
    stderr: dict[str, str] = field(default_factory=dict)  # agent or simulator -> its log
    exit_codes: dict[str, int] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # case -> why driving it failed
    reset_at: int | None = None  # the incarnation the reset restarted at
    twin_records: list[Record] = field(default_factory=list)  # a second agent on TWIN_OF

    def show(self, vm: str) -> str:
        return "\n".join(json.dumps(r) for r in self.records.get(vm, [])) + "\n" + self.stderr[vm]


def _write(path: Path, spec: Mapping[str, Any]) -> Path:
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    workdir = tmp_path_factory.mktemp("scenarios")
    procs = Processes(workdir)
    try:
        yield _play(procs)
    finally:
        procs.close()


def _play(procs: Processes) -> Run:
    result = Run()
    sims = _simulators(procs)
    agents = {
        vm: Agent(procs, vm, sims[site].vm_url(vm), env=_agent_env(vm))
        for vm, site in SITE_OF.items()
    }
    # A second, independent agent on one VM: same observations must give the same RecordIds.
    twin = Agent(procs, f"{TWIN_OF}-twin", sims["main"].vm_url(TWIN_OF))
    for agent in [*agents.values(), twin]:
        agent.start()
    for agent in [*agents.values(), twin]:
        agent.wait_polling()
    for site, sim in sims.items():
        _take_baseline(site, sim, result)

    for key, case in ALL_CASES.items():
        [result.event_ids[key]] = sims[case.site].scenario(case.scenario, **case.request)
    try:
        _drive_reset(sims["main"], agents[RESET_VM], result)
    except AssertionError as err:
        result.problems["reset-24h"] = str(err)
    _wait_for_the_ends(agents, result)
    # The twin polls on its own clock: it may see an end a poll after the primary did, and is
    # stopped only once it has (test_two_agents_on_one_vm_give_its_records_the_same_ids says
    # what it missed, if anything).
    for key, case in ALL_CASES.items():
        if TWIN_OF in case.audience:
            with contextlib.suppress(AssertionError):
                twin.wait_for(_ended(result.event_ids[key]), f"the twin's end of {key}")
    for sim in sims.values():
        result.sim_events.update(sim.events())

    for agent in [*agents.values(), twin]:
        agent.proc.interrupt()
    for vm, agent in agents.items():
        result.exit_codes[vm] = agent.proc.wait()
        result.records[vm] = agent.records()
        result.stderr[vm] = agent.stderr()
    result.exit_codes[twin.name] = twin.proc.wait()
    result.twin_records = twin.records()
    result.stderr[twin.name] = twin.stderr()
    for site, sim in sims.items():
        result.exit_codes[f"sim-{site}"] = sim.proc.stop()
        result.stderr[f"sim-{site}"] = sim.proc.stderr()
    return result


def _simulators(procs: Processes) -> dict[str, Simulator]:
    main_fleet = _write(procs.workdir / "main-fleet.json", MAIN_FLEET)
    spot_fleet = _write(procs.workdir / "spot-fleet.json", SPOT_FLEET)
    main_proc = procs.bridge("sim-main", "simulate", "--port", "0", "--fleet", str(main_fleet),
                             "--time-scale", str(SCALE))  # fmt: skip
    # Another seed, or both simulators would hand out the same EventIds.
    spot_proc = procs.bridge("sim-spot", "simulate", "--port", "0", "--fleet", str(spot_fleet),
                             "--time-scale", str(SPOT_SCALE), "--seed", "1")  # fmt: skip
    return {"main": Simulator.attach(main_proc), "spot": Simulator.attach(spot_proc)}


def _agent_env(vm: str) -> dict[str, str]:
    return {"SE_BRIDGE_IMDS_API_VERSION": LEGACY_API_VERSION} if vm in LEGACY.audience else {}


def _take_baseline(site: str, sim: Simulator, result: Run) -> None:
    """Once each agent has read its VM's document, what that document and the VM are."""
    vms = [vm for vm, s in SITE_OF.items() if s == site]
    sim.wait_polls(dict.fromkeys(vms, 2))
    fleet = sim.fleet()
    for vm in vms:
        result.fleet[vm] = fleet[vm]
        result.baseline[vm] = fleet[vm]["documentIncarnation"]
        result.compute[vm] = sim.compute(vm)


def _wait_for_the_ends(agents: Mapping[str, Agent], result: Run) -> None:
    """Until every agent recorded the end of its event; a case that never ends fails alone."""
    for key, case in ALL_CASES.items():
        for vm in case.audience:
            try:
                agents[vm].wait_for(_ended(result.event_ids[key]), f"the end of {key}")
            except AssertionError as err:
                result.problems[key] = str(err)


def _ended(event_id: str) -> Callable[[list[Record]], bool]:
    return lambda records: any(
        r.get("EventId") == event_id and r.get("Transition") in ENDS for r in records
    )


def _drive_reset(sim: Simulator, agent: Agent, result: Run) -> None:
    """An event is Scheduled, the VM's incarnation starts over, then the event runs."""
    event_id = sim.add_event(
        EventType="Reboot",
        Resources=[RESET_VM],
        Description=scenarios.HOST_MAINTENANCE,
        notice=86400.0,  # it starts when the test says, not on its own
        runTime=SIM_STATE,
    )
    result.event_ids["reset-24h"] = event_id
    agent.wait_transition(event_id, "Scheduled")
    assert sim.scenario("reset-24h", vms=[RESET_VM]) == []
    result.reset_at = sim.incarnation(RESET_VM)
    # Of the polls counted from now, the first may have read the document from before the
    # reset, the second surely read the reset one, and the third means it was processed.
    polls = sim.polls(RESET_VM)
    sim.wait_polls({RESET_VM: polls + 3}, "the agent to read the reset document")
    sim.act(event_id, "start")


# -- checks ----------------------------------------------------------------------------------

STATUS_AFTER = {"Scheduled": "Scheduled", "Started": "Started", "Completed": None, "Canceled": None}


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _iso_seconds(ts: float) -> str:
    return datetime.fromtimestamp(math.floor(ts), timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def check_common(run: Run, vm: str, record: Record) -> None:
    """The fields every record carries, against what the simulator says about the VM."""
    fleet, compute = run.fleet[vm], run.compute[vm]
    scale_set = fleet["group"][len("vmss:") :] if fleet["group"].startswith("vmss:") else None
    expected = {
        "SchemaVersion": 1,
        "VmId": fleet["vmId"],
        "VmName": vm,
        "ResourceId": fleet["resourceId"],
        "SubscriptionId": compute["subscriptionId"],
        "ResourceGroup": compute["resourceGroupName"],
        "Location": compute["location"],
        "Zone": fleet["zone"] or None,
        "VmScaleSetName": scale_set,
        "PlatformFaultDomain": int(compute["platformFaultDomain"]),
        "PlatformUpdateDomain": int(compute["platformUpdateDomain"]),
        "HostName": socket.gethostname(),
        "AgentVersion": __version__,
    }
    assert (compute["vmScaleSetName"] or None) == scale_set
    assert f"/resourceGroups/{record['ResourceGroup']}/" in fleet["resourceId"]
    assert {k: record[k] for k in expected} == expected, json.dumps(record)


def check_case(run: Run, key: str, case: Case) -> None:
    assert key not in run.problems, run.problems[key]
    event_id = run.event_ids[key]
    summary = run.sim_events[event_id]
    assert summary["resources"] == list(case.resources)
    assert summary["audience"] == list(case.audience)
    assert summary["status"] == ("canceled" if "Canceled" in case.transitions else "completed")
    for vm in case.audience:
        events = [r for r in run.records[vm] if r["RecordType"] == "Event"]
        got = [(r["EventId"], r["Transition"]) for r in events]
        assert got == [(event_id, t) for t in case.transitions], run.show(vm)
        check_chain(run, vm, events)
        for index, record in enumerate(events):
            check_event(case, summary, vm, record, events[index - 1] if index else None)


def check_event(
    case: Case, summary: dict[str, Any], vm: str, record: Record, before: Record | None
) -> None:
    transition = record["Transition"]
    assert record["EventType"] == case.event_type
    assert record["ResourceType"] == "VirtualMachine"
    assert record["Resources"] == list(case.resources)
    assert record["EventSource"] == case.source
    assert record["Description"] == case.description
    assert record["DurationInSeconds"] == case.duration
    assert record["EventStatus"] == STATUS_AFTER[transition]
    assert record["PreviousStatus"] == (before["EventStatus"] if before else None)
    assert record["AffectsThisVm"] is (vm in case.resources), json.dumps(record)
    assert record["Inferred"] is False
    assert record["ChangedFields"] == []
    check_not_before(summary, record, before)


def check_not_before(summary: dict[str, Any], record: Record, before: Record | None) -> None:
    scheduled = record["EventStatus"] == "Scheduled" or (
        record["EventStatus"] is None
        and before is not None
        and before["EventStatus"] == "Scheduled"
    )
    if not scheduled:
        # IMDS empties NotBefore once an event has started.
        assert (record["NotBefore"], record["NotBeforeRaw"]) == (None, "")
        return
    expected = _iso_seconds(summary["notBefore"])
    assert record["NotBefore"] == expected
    assert record["NotBeforeRaw"] == formatdate(math.floor(summary["notBefore"]), usegmt=True)
    assert record["TimeGenerated"] != record["NotBefore"]
    if record["Transition"] == "Scheduled":
        # Seen at once: the whole notice (at most) still lay ahead.
        ahead = (_time(record["NotBefore"]) - _time(record["TimeGenerated"])).total_seconds()
        assert ahead <= summary["notBefore"] - summary["scheduledAt"] + 0.001  # ms rounding


def check_chain(run: Run, vm: str, events: list[Record]) -> None:
    """Each record comes from the next incarnation, starting from the one before any event."""
    assert events[0]["PreviousIncarnation"] == run.baseline[vm], run.show(vm)
    for before, after in itertools.pairwise(events):
        assert after["PreviousIncarnation"] == before["DocumentIncarnation"], run.show(vm)
    for record in events:
        assert record["DocumentIncarnation"] == record["PreviousIncarnation"] + 1, run.show(vm)
    stamps = [r["TimeGenerated"] for r in run.records[vm]]
    assert stamps == sorted(stamps)


# -- one test per scenario ---------------------------------------------------------------------


@pytest.mark.parametrize("key", ["user-reboot", "platform-reboot", "redeploy"])
def test_single_vm_maintenance(run: Run, key: str) -> None:
    check_case(run, key, CASES[key])


def test_live_migration_freezes_both_listed_vms_and_shows_the_set(run: Run) -> None:
    check_case(run, "live-migration", CASES["live-migration"])
    affects = {vm: run.records[vm][1]["AffectsThisVm"] for vm in ("lm_0", "lm_1", "lm_2")}
    assert affects == {"lm_0": True, "lm_1": True, "lm_2": False}
    # Zonal scale-set instances: each record names its own zone.
    assert [run.records[vm][1]["Zone"] for vm in ("lm_0", "lm_1", "lm_2")] == ["1", "2", "3"]


def test_spot_preempt_hits_the_spot_instance_on_short_notice(run: Run) -> None:
    check_case(run, "spot-preempt", CASES["spot-preempt"])
    assert run.fleet["spot_1"]["priority"] == "Spot"
    assert run.fleet["spot_0"]["priority"] == "Regular"
    summary = run.sim_events[run.event_ids["spot-preempt"]]
    # 30 simulated seconds of notice, the documented minimum for an eviction.
    notice = (summary["notBefore"] - summary["scheduledAt"]) * SPOT_SCALE
    assert notice == pytest.approx(30.0)


def test_vmss_terminate_matches_the_scale_set_instance_name(run: Run) -> None:
    check_case(run, "vmss-terminate", CASES["vmss-terminate"])
    scheduled = run.records["web_0"][1]
    assert (scheduled["VmName"], scheduled["VmScaleSetName"]) == ("web_0", "web")
    assert scheduled["AffectsThisVm"] is True
    assert run.records["web_1"][1]["AffectsThisVm"] is False


def test_vmss_terminate_through_a_2017_api_version(run: Run) -> None:
    """2017-03-01 prefixes Resources with '_', sends ISO times and lacks the newer fields."""
    key = "vmss-terminate-2017"
    assert key not in run.problems, run.problems[key]
    event_id = run.event_ids[key]
    summary = run.sim_events[event_id]
    events = [r for r in run.records["old_0"] if r["RecordType"] == "Event"]
    assert [(r["EventId"], r["Transition"]) for r in events] == [
        (event_id, t) for t in LIFECYCLE
    ], run.show("old_0")
    check_chain(run, "old_0", events)
    for record in events:
        assert record["Resources"] == ["_old_0"]
        assert record["AffectsThisVm"] is True
        assert record["EventType"] == "Terminate"
        nulls = ("EventSource", "Description", "DurationInSeconds")
        assert {k: record[k] for k in nulls} == dict.fromkeys(nulls)
    scheduled = events[0]
    assert scheduled["NotBefore"] == _iso_seconds(summary["notBefore"])
    assert scheduled["NotBeforeRaw"] == scheduled["NotBefore"].replace(".000Z", "Z")


def test_canceled_event_is_canceled_not_inferred(run: Run) -> None:
    check_case(run, "canceled", CASES["canceled"])
    canceled = run.records["cancel-0"][2]
    assert canceled["Transition"] == "Canceled"
    assert (canceled["EventStatus"], canceled["PreviousStatus"]) == (None, "Scheduled")


def test_hardware_failure_appears_directly_as_started(run: Run) -> None:
    check_case(run, "hardware-failure", CASES["hardware-failure"])
    first = run.records["hw-0"][1]
    assert (first["Transition"], first["PreviousStatus"], first["EventStatus"]) == (
        "Started",
        None,
        "Started",
    )


def test_availability_set_every_member_sees_the_event(run: Run) -> None:
    check_case(run, "availability-set", CASES["availability-set"])
    members = ("db-0", "db-1", "db-2")
    assert [run.records[vm][1]["AffectsThisVm"] for vm in members] == [True, False, False]
    # Fault domains come from instance metadata: the set spreads over three.
    assert [run.records[vm][1]["PlatformFaultDomain"] for vm in members] == [0, 1, 2]


def test_reset_24h_keeps_tracking_the_event_by_id(run: Run) -> None:
    assert "reset-24h" not in run.problems, run.problems["reset-24h"]
    event_id = run.event_ids["reset-24h"]
    events = [r for r in run.records[RESET_VM] if r["RecordType"] == "Event"]
    # Nothing spurious when the incarnation went backwards: no Canceled, no new Scheduled.
    assert [(r["EventId"], r["Transition"]) for r in events] == [
        (event_id, t) for t in LIFECYCLE
    ], run.show(RESET_VM)
    scheduled, started, completed = events
    base = run.baseline[RESET_VM]
    assert run.reset_at == 1
    incarnations = [(r["PreviousIncarnation"], r["DocumentIncarnation"]) for r in events]
    assert incarnations == [(base, base + 1), (1, 2), (2, 3)]
    assert scheduled["DocumentIncarnation"] > started["DocumentIncarnation"]
    assert all(r["Inferred"] is False for r in events)
    assert (started["PreviousStatus"], completed["PreviousStatus"]) == ("Scheduled", "Started")
    stop = run.records[RESET_VM][-1]
    assert (stop["HeartbeatReason"], stop["DocumentIncarnation"]) == ("Stop", 3)


# -- what holds for every agent ----------------------------------------------------------------


def test_every_record_is_valid_and_names_its_vm(run: Run) -> None:
    for vm, records in run.records.items():
        assert records, f"{vm} wrote nothing\n{run.stderr[vm]}"
        assert_all_valid(records)
        for record in records:
            check_common(run, vm, record)


def test_heartbeats_at_start_and_stop(run: Run) -> None:
    for vm, records in run.records.items():
        beats = [r for r in records if r["RecordType"] == "Heartbeat"]
        assert [r["HeartbeatReason"] for r in beats] == ["Start", "Stop"], run.show(vm)
        start, stop = beats
        assert records[0] is start
        assert records[-1] is stop
        # Written before the first poll, from an empty state directory.
        assert (start["DocumentIncarnation"], start["PendingEvents"]) == (None, 0)
        assert (start["ImdsHealthy"], start["LastImdsSuccess"]) == (False, None)
        last_event = [r for r in records if r["RecordType"] == "Event"][-1]
        assert stop["DocumentIncarnation"] == last_event["DocumentIncarnation"]
        assert stop["PendingEvents"] == 0
        assert stop["ImdsHealthy"] is True
        assert stop["LastImdsSuccess"] is not None
        assert stop["SpoolDroppedRecords"] == 0


def test_record_ids_are_unique_and_derived_from_identity(run: Run) -> None:
    ids = [r["RecordId"] for records in run.records.values() for r in records]
    assert len(ids) == len(set(ids))
    # Version 5 UUIDs are names hashed, not random: a replayed record keeps its id.
    assert {uuid.UUID(i).version for i in ids} == {5}


def test_two_agents_on_one_vm_give_its_records_the_same_ids(run: Run) -> None:
    """The RecordId comes from what was observed, not from which agent or when."""

    def identities(records: list[Record]) -> list[tuple[str, str, str]]:
        return [
            (r["RecordId"], r["EventId"], r["Transition"])
            for r in records
            if r["RecordType"] == "Event"
        ]

    primary = identities(run.records[TWIN_OF])
    assert len(primary) == 3
    assert identities(run.twin_records) == primary
    twin_beats = {r["RecordId"] for r in run.twin_records if r["RecordType"] == "Heartbeat"}
    assert len(twin_beats) == 2
    assert not twin_beats & {r["RecordId"] for r in run.records[TWIN_OF]}


def test_processes_stop_cleanly_and_quietly(run: Run) -> None:
    assert run.exit_codes == dict.fromkeys(run.exit_codes, 0)
    for name, log in run.stderr.items():
        for bad in (" WARNING ", " ERROR ", "Traceback"):
            assert bad not in log, f"{name}:\n{log}"
