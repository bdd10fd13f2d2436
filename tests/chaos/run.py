"""The chaos run: kill agents and the consumer at random moments while the fleet goes through
maintenance, IMDS misbehaves and sinks go down; then let everything settle and check.

    report = run_chaos(Path("/tmp/chaos"), cycles=200, seed=7)
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bridge.localhub import PARTITIONS, LocalHub
from bridge.simulator.fleet import EventSpec
from tests.chaos import invariants as inv
from tests.chaos.rig import SCALE_SETS, VMS, Rig, allowed, scale_set_of
from tests.support.processes import Proc
from tests.support.wait import within

log = logging.getLogger(__name__)

CONSUMER = "consumer"
FAULTS: list[dict[str, Any]] = [
    {},
    {"rate429": 0.3, "retryAfter": 1},
    {"rate410": 0.15, "rate500": 0.1, "rate503": 0.1},
    {"rateNotJson": 0.15, "rateNotDocument": 0.15},
    {"rate503": 0.5},
]
SLOW_VM_LATENCY = 11.0  # above the agent's 10 s IMDS read timeout: its requests time out
# One VM's IMDS at a time: too slow, stalled (an answer a byte every 2 s, cut off by the
# agent's 10 s deadline), or endless (a body that never ends, refused past its cap).
ONE_VM_FAULTS = {
    "timeouts": {"latency": SLOW_VM_LATENCY},
    "stalled IMDS": {"drip": 2.0},
    "endless IMDS": {"rateEndless": 1.0},
}
SETTLE = 240.0
STALL = 25.0  # seconds, past the chaos consumer's alive_within (rig.CONSUMER_TOML)


class Chaos:
    def __init__(self, rig: Rig, cycles: int) -> None:
        self.rig, self.cycles = rig, cycles
        self.rng = rig.rng
        self.kills: Counter[str] = Counter()
        self.faults_used: Counter[str] = Counter()
        self.exits: list[str] = []
        self.broker_down = self.logs_down = False
        self.stuck: dict[str, str] = {}  # problem: scale set, sorted once the checks ran

    # --- the world -----------------------------------------------------------------------

    def world(self, cycle: int) -> None:
        self.rig.twins.step(cycle, self.rig.events())
        if self.rng.random() < 0.45:
            self.new_event()
        if cycle % 6 == 0:
            self.change_faults()
        if cycle % 5 == 2:
            self.plant_in_a_channel()
        if cycle % 9 == 0:
            self.toggle_broker()
        if cycle % 7 == 3:
            self.toggle_logs()
        if cycle % 25 == 20:
            self.stall_consumer()

    def new_event(self) -> None:
        scale_set = self.rng.choice(sorted(SCALE_SETS))
        members = SCALE_SETS[scale_set]
        live = [e for e in self.rig.events().values() if e["endedAt"] is None
                and allowed(self.rig.kinds.specs[e["eventId"]])
                and e["resources"][0] in members]  # fmt: skip
        roll = self.rng.random()
        if roll < 0.55 and len(live) < 2:
            vm = self.rng.choice(members)
            spec = EventSpec("Reboot", (vm,), notice=3600, run_time=2.0, event_source="User")
        elif roll < 0.85:
            vm = self.rng.choice(members)
            spec = EventSpec("Redeploy", (vm,), notice=86400, event_source="Platform",
                             cancel_after=self.rng.uniform(5, 20))  # fmt: skip
        else:
            spec = EventSpec("Reboot", members, notice=3600, event_source="User",
                             cancel_after=self.rng.uniform(5, 20))  # fmt: skip
        self.rig.add_event(spec)

    def change_faults(self) -> None:
        self.rig.sim.clear_faults()
        if self.rng.random() < 0.3:
            vm = self.rng.choice(VMS)
            kind = self.rng.choice(sorted(ONE_VM_FAULTS))
            self.rig.sim.set_faults(ONE_VM_FAULTS[kind], vm)
            self.faults_used[kind] += 1
            return
        faults = self.rng.choice(FAULTS)
        self.rig.sim.set_faults(faults)
        self.faults_used[",".join(sorted(faults)) or "none"] += 1

    def plant_in_a_channel(self) -> None:
        """A hostile neighbour: a link to a file the agent must never touch, a pipe and a
        directory, among one VM's commands (check_planted says whether they survived)."""
        vm = self.rng.choice(VMS)
        planted = self.rig.plant_hostile(vm, len(self.rig.planted))
        self.faults_used["hostile channel entries"] += len(planted)

    def toggle_broker(self) -> None:
        if self.broker_down:
            self.rig.broker.start()
        else:
            self.rig.broker.stop()
            self.faults_used["Event Hubs outage"] += 1
        self.broker_down = not self.broker_down

    def toggle_logs(self) -> None:
        if self.logs_down:
            self.rig.logs.up()
        elif self.rng.random() < 0.5:
            self.rig.logs.down()
            self.faults_used["Logs Ingestion outage"] += 1
        else:
            status = self.rng.choice([429, 500, 503])
            self.rig.logs.script(status, retry_after=1, count=self.rng.randint(2, 6))
            self.faults_used[f"Logs Ingestion {status}s"] += 1
            return
        self.logs_down = not self.logs_down

    def stall_consumer(self) -> None:
        """Stop the consumer (SIGSTOP) past alive_within while the agents go on, then let it
        go on: it wakes behind on every partition, and every VM it last heard before the
        stall looks silent on its clock. A slot released on that silence lets a second VM of
        a scale set be approved while the first is down (issue 27, item 5): check_budgets
        sees that at IMDS."""
        proc = self.rig.consumer
        if not proc.alive:
            return
        proc.popen.send_signal(signal.SIGSTOP)
        try:
            time.sleep(STALL)
        finally:
            proc.popen.send_signal(signal.SIGCONT)
        self.faults_used["consumer stalled past alive_within"] += 1

    # --- kills ---------------------------------------------------------------------------

    def kill_one(self) -> None:
        target = self.rng.choice([*VMS, CONSUMER, CONSUMER])
        proc = self.rig.consumer if target == CONSUMER else self.rig.agents[target].proc
        time.sleep(self.rng.uniform(0.05, 2.5))
        self._kill(target, proc)
        if target == CONSUMER:
            self.rig.start_consumer()
        else:
            self.rig.agents[target].start()

    def _kill(self, target: str, proc: Proc) -> None:
        if not proc.alive:
            self.exits.append(f"{proc.name} exited by itself with {proc.popen.returncode}: "
                              f"{json.dumps(proc.stderr()[-400:])}")  # fmt: skip
        proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait()
        self.kills[CONSUMER if target == CONSUMER else "agent"] += 1

    # --- the end -------------------------------------------------------------------------

    def settle(self) -> list[str]:
        """Faults off, sinks up, held events canceled, every event ended and seen by all."""
        rig = self.rig
        rig.sim.clear_faults()
        if self.broker_down:
            rig.broker.start()
        rig.logs.clear_script()
        rig.logs.up()
        for vm in VMS:
            if not rig.agents[vm].proc.alive:
                rig.agents[vm].start()
        if not rig.consumer.alive:
            rig.start_consumer()
        problems = self._end_every_event()
        rig.twins.settle()
        polls = self._polls()
        within(
            lambda: all(self._polls()[vm] >= polls[vm] + 8 for vm in VMS),
            60,
            "agents to poll",
            interval=0.5,
        )
        problems += self._wait_consumer_drained()
        problems += self._wait_releases()
        return problems

    def _wait_releases(self) -> list[str]:
        """The Preempts of deleted twins: released once the consumer heard nothing of their
        VM for alive_within, having run that long itself."""

        def released() -> bool:
            said = {str(d["EventId"]).lower() for d in self.rig.decisions_written()
                    if d.get("DecisionAction") == "Release"}  # fmt: skip
            return {e.lower() for e in self.rig.twins.released()} <= said

        if not within(released, 120, "the slots of deleted twins to be released", interval=0.5):
            return ["the budget slot of a deleted twin's Preempt was not released within 120 s"]
        return []

    def _end_every_event(self) -> list[str]:
        rig = self.rig
        for event_id, event in rig.events().items():
            if (
                event["endedAt"] is None
                and not allowed(rig.kinds.specs[event_id])
                and event["startedAt"] is None
            ):
                try_cancel(rig, event_id)
        done = within(
            lambda: all(e["endedAt"] is not None for e in rig.events().values()),
            SETTLE,
            "every allowed event to be approved, run and complete",
            interval=0.5,
        )
        if done:
            return []
        stuck = [e for e in rig.events().values() if e["endedAt"] is None]
        for event in stuck:
            try_cancel(rig, event["eventId"])
        self.stuck = {
            f"event {e['eventId']} ({e['eventSource']} {e['eventType']} of {e['resources']}) "
            f"was still {e['status']} {SETTLE:g} s after the chaos ended": scale_set_of(
                e["resources"][0]
            )
            for e in stuck
        }
        return []

    def _polls(self) -> dict[str, int]:
        return {vm: c.get("GET scheduledevents", 0) for vm, c in self.rig.sim.counters().items()}

    def _wait_consumer_drained(self) -> list[str]:
        def drained() -> bool:
            with LocalHub(self.rig.hub) as hub:
                ends = {p: len(hub.read(p, -1, 10**7)) - 1 for p in range(PARTITIONS)}
                marks = hub.checkpoints("$Default")
            return all(marks.get(p, -1) >= end for p, end in ends.items())

        if not within(drained, 90, "the consumer to handle every record in the hub", interval=0.5):
            return ["the consumer did not catch up with the hub within 90 s"]
        time.sleep(2.0)  # a re-evaluation pass after the last batch
        return []

    def stop_all(self, jsonl_complete: Callable[[], bool]) -> list[str]:
        """Sinks caught up, then a clean stop of every process: each must exit 0."""
        problems = []
        if not within(jsonl_complete, 120, "every sink to hold every record", interval=0.5):
            problems.append("the sinks did not catch up with the agents within 120 s: "
                            f"{missing(self.rig)}")  # fmt: skip
        for vm in VMS:
            code = self.rig.agents[vm].stop()
            if code != 0:
                problems.append(f"agent {vm} exited with {code} on SIGTERM, not 0")
        code = self.rig.consumer.stop()
        if code != 0:
            problems.append(f"the consumer exited with {code} on SIGTERM, not 0")
        return problems


