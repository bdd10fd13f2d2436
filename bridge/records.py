"""The common part of every record: who observed it, when, and its deterministic id
(docs/contracts.md#record; the fields themselves are in record.schema.json)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import Any, Final, TypeGuard

from bridge import __version__
from bridge import recordtypes as rt

SCHEMA_VERSION: Final = 1

# A record of any type as the modules that only pass records on see it (the spool, the sinks,
# the metrics, the consumer's documents): typed (an rt.Record) or parsed from JSON and not yet
# checked against the schema. Its fields are read with .get and checked before use.
RecordView = Mapping[str, object]


def is_event(record: RecordView) -> TypeGuard[rt.Event]:
    """Whether `record` is an Event record (its RecordType says which TypedDict it is; the
    schema check, or the agent's builder, vouches for the rest)."""
    return record.get(rt.RECORD_TYPE) == "Event"


# The EventType of a Spot rebalance recommendation (bridge.agent.advisory says where that is
# known from): an advisory, never an event to approve, by the agent or Event Grid's delivery.
REBALANCE_EVENT_TYPE = "SpotRebalanceRecommendation"


def is_recommendation(event_type: object) -> bool:
    """Whether an EventType names a Spot rebalance recommendation (any case)."""
    return (
        isinstance(event_type, str) and event_type.strip().lower() == "spotrebalancerecommendation"
    )


def is_decision(record: RecordView) -> TypeGuard[rt.Decision]:
    """Whether `record` is a Decision record, as `is_event` tells an Event record."""
    return record.get(rt.RECORD_TYPE) == "Decision"


# Fixed namespace so that RecordIds are stable across agents, versions and hosts.
RECORD_NAMESPACE = uuid.UUID("6f1c2c1e-6a3b-4f57-9a52-2f3d0c5e8b11")


@dataclass(frozen=True)
class VmIdentity:
    """What instance metadata says about this VM; every field is None when unknown."""

    vm_id: str | None = None
    vm_name: str | None = None
    resource_id: str | None = None
    subscription_id: str | None = None
    resource_group: str | None = None
    location: str | None = None
    zone: str | None = None
    vm_scale_set_name: str | None = None
    platform_fault_domain: int | None = None
    platform_update_domain: int | None = None
    tags: tuple[tuple[str, str], ...] = ()

    @property
    def known(self) -> bool:
        return self.vm_id is not None

    def key(self, host_name: str) -> str:
        """A stable name for this VM in RecordIds: the VmId, or the host name before it is known."""
        return self.vm_id or f"host:{host_name}"

    def to_state(self) -> dict[str, Any]:
        """As kept in the agent state: {"vm_id": "02aab8a4-...", "tags": [["tier", "web"]], ...}."""
        value = {f.name: getattr(self, f.name) for f in fields(self)}
        value["tags"] = [list(pair) for pair in self.tags]
        return value

    @classmethod
    def from_state(cls, value: dict[str, Any] | None) -> VmIdentity:
        """The identity `to_state` kept; an unknown one for anything else (an older state)."""
        if not isinstance(value, dict):
            return cls()
        try:
            known = {f.name: value.get(f.name) for f in fields(cls) if f.name != "tags"}
            tags = tuple((str(k), str(v)) for k, v in value.get("tags") or ())
            return cls(**known, tags=tags)
        except (TypeError, ValueError):
            return cls()


@dataclass(frozen=True)
class Origin:
    """The observing agent: the VM's identity plus the host and agent version."""

    identity: VmIdentity
    host_name: str
    agent_version: str = __version__

    def common(self, record_type: rt.RecordType, record_id: str, now: datetime) -> rt.Common:
        """The fields every record has; a record type's builder narrows RecordType."""
        ident = self.identity
        return {
            "SchemaVersion": SCHEMA_VERSION,
            "RecordId": record_id,
            rt.RECORD_TYPE: record_type,
            "TimeGenerated": iso(now),
            "VmId": ident.vm_id,
            "VmName": ident.vm_name,
            "ResourceId": ident.resource_id,
            "SubscriptionId": ident.subscription_id,
            "ResourceGroup": ident.resource_group,
            "Location": ident.location,
            "Zone": ident.zone,
            "VmScaleSetName": ident.vm_scale_set_name,
            "PlatformFaultDomain": ident.platform_fault_domain,
            "PlatformUpdateDomain": ident.platform_update_domain,
            "HostName": self.host_name,
            "AgentVersion": self.agent_version,
        }

    def record_id(self, *parts: object) -> str:
        return record_id(self.identity.key(self.host_name), *parts)


def record_id(*parts: object) -> str:
    """A UUID derived from the record's identity, so a replayed record keeps its id."""
    return str(uuid.uuid5(RECORD_NAMESPACE, "|".join("" if p is None else str(p) for p in parts)))


def vm_key(name: str) -> str:
    """The one way a VM name is compared, by the agent and the consumer alike.

    Azure names ignore case, and api-version 2017-03-01 lists a scale-set instance in
    `Resources` with a leading underscore: "_web_3", "WEB_3" and "web_3" name one VM.
    """
    return name.strip().lstrip("_").lower()


def utc_now() -> datetime:
    """The current time, aware and in UTC: the clock every program's pure cores are handed."""
    return datetime.now(timezone.utc)


def parse_time(text: object) -> datetime | None:
    """A record's time (`iso`'s format, or any ISO 8601 text) as an aware datetime; None when
    it is none. Text without a zone is taken as UTC."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def iso(moment: datetime) -> str:
    """ISO 8601 UTC with a Z, millisecond precision: the one time format of every record."""
    utc = moment.astimezone(timezone.utc)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


@dataclass(frozen=True)
class Health:
    """What a Heartbeat reports besides the common fields."""

    incarnation: int | None
    pending_events: int
    spool_depth: int
    spool_dropped: int
    imds_healthy: bool
    last_imds_success: datetime | None
    # Whether hooks.prepare is set; None leaves HasPrepareHook out, as agents before it did.
    prepare_hook: bool | None = None
    node: NodeHealth | None = None  # [kubernetes] on: this VM's node
    # Its prepare steps in the order they run (drain, hook); None leaves PrepareSteps out.
    prepare_steps: tuple[str, ...] | None = None


@dataclass(frozen=True)
class NodeHealth:
    """This VM's Kubernetes node as a Heartbeat reports it (docs/contracts.md)."""

    name: str
    pool: str | None = None
    draining: str | None = None  # the EventId whose drain runs or holds the node
    cordoned: bool | None = None  # unschedulable, and not by se-bridge


def heartbeat_record(
    origin: Origin, reason: rt.HeartbeatReason, health: Health, now: datetime, *, run: str = ""
) -> rt.Heartbeat:
    """`run` names the agent process: two agents on one VM (a second install, a test twin)
    that beat in the same millisecond still send two heartbeats, not one id twice. A
    heartbeat is stored with its id once made, so a resend never recomputes it."""
    rid = origin.record_id("Heartbeat", reason, iso(now), run)
    record: rt.Heartbeat = {
        **origin.common("Heartbeat", rid, now),
        rt.RECORD_TYPE: "Heartbeat",
        "DocumentIncarnation": health.incarnation,
        "HeartbeatReason": reason,
        "PendingEvents": health.pending_events,
        "SpoolDepth": health.spool_depth,
        "SpoolDroppedRecords": health.spool_dropped,
        "ImdsHealthy": health.imds_healthy,
        "LastImdsSuccess": iso(health.last_imds_success) if health.last_imds_success else None,
        "Tags": dict(origin.identity.tags) if origin.identity.known else None,
        "HasPrepareHook": bool(health.prepare_hook),
        "PrepareSteps": list(health.prepare_steps or ()),
        # Set by an agent whose [kubernetes] section is on (docs/kubernetes.md).
        "NodeName": health.node.name if health.node else None,
        "NodePool": health.node.pool if health.node else None,
        "NodeDraining": health.node.draining if health.node else None,
        "NodeCordoned": health.node.cordoned if health.node else None,
    }
    if health.prepare_hook is None:  # left out, as agents before HasPrepareHook did
        del record["HasPrepareHook"]
    if health.prepare_steps is None:
        del record["PrepareSteps"]
    return record


@dataclass(frozen=True)
class ApprovalOutcome:
    """What the agent did with one approval, central (a command) or local (its own policy)."""

    event_id: str | None
    event_type: str | None
    incarnation: int | None
    command_id: str | None
    source: rt.ApprovalSource
    outcome: rt.ApprovalOutcome
    detail: str
    rule: str | None = None
    issued_at: datetime | None = None
    latency_ms: int | None = None
    # A command that came too late: its event had Started or Ended here (refused as Late),
    # or it had Expired; for the metrics, not a field of the record (ApprovalDetail says it).
    late: str | None = None


def approval_record(origin: Origin, approval: ApprovalOutcome, now: datetime) -> rt.Approval:
    # One id per command and outcome: a duplicate command that ends the same way is the
    # same record, so downstream deduplication folds it away.
    rid = origin.record_id("Approval", approval.command_id or approval.detail, approval.outcome)
    return {
        **origin.common("Approval", rid, now),
        rt.RECORD_TYPE: "Approval",
        "DocumentIncarnation": approval.incarnation,
        "EventId": approval.event_id,
        "EventType": approval.event_type,
        "CommandId": approval.command_id,
        "ApprovalSource": approval.source,
        "ApprovalOutcome": approval.outcome,
        "ApprovalDetail": approval.detail,
        "DecisionRule": approval.rule,
        "CommandIssuedAt": iso(approval.issued_at) if approval.issued_at else None,
        "ApprovalLatencyMs": approval.latency_ms,
    }
