"""Records as a fleet of agents would send them, for tests of the consumer.

Built with the agent's own record builders where one exists (heartbeats, approvals), so
the consumer is tested against the shapes it really receives; every record validates
against the schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from bridge.commands.message import Command
from bridge.records import (
    ApprovalOutcome,
    Health,
    Origin,
    VmIdentity,
    approval_record,
    heartbeat_record,
    iso,
    record_id,
)
from bridge.recordtypes import ApprovalOutcome as Outcome
from bridge.recordtypes import DrainStatus, HeartbeatReason
from tests.support.records import common_fields

SUBSCRIPTION = "8d5f9c8e-0000-4000-8000-000000000001"


@dataclass
class FleetRecords:
    """A fleet's VMs by name; `now` is the time the next records carry."""

    now: datetime
    origins: dict[str, Origin] = field(default_factory=dict)

    def vm(self, name: str, *, scale_set: str | None = None, zone: str | None = None,
           fault_domain: int | None = None, tags: dict[str, str] | None = None,
           resource_group: str = "rg-app", handle: str | None = None,
           subscription: str = SUBSCRIPTION) -> str:  # fmt: skip
        """Add a VM; `handle` names it in these tests when its VM name repeats in the fleet."""
        vm_id = str(record_id("test-vm", handle or name))
        identity = VmIdentity(
            vm_id=vm_id,
            vm_name=name,
            subscription_id=subscription,
            resource_group=resource_group,
            location="westeurope",
            zone=zone,
            vm_scale_set_name=scale_set,
            platform_fault_domain=fault_domain,
            platform_update_domain=0,
            tags=tuple(sorted((tags or {}).items())),
        )
        self.origins[handle or name] = Origin(identity, host_name=handle or name)
        return vm_id

    def vm_id(self, name: str) -> str:
        vm_id = self.origins[name].identity.vm_id
        assert vm_id is not None
        return vm_id

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now

    def heartbeat(
        self,
        name: str,
        reason: HeartbeatReason = "Periodic",
        *,
        prepare_hook: bool | None = None,
        node: str | None = None,
        pool: str | None = None,
        cordoned: bool | None = None,
        draining: str | None = None,
    ) -> dict[str, Any]:
        """`prepare_hook` None: a heartbeat of an agent from before HasPrepareHook; `node`
        and the rest: an agent with [kubernetes] on that node."""
        health = Health(3, 0, 0, 0, imds_healthy=True, last_imds_success=self.now,
                        prepare_hook=prepare_hook)  # fmt: skip
        record = dict(heartbeat_record(self.origins[name], reason, health, self.now))
        record.update(NodeName=node, NodePool=pool, NodeCordoned=cordoned, NodeDraining=draining)
        return record

    def node(self, name: str, pool: str, *, cordoned: bool | None = False) -> dict[str, Any]:
        """The heartbeat of an agent that drains its node `name` (of pool `pool`) on a grant."""
        return self.heartbeat(name, prepare_hook=True, node=name, pool=pool, cordoned=cordoned)

    def drain(
        self,
        name: str,
        event_id: str,
        status: DrainStatus,
        *,
        blockers: list[dict[str, str | None]] | None = None,
        exit_code: int | None = None,
    ) -> dict[str, Any]:
        """A drain's Hook record (HookName "drain") as the agent writes it for `status`."""
        record = self.hook_ready(name, event_id)
        timed_out = status == "GaveUp"
        record.update(
            RecordId=self.origins[name].record_id("Drain", event_id, status, iso(self.now)),
            HookName="drain",
            DrainStatus=status,
            DrainBlockers=blockers,
            HookExitCode=exit_code,
            HookTimedOut=timed_out,
            HookOutput=f"drain {status}",
        )
        return record

    def event(
        self,
        name: str,
        event_id: str,
        *,
        transition: str = "Scheduled",
        event_type: str = "Reboot",
        source: str = "User",
        resources: list[str] | None = None,
        duration: int | None = -1,
        not_before: datetime | None = None,
    ) -> dict[str, Any]:
        origin = self.origins[name]
        status = {"Scheduled": "Scheduled", "Started": "Started", "Updated": "Scheduled"}.get(
            transition
        )
        affected = resources if resources is not None else [str(origin.identity.vm_name)]
        rid = origin.record_id("Event", event_id, transition, iso(self.now))
        record = common_fields(origin, "Event", rid, self.now)
        nb = not_before or self.now + timedelta(minutes=15)
        record.update(
            DocumentIncarnation=3,
            PreviousIncarnation=2,
            EventId=event_id,
            EventType=event_type,
            ResourceType="VirtualMachine",
            Resources=affected,
            EventSource=source,
            Description="test event",
            DurationInSeconds=duration,
            EventStatus=status,
            PreviousStatus=None if transition == "Scheduled" else "Scheduled",
            Transition=transition,
            NotBefore=iso(nb) if status == "Scheduled" else None,
            NotBeforeRaw=nb.strftime("%a, %d %b %Y %H:%M:%S GMT") if status == "Scheduled" else "",
            AffectsThisVm=origin.identity.vm_name in affected,
            Inferred=False,
            ChangedFields=[],
        )
        return record

    def advisory(
        self,
        name: str,
        event_id: str,
        state: str = "Raised",
        *,
        resources: list[str] | None = None,
    ) -> dict[str, Any]:
        """A Spot rebalance recommendation's Advisory record as VM `name`'s agent writes it
        (bridge.agent.advisory); `resources` None: it names the VM itself."""
        origin = self.origins[name]
        named = resources if resources is not None else [str(origin.identity.vm_name)]
        rid = origin.record_id("Advisory", event_id, state)
        record = common_fields(origin, "Advisory", rid, self.now)
        record.update(
            EventId=event_id,
            EventType="SpotRebalanceRecommendation",
            EventStatus="Scheduled",
            Resources=named,
            NotBefore=None,
            NotBeforeRaw="",
            Description=None,
            AffectsThisVm=(origin.identity.vm_name in named) if named else None,
            AdvisoryState=state,
            Source="Agent",
        )
        return record

    def approval(
        self, command: Command, outcome: Outcome = "Approved", detail: str | None = None
    ) -> dict[str, Any]:
        name = next(n for n, o in self.origins.items() if o.identity.vm_id == command.vm_id)
        result = ApprovalOutcome(
            event_id=command.event_id,
            event_type="Reboot",
            incarnation=3,
            command_id=command.command_id,
            source="Central",
            outcome=outcome,
            detail=detail or f"test: {outcome}",
            rule=command.rule,
            issued_at=command.issued_at,
            latency_ms=5 if outcome == "Approved" else None,
        )
        return dict(approval_record(self.origins[name], result, self.now))

    def hook_ready(self, name: str, event_id: str) -> dict[str, Any]:
        origin = self.origins[name]
        record = common_fields(origin, "Hook", origin.record_id("Hook", event_id), self.now)
        record.update(
            EventId=event_id,
            EventType="Reboot",
            Transition="Scheduled",
            HookPhase="prepare",
            TriggerRecordId="trigger",
            HookExitCode=0,
            HookTimedOut=False,
            HookDurationMs=10,
            HookOutput="drained",
            HookError=None,
        )
        return record