def try_cancel(rig: Rig, event_id: str) -> None:
    try:
        rig.sim.cancel_event(event_id)
    except Exception as err:
        log.info("could not cancel %s: %s", event_id, err)


def run_chaos(root: Path, *, cycles: int, seed: int) -> inv.Report:
    began = time.monotonic()
    rig = Rig(root, seed).start()
    chaos = Chaos(rig, cycles)
    report = inv.Report()
    try:
        rig.sim.set_faults({"firstCallDelay": 3.0})  # each VM's first call is the slow one
        for cycle in range(1, cycles + 1):
            chaos.world(cycle)
            chaos.kill_one()
            if cycle % 20 == 0:
                log.info("chaos: %d of %d kill cycles, %s", cycle, cycles, dict(chaos.kills))
        report.add(chaos.exits)
        report.add(chaos.settle())
        report.add(chaos.stop_all(sinks_complete(rig)))
        check(rig, report)
        report.add(inv.check_planted(rig.planted, rig.victim))
        inv.add_unapproved(report, chaos.stuck)
    finally:
        rig.close()
    report.numbers = {
        "seed": seed,
        "kill cycles": cycles,
        "SIGKILLs (agent, consumer)": f"{chaos.kills['agent']}, {chaos.kills[CONSUMER]}",
        "process starts": len(rig.procs._procs),
        "faults and outages": dict(sorted(chaos.faults_used.items())),
        "Event Grid deliveries (sent, lost, duplicated, reordered)": ", ".join(
            str(rig.grid.counts[k]) for k in ("sent", "lost", "duplicated", "reordered")
        ),
        **report.numbers,
        "duration": f"{time.monotonic() - began:.0f} s",
    }
    return report


