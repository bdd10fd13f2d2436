"""Model agents: the records each VM's agent would send, made by the agent's own code.

Heartbeats and Approval records come from `bridge.records`' builders, Event records from
the agent's normaliser (`bridge.agent.normalise`) fed the Scheduled Events document the VM
would read from IMDS: so the schema, the RecordIds (derived from each record's identity),
the transitions (Scheduled, Started, Completed, with `Inferred` after a reboot) and the
incarnations are the real ones, not a copy of them.

Only VMs with something going on (an event in their document, a reboot) hold state here;
the others are their fleet row, so memory grows with the events of a wave, not the fleet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from bridge.agent.normalise import Context, NormaliserState, empty_state, normalise
from bridge.commands.message import Command
from bridge.records import (
    ApprovalOutcome,
    Health,
    Origin,
    approval_record,
    heartbeat_record,
    iso,
)
from bridge.recordtypes import ApprovalOutcome as Outcome
from bridge.recordtypes import HeartbeatReason
from tests.benchmarks.loadgen.fleet import Fleet, Vm

Record = dict[str, Any]
FIRST_INCARNATION = 1
# The agent polls IMDS every second: its last observation was a moment ago.
POLL = timedelta(seconds=1)


@dataclass
class Agent:
    """One busy VM's agent: its normaliser state and the IMDS document it would read."""

    vm: Vm
    origin: Origin
    state: NormaliserState = field(default_factory=empty_state)
    events: dict[str, dict[str, Any]] = field(default_factory=dict)  # by EventId (IMDS shape)
    incarnation: int = FIRST_INCARNATION
    boot: int = 0
    rebooted: bool = False  # down since its last observation: the next one sees a new boot

    def document(self) -> dict[str, Any]:
        return {"DocumentIncarnation": self.incarnation, "Events": list(self.events.values())}


class Agents:
    """The fleet's agents; `active` holds those with state worth keeping."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.active: dict[int, Agent] = {}
        self.boots: dict[int, int] = {}  # VMs rebooted at least once: their boot count

    def agent(self, index: int) -> Agent:
        found = self.active.get(index)
        if found is None:
            vm = self.fleet.vms[index]
            boot = self.boots.get(index, 0)
            found = Agent(vm, vm.origin(), incarnation=FIRST_INCARNATION + boot, boot=boot)
            # The agent has watched this VM's empty document all along.
            found.state["incarnation"] = found.incarnation
            found.state["boot_id"] = self._boot_id(index, boot)
            self.active[index] = found
        return found

    def idle(self, index: int) -> None:
        """Forget a VM's agent once nothing is going on: the next event starts afresh."""
        agent = self.active.get(index)
        if agent is not None and not agent.events and not agent.rebooted:
            self.boots[index] = agent.boot
            del self.active[index]

    def forget(self, index: int) -> None:
        """The VM is deleted, or its agent silent for good."""
        self.active.pop(index, None)

    def _boot_id(self, index: int, boot: int) -> str:
        return f"{self.fleet.seed:x}-{index:x}-{boot}"

    def _run(self, index: int) -> str:
        # The agent process names itself in heartbeat ids; a reboot starts a new process.
        return f"{self.fleet.seed:x}{index:x}r{self.boots.get(index, 0)}"

    def heartbeat(self, index: int, now: datetime, reason: HeartbeatReason = "Periodic") -> Record:
        agent = self.active.get(index)
        origin = agent.origin if agent is not None else self.fleet.vms[index].origin()
        incarnation = agent.incarnation if agent is not None else FIRST_INCARNATION
        pending = len(agent.events) if agent is not None else 0
        health = Health(incarnation, pending, 0, 0, imds_healthy=True, last_imds_success=now)
        return dict(heartbeat_record(origin, reason, health, now, run=self._run(index)))

    def put(self, index: int, raw: dict[str, Any]) -> None:
        """The event `raw` (as IMDS lists it) is in the VM's document now, new or changed."""
        agent = self.agent(index)
        agent.events[raw["EventId"]] = raw
        agent.incarnation += 1

    def drop(self, index: int, event_id: str) -> None:
        agent = self.agent(index)
        if agent.events.pop(event_id, None) is not None:
            agent.incarnation += 1

    def reboot(self, index: int) -> None:
        """The VM goes down: its agent observes nothing until `observe` after it is back."""
        agent = self.agent(index)
        agent.rebooted = True

    def observe(self, index: int, now: datetime) -> list[Record]:
        """The agent's next poll of IMDS: the Event records its normaliser makes of it."""
        agent = self.agent(index)
        state = agent.state
        if agent.rebooted:
            # Back from a reboot: a new boot id, and the last observation is the one before.
            agent.boot += 1
            agent.rebooted = False
            self.boots[index] = agent.boot
            boot_id = self._boot_id(index, agent.boot)
        else:
            boot_id = state["boot_id"] or self._boot_id(index, agent.boot)
            state = {**state, "observed_at": iso(now - POLL)}
        result = normalise(state, agent.document(), Context(now, agent.origin, boot_id=boot_id))
        agent.state = result.state
        return [dict(record) for record in result.records]

    def approval(
        self, index: int, command: Command, outcome: Outcome, detail: str, now: datetime
    ) -> Record:
        agent = self.agent(index)
        raw = agent.events.get(command.event_id)
        latency = max(0, round((now - command.issued_at).total_seconds() * 1000))
        result = ApprovalOutcome(
            event_id=command.event_id,
            event_type=raw["EventType"] if raw else None,
            incarnation=agent.incarnation,
            command_id=command.command_id,
            source="Central",
            outcome=outcome,
            detail=detail,
            rule=command.rule,
            issued_at=command.issued_at,
            latency_ms=latency if outcome == "Approved" else None,
        )
        return dict(approval_record(agent.origin, result, now))