def sinks(rig: Rig) -> dict[str, list[inv.Record]]:
    return {
        "hub": [r for r in inv.hub_records(rig.hub) if r.get("RecordId") not in rig.twins.written],
        "eventhubs": [json.loads(e.body) for e in rig.broker.events()],
        "loganalytics": rig.logs.records(),
    }


def sinks_complete(rig: Rig) -> Callable[[], bool]:
    """Whether every sink holds what the agents had written when this was asked: not what
    they write after. A heartbeat (every 5 s) waits up to loganalytics.send_interval (5 s)
    for its upload, so an agent whose two clocks keep one phase always has one pending, and
    "everything, at one moment, on all four VMs" might never come. What they write later is
    checked after the clean stop (check_delivery), which flushes it."""
    before = set(_written(rig))
    return lambda: not any(missing(rig, before).values())


def _written(rig: Rig) -> dict[str, inv.Record]:
    return {r["RecordId"]: r for a in rig.agents.values() for r in inv.read_jsonl(a.sink)[1]}


def missing(rig: Rig, among: set[str] | None = None) -> dict[str, list[str]]:
    """Per sink, what the agents wrote (of `among`, if given) that it does not hold: the VM
    and RecordType of each."""
    written = _written(rig)
    if among is not None:
        written = {rid: r for rid, r in written.items() if rid in among}
    held = {name: {r["RecordId"] for r in records} for name, records in sinks(rig).items()}
    return {
        name: sorted(f"{r.get('VmName')} {r.get('RecordType')}" for rid, r in written.items()
                     if rid not in ids)
        for name, ids in held.items()
    }  # fmt: skip


def check(rig: Rig, report: inv.Report) -> None:
    jsonl = {vm: agent.sink for vm, agent in rig.agents.items()}
    events = rig.events()
    agent_records = [r for path in jsonl.values() for r in inv.read_jsonl(path)[1]]
    inv.check_delivery(report, jsonl, sinks(rig))
    inv.check_transitions(report, jsonl, events)
    inv.check_approvals(
        report, rig.kinds.specs, rig.approvals(), rig.decisions_written(), agent_records
    )
    inv.check_budgets(report, rig.kinds.specs, events)
    inv.check_consumer_state(report, rig.fleet_db, events, jsonl, rig.twins)
    inv.check_twins(report, rig.twins, rig.decisions_written(), rig.root / "consumer", rig.fleet_db)
