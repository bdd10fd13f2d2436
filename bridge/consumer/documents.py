"""What the consumer knows about the fleet, as documents, and how records change them.

Three collections in a `bridge.consumer.state.Store`:

- `vm/<VmId>`: identity, tags and when the VM was last heard from;
- `event/<eventid>`: the event as VMs report it, per reporting VM, and hook readiness;
- `ledger/...`: every approved event that has not completed, with the VMs it impacts and
  where its approval went, in shards with budget locks (bridge.consumer.ledger): an
  approval is written with the ETags of its budget groups' locks, so two consumers cannot
  both spend the last slot of a group.

The merge functions here are pure: they take a document value and a record and say
whether the value changed. Replays are harmless: a reporter's status only moves
forward in TimeGenerated, and readiness is a set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict, cast

from bridge.consumer.drains import DrainNote, drain_views, merged_drain
from bridge.consumer.sources.eventgrid import Resource, resource_of
from bridge.consumer.state import Doc, layout
from bridge.policy.model import EventView, Scope, VmView, scope_of
from bridge.records import RecordView, is_recommendation, parse_time, record_id, vm_key
from bridge.recordtypes import RECORD_TYPE


class VmDocument(TypedDict, total=False):
    """`vm/<VmId>`: a VM as its records describe it (the ledger's shape is
    bridge.consumer.ledger.LedgerEntry). A sample:

        {"last_seen": "2026-11-21T10:00:00.000Z", "name": "web_0",
         "subscription_id": "8d5f9c8e-...", "resource_group": "rg-prod", "location": "westeurope",
         "zone": "1", "scale_set": "web", "fault_domain": 0, "update_domain": 0,
         "tags": {"role": "web"}, "prepare_hook": true}

    `stopped` holds the TimeGenerated of a Stop heartbeat until the VM reports again.
    `heard` is when the consumer last folded a record of the VM in, on the consumer's clock:
    whether a VM is alive is measured on it, never on the VM's clock (which may be wrong).
    `partition` is where that record was read (bridge.consumer.reading): the release rule
    takes the VM as silent only as far as that partition has been read.
    """

    last_seen: str
    heard: str
    partition: str
    name: str
    resource_id: str  # compute.resourceId, lower case: Event Grid names VMs by it
    subscription_id: str
    resource_group: str
    location: str
    zone: str
    scale_set: str
    fault_domain: int
    update_domain: int
    tags: dict[str, str]
    stopped: str
    prepare_hook: bool  # as its agent's last heartbeat said; absent when it did not say
    # Its Kubernetes node as its agent's last heartbeat said (issue 30); absent: not said.
    node_name: str
    node_pool: str
    node_draining: str  # the EventId whose drain runs on or holds the node
    node_cordoned: bool  # someone other than se-bridge made the node unschedulable


class _Reported(TypedDict):
    status: str  # the reporter's EventStatus, or Gone once the event left its document
    at: str  # the TimeGenerated of that record


class Reporter(_Reported, total=False):
    told: str  # the `told_key` of the scope that record gave (documents before it: none)


class StandingDecision(TypedDict, total=False):
    """An event document's `decision`: the decision the event stands on, said once in a
    Decision record, with the facts it was taken on. A decision that differs from it says
    what changed since; `policy explain` on an event that is over explains this one. A
    sample:

    {"kind": "Hold", "rule": "everything-else", "reason": "rule everything-else holds: ...",
     "at": "2026-11-21T10:00:00.000Z", "explanation": ["rule user-initiated: does not ...", ...],
     "affected": ["1b1f..."], "unresolved": [], "ready": [], "reporters": 4, "no_hook": []}

    Only kind, rule and reason tell one decision from another. Documents written before the
    rest was kept, and decisions no policy evaluation took (a release, a failure), have only
    those three.
    """

    kind: str
    rule: str
    reason: str
    target: str  # the VmId an approval went through (Approve)
    at: str  # the consumer's clock when it was decided
    explanation: list[str]  # its DecisionExplanation, a line a step
    affected: list[str]  # the VmIds Resources resolved to then
    unresolved: list[str]  # the names that did not resolve
    ready: list[str]  # the VmIds whose prepare hook had succeeded
    reporters: int  # how many VMs reported the event
    no_hook: list[str]  # the VmIds of `affected` whose agents said they have no prepare hook
    override: bool  # a person approved it over a full budget (Decision BudgetOverride)


def standing(value: EventDocument) -> tuple[str, str, str] | None:
    """The kind, rule and reason the event stands on; None before its first decision."""
    held = value.get("decision")
    if not isinstance(held, dict):
        return None
    return str(held.get("kind")), str(held.get("rule")), str(held.get("reason"))


class Told(TypedDict, total=False):
    """An event's fields as the newest record gives them: of all its reporters (the
    EventDocument), or of one scope's (EventDocument.told)."""

    updated: str
    event_type: str | None
    event_source: str | None
    duration: int | None
    resources: list[str] | None
    not_before: str | None
    incarnation: int | None


class AzureView(Told, total=False):
    """An event document's `azure`: the event as Azure's scheduled-events system topic last
    told it (Event Grid, issue 36), beside what the agents report. A sample:

    {"status": "Started", "at": "2026-11-21T10:00:05.000Z", "event_type": "Reboot",
     "event_source": "Platform", "duration": -1, "resources": ["web_2"], "not_before": null,
     "scope": ["8d5f...", "rg-app", "web"], "ids": {"web_2": ["/subscriptions/..."]},
     "resource_id": "/subscriptions/8d5f.../resourceGroups/rg-app/providers/Microsoft.Compute/
     virtualMachineScaleSets/web"}

    `status` is Scheduled, Started, Completed or Canceled; an end is final. `ids`: the full
    resource ids each name of Resources may be (the delivery's resource id and the name).
    """

    status: str
    at: str
    scope: list[str | None]
    ids: dict[str, list[str]]
    resource_id: str  # the scale set's, availability set's or VM's id, as Azure sent it


ENDED = ("Completed", "Canceled")


class EventDocument(Told, total=False):
    """`event/<eventid>`: an event as the VMs report it. A sample:

    {"event_id": "C7061BAC-...", "first_seen": "2026-11-21T10:00:00.000Z",
     "updated": "2026-11-21T10:00:05.000Z", "event_type": "Reboot", "event_source": "User",
     "duration": -1, "resources": ["web_0"], "not_before": "2026-11-21T10:15:00.000Z",
     "incarnation": 3, "reporters": {"1b1f...": {"status": "Scheduled",
     "at": "2026-11-21T10:00:05.000Z"}}, "ready": ["1b1f..."],
     "decision": {"kind": "Approve", "rule": "user-initiated", "reason": "..."}}
    """

    event_id: str | None
    first_seen: str
    reporters: dict[str, Reporter]  # by VmId, or host:NAME before the VM knows its VmId
    # The fields of Told as each scope's VMs give them, by `told_key` of the reporter's scope: a
    # VM of another scope claiming the event (the newest record) does not change what the VMs
    # that can see it say (event_view).
    told: dict[str, Told]
    ready: list[str]  # VmIds whose prepare hook succeeded
    # By VmId, of an agent with more than one prepare step (PrepareSteps): the steps whose
    # latest record succeeded; it is ready once they are all of them.
    prepared: dict[str, list[str]]
    drains: dict[str, DrainNote]  # by VmId: its drain for the event, as last reported
    decision: StandingDecision  # the standing decision, said once
    heard: str  # the consumer's clock when a record last changed the event (staleness)
    released: str  # the consumer's clock when its budget slot was released (all VMs gone)
    asked: Asked  # when the consumer first asked a person about it (an `ask` rule)
    azure: AzureView  # the event as Event Grid tells it (the second source, issue 36)
    # A Spot rebalance recommendation (Advisory records), not an event: never approved
    # (bridge.policy.gates.rebalance); a reporter's status is Scheduled while it is Raised.
    advisory: bool


class Asked(TypedDict):
    """An event document's `asked`: {"at": "2026-11-21T10:00:00.000Z", "target": "dba"}."""

    at: str
    target: str


def vm_document(doc: Doc) -> VmDocument:
    return cast(VmDocument, doc.value)


def event_document(doc: Doc) -> EventDocument:
    return cast(EventDocument, doc.value)


# The collections and the `tables` store's spread of them: the state's layout, defined there.
VM, EVENT, LEDGER = layout.VM, layout.EVENT, layout.LEDGER
HEALTH = layout.HEALTH
UNHEALTHY = ("Unavailable", "Degraded")
PARTITIONS = layout.PARTITIONS
# The one ledger document of releases before the shards; moved into them when found.
LEGACY_LEDGER_KEY = "approvals"
GONE = "Gone"

_IDENTITY = {
    "name": "VmName",
    "subscription_id": "SubscriptionId",
    "resource_group": "ResourceGroup",
    "location": "Location",
    "zone": "Zone",
    "scale_set": "VmScaleSetName",
    "fault_domain": "PlatformFaultDomain",
    "update_domain": "PlatformUpdateDomain",
}


class HealthDocument(TypedDict, total=False):
    """`health/<id>`: a VM as resource health last reported it (issue 36). A sample:

    {"resource_id": "/subscriptions/8d5f.../resourcegroups/rg-app/providers/microsoft.compute/
     virtualmachinescalesets/web/virtualmachines/2", "name": "web_2",
     "scope": ["8d5f...", "rg-app", "web"], "state": "Unavailable",
     "since": "2026-11-21T10:02:00.000Z", "at": "2026-11-21T10:02:00.000Z"}

    `since`: when it last became what it is (the first of a run of Unavailable and Degraded).
    """

    resource_id: str
    name: str
    scope: list[str | None]
    state: str
    since: str
    at: str


def health_key(resource_id: str) -> str:
    """The health document's key: a name Table Storage takes (a resource id has slashes)."""
    return record_id("health", resource_id.lower())


def merge_health(value: HealthDocument, resource: Resource, state: str, at: str) -> bool:
    """Fold one health change in; only a newer one changes anything."""
    if at <= value.get("at", ""):
        return False
    was = value.get("state")
    if was is None or (was in UNHEALTHY) != (state in UNHEALTHY):
        value["since"] = at
    value["resource_id"], value["name"] = resource.id.lower(), str(resource.vm_name)
    value["state"], value["at"] = state, at
    value["scope"] = [
        resource.subscription,
        resource.resource_group,
        (resource.scale_set or "").lower() or None,
    ]
    return True


def event_key(event_id: str) -> str:
    return event_id.strip().lower()


# --- VMs -------------------------------------------------------------------------------

# Record fields whose values are whole numbers; every other field folded here is text (or a
# list of text, Resources). A record is outside input: a field of another type is taken as
# absent rather than stored, where it would break the policy and the budgets later.
_WHOLE_FIELDS = frozenset(
    {"PlatformFaultDomain", "PlatformUpdateDomain", "DurationInSeconds", "DocumentIncarnation"}
)
# The identity fields, each with whether it is a whole number (else text): looked up once.
_IDENTITY_ITEMS = tuple((key, field, field in _WHOLE_FIELDS) for key, field in _IDENTITY.items())


def field_of(record: RecordView, name: str) -> Any:
    """`record[name]` if it has the type the schema gives it, else None."""
    value = record.get(name)
    if name == "Resources":
        return [v for v in value if isinstance(v, str)] if isinstance(value, list) else None
    if name in _WHOLE_FIELDS:
        return value if _whole(value) else None
    return value if isinstance(value, str) else None


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def merge_vm(
    value: VmDocument, record: RecordView, heard: str = "", partition: str | None = None
) -> bool:
    """Fold one record's identity into a VM document; True when something worth saving changed.

    `heard`: the consumer's clock now (ISO), kept as when the VM was last heard from;
    `partition`: where the record was read (None: the caller reads no partition).
    """
    seen = record.get("TimeGenerated")
    # Only a newer record changes anything, and it always moves last_seen: changed.
    if not isinstance(seen, str) or seen <= value.get("last_seen", ""):
        return False
    value["last_seen"] = seen
    if heard:
        value["heard"] = max(heard, value.get("heard", ""))
    if partition is not None:
        value["partition"] = partition
    fields = cast(dict[str, Any], value)
    for key, field, whole in _IDENTITY_ITEMS:  # field_of inlined: this runs for every record
        given = record.get(field)
        if (
            (isinstance(given, int) and not isinstance(given, bool))
            if whole
            else isinstance(given, str)
        ):
            fields[key] = given
    _merge_resource_id(fields, record)
    heartbeat, tags = record.get(RECORD_TYPE) == "Heartbeat", record.get("Tags")
    if heartbeat and isinstance(tags, dict):
        value["tags"] = {str(k): str(v) for k, v in tags.items()}
    if heartbeat:
        # An agent from before HasPrepareHook (perhaps one that replaced a newer agent)
        # does not say: what another once said no longer holds.
        hook = record.get("HasPrepareHook")
        if isinstance(hook, bool):
            value["prepare_hook"] = hook
        else:
            value.pop("prepare_hook", None)
    if heartbeat:
        _merge_node(fields, record)
    if heartbeat and record.get("HeartbeatReason") == "Stop":
        value["stopped"] = seen
    elif value.get("stopped"):
        value.pop("stopped")
    return True


def _merge_resource_id(fields: dict[str, Any], record: RecordView) -> None:
    resource_id = record.get("ResourceId")
    if isinstance(resource_id, str) and resource_id:
        fields["resource_id"] = resource_id.lower()


_NODE = (
    ("node_name", "NodeName", str),
    ("node_pool", "NodePool", str),
    ("node_draining", "NodeDraining", str),
    ("node_cordoned", "NodeCordoned", bool),
)


# What an agent says of its node only once it has read it: its first heartbeats after a start
# name the node and leave these null. Dropped then, a restart would take the node out of its
# pool's budget group (and forget someone else's cordon) until the agent reads the node.
_READ_LATER = ("node_pool", "node_cordoned")


def _merge_node(fields: dict[str, Any], record: RecordView) -> None:
    """The node fields as the heartbeat says them: a field it leaves out or says null (an
    agent without [kubernetes], or from before it) no longer holds, except the pool and the
    cordon of the node it named before, which it has not read yet."""
    same_node = fields.get("node_name") is not None and record.get("NodeName") == fields.get(
        "node_name"
    )
    for key, field, kind in _NODE:
        given = record.get(field)
        if isinstance(given, kind) and given != "":
            fields[key] = given
        elif not (same_node and key in _READ_LATER):
            fields.pop(key, None)


def vm_view(vm_id: str, value: VmDocument) -> VmView:
    # A VM whose agent said goodbye is not alive, however recent its last record; alive is
    # measured on the consumer's clock (heard), the VM's own only for older documents.
    heard = value.get("heard") or value.get("last_seen")
    last_seen = None if value.get("stopped") else parse_time(heard)
    # Made as VmView's __init__ makes it, every field given, without its frozen __init__
    # (a setattr through object for each of 18 fields): a view is made for every heartbeat
    # folded, and its __init__ was most of that (issue 40: a replay of a million records).
    # tests/unit/consumer/test_vm_view.py holds it to every field VmView has, and no other.
    view: VmView = _new(VmView)
    view.__dict__.update(
        vm_id=vm_id,
        name=str(value.get("name") or vm_id),
        subscription_id=value.get("subscription_id"),
        resource_group=value.get("resource_group"),
        location=value.get("location"),
        zone=value.get("zone"),
        scale_set=value.get("scale_set"),
        fault_domain=value.get("fault_domain"),
        update_domain=value.get("update_domain"),
        tags=dict(value.get("tags") or {}),
        last_seen=last_seen,
        prepare_hook=value.get("prepare_hook"),
        partition=value.get("partition"),
        node_name=value.get("node_name"),
        node_pool=value.get("node_pool"),
        cordoned=value.get("node_cordoned") is True,
        held=value.get("node_draining") or None,
        resource_id=value.get("resource_id"),
    )
    return view


_new = object.__new__


# --- events ----------------------------------------------------------------------------

_EVENT_FIELDS = {
    "event_type": "EventType",
    "event_source": "EventSource",
    "duration": "DurationInSeconds",
    "resources": "Resources",
    "not_before": "NotBefore",
    "incarnation": "DocumentIncarnation",
}


def merge_event(value: EventDocument, record: RecordView, heard: str = "") -> bool:
    """Fold an Event, Hook or Advisory record into an event document; True when it changed.

    `heard`: the consumer's clock now (ISO), kept when the record changed the event.
    """
    before = repr(value)
    if record.get(RECORD_TYPE) == "Event":
        if is_recommendation(record.get("EventType")):
            # An agent with agent.spot_rebalance off, should its api-version list one: an
            # advisory all the same, never approved.
            value["advisory"] = True
        _merge_event_record(value, record)
    elif record.get(RECORD_TYPE) == "Hook":
        _merge_hook_record(value, record)
    elif record.get(RECORD_TYPE) == "Advisory":
        _merge_advisory_record(value, record)
    changed = repr(value) != before
    if changed and heard:
        value["heard"] = max(heard, value.get("heard", ""))
    return changed


def _merge_event_record(value: EventDocument, record: RecordView) -> None:
    if record.get("Source") == "EventGrid":
        _merge_azure(value, record)
        return
    vm_id, seen = record.get("VmId"), field_of(record, "TimeGenerated") or ""
    value.setdefault("event_id", field_of(record, "EventId"))
    value.setdefault("first_seen", seen)
    value["first_seen"] = min(value["first_seen"], seen) if seen else value["first_seen"]
    told = value.setdefault("told", {}).setdefault(told_key(_record_scope(record)), {})
    for fields in (cast(dict[str, Any], value), cast(dict[str, Any], told)):
        if seen >= fields.get("updated", ""):
            fields["updated"] = seen
            for key, field in _EVENT_FIELDS.items():
                if field_of(record, field) is not None or key not in fields:
                    fields[key] = field_of(record, field)
    host = field_of(record, "HostName")
    # Before an agent knows its VmId (instance metadata failing since its first start) its
    # records name only the host: counted under "host:NAME", as its sinks key them, so that
    # the event's end is not lost; dropped once the same host reports with its VmId.
    host_key = f"host:{host}" if isinstance(host, str) and host else None
    who = vm_id if isinstance(vm_id, str) else host_key
    if who is None:
        return
    reporters = value.setdefault("reporters", {})
    if who == vm_id and host_key is not None:
        reporters.pop(host_key, None)
    mine = reporters.get(who)
    if mine is None or seen >= mine["at"]:
        reporters[who] = {
            "status": field_of(record, "EventStatus") or GONE,
            "at": seen,
            "told": told_key(_record_scope(record)),
        }
    _forget_untold(value)


def _merge_azure(value: EventDocument, record: RecordView) -> None:
    """Fold an Event Grid record into the event's `azure` view. Its status only moves
    forward in time, and an end (Completed, Canceled) is final: a late Started does not
    bring an event back. Until an agent reports the event, its fields are the document's."""
    seen = field_of(record, "TimeGenerated") or ""
    value.setdefault("event_id", field_of(record, "EventId"))
    value["first_seen"] = min(value.get("first_seen") or seen, seen)
    azure = value.get("azure")
    status = str(field_of(record, "Transition"))
    if azure is not None and (azure.get("status") in ENDED or seen < azure.get("at", "")):
        return
    fields: dict[str, Any] = {key: field_of(record, name) for key, name in _EVENT_FIELDS.items()}
    fields.pop("incarnation")
    if status in ENDED and azure is not None:  # an end names no NotBefore; keep what it named
        fields = {
            **{k: v for k, v in azure.items() if k in fields},
            **{k: v for k, v in fields.items() if v is not None},
        }
    scope = _record_scope(record)
    names = fields.get("resources") or []
    resource = _azure_resource(record)
    ids = {n: list(resource.vm_ids(n)) for n in names} if resource else {}
    view = cast(
        AzureView,
        {**fields, "status": status, "at": seen, "updated": seen, "scope": list(scope), "ids": ids},
    )
    if resource is not None:  # what ARM's acknowledge is addressed to (bridge.consumer.armcarrier)
        view["resource_id"] = resource.id
    value["azure"] = view
    if not value.get("reporters"):
        for key in fields:
            cast(dict[str, Any], value)[key] = fields[key]
        value["updated"] = seen


def _azure_resource(record: RecordView) -> Resource | None:
    return resource_of(record.get("ResourceId"))


def _forget_untold(value: EventDocument) -> None:
    """Keep `told` only for the scopes some reporter's newest record gives: one entry per
    reporting VM at most. A VM whose records name a new ResourceGroup each time (free text a
    compromised VM chooses) added an entry per record, up to 64 KiB each, until the document
    could not be written and every batch of its partition failed (issue 27 review)."""
    kept = {r.get("told") for r in value.get("reporters", {}).values()}
    if None in kept:  # a reporter of an earlier release: its scope is not known here
        return
    told = value.get("told", {})
    if told.keys() - kept:
        value["told"] = {key: fields for key, fields in told.items() if key in kept}


def told_key(scope: Scope) -> str:
    """The key of a scope in EventDocument.told."""
    return "/".join(part or "" for part in scope)


def _record_scope(record: RecordView) -> Scope:
    """The scope of the VM that wrote `record`, as its identity fields give it (`scope_of`)."""
    group, scale_set = field_of(record, "ResourceGroup"), field_of(record, "VmScaleSetName")
    return (
        field_of(record, "SubscriptionId"),
        (group or "").lower() or None,
        (scale_set or "").lower() or None,
    )


def _merge_advisory_record(value: EventDocument, record: RecordView) -> None:
    """A recommendation as its reporter tells it: Scheduled while Raised, Gone once Cleared.
    One that names no VM (Azure's only public sample names none) is its reporter's own, as
    the agent takes it (AffectsThisVm null)."""
    value["advisory"] = True
    named = field_of(record, "Resources") or []
    own = field_of(record, "VmName")
    if not named and record.get("AffectsThisVm") is not False and own:
        named = [own]
    raised = record.get("AdvisoryState") == "Raised"
    status = "Scheduled" if raised else None
    # Event Grid's view reads its status from Transition (bridge.consumer.sources.eventgrid).
    told = {**record, "Resources": named, "EventStatus": status}
    if record.get("Source") == "EventGrid":
        told["Transition"] = "Scheduled" if raised else "Completed"
    _merge_event_record(value, told)


def _merge_hook_record(value: EventDocument, record: RecordView) -> None:
    vm_id = record.get("VmId")
    drain = record.get("HookName") == "drain"
    # A drain that gave up with on_deadline approve timed out and is ready all the same: the
    # agent says so with exit code 0 (docs/contracts.md).
    succeeded = record.get("HookExitCode") == 0 and (drain or not record.get("HookTimedOut"))
    prepare = record.get("HookPhase") == "prepare"
    if prepare and isinstance(vm_id, str) and _prepared(value, vm_id, record, succeeded):
        ready = set(value.get("ready", []))
        ready.add(vm_id)
        value["ready"] = sorted(ready)
    if prepare and drain and isinstance(vm_id, str):
        note = merged_drain(value.get("drains", {}).get(vm_id), record)
        if note is not None:
            value.setdefault("drains", {})[vm_id] = note
    value.setdefault("event_id", field_of(record, "EventId"))


def _prepared(value: EventDocument, vm_id: str, record: RecordView, succeeded: bool) -> bool:
    """Whether this prepare record makes `vm_id` ready: it succeeded, and so did each other
    prepare step its agent names (PrepareSteps: the drain, then the hook). An agent with one
    step, or from before PrepareSteps, is ready on one success."""
    steps = record.get("PrepareSteps")
    if not isinstance(steps, list) or len(steps) < 2:
        return succeeded
    step = "drain" if record.get("HookName") == "drain" else "hook"
    prepared = value.setdefault("prepared", {})
    done = set(prepared.get(vm_id, []))
    if succeeded:
        done.add(step)
    else:
        done.discard(step)
    prepared[vm_id] = sorted(done)
    return succeeded and done >= {str(s) for s in steps}


def status(value: EventDocument, among: Collection[str] | None = None) -> str:
    """The event's status across its reporters (those of `among` only, when given): Started
    wins, then Scheduled, else Gone.

    With Event Grid's view (`azure`): an end from either source ends it (Completed or
    Canceled from Azure; every agent that can see it reporting it gone); otherwise Started
    from either wins, and an event no agent reports has Azure's status."""
    reports = value.get("reporters", {})
    seen = {r["status"] for v, r in reports.items() if among is None or v in among}
    azure = value.get("azure")
    if azure is not None:
        if azure.get("status") in ENDED or (seen and seen <= {GONE}):
            return GONE
        seen.add(str(azure.get("status")))
    for candidate in ("Started", "Scheduled"):
        if candidate in seen:
            return candidate
    return GONE


def active_reporters(value: EventDocument, among: Collection[str] | None = None) -> tuple[str, ...]:
    reports = value.get("reporters", {}).items()
    active = (v for v, r in reports if r["status"] != GONE and (among is None or v in among))
    return tuple(sorted(active))


@dataclass(frozen=True)
class Resolved:
    """Resources as VmIds: `affected` resolved; `unresolved` names, of which `possible` holds
    every VmId an ambiguous name may be (what budgets count for it)."""

    affected: tuple[str, ...]
    unresolved: tuple[str, ...]
    possible: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()  # the unresolved names no VM in the scopes has


@dataclass(frozen=True)
class Names:
    """VM names to VmIds, in the scope the platform gives a name (`scope_of`).

    Resources lists names; budgets count VmIds. Azure keeps a VM name unique in its resource
    group (a scale set's instances in their scale set), so within one scope a name is one VM:
    the one heard from last (a VM deleted and created again under its name is two VmIds).
    Across scopes the same name is several VMs, and an event names VMs of the scope of the
    VMs that report it. A name with no scope to narrow it, or found in several of the
    reporters' scopes, is ambiguous: unresolved, failing closed.
    """

    index: Mapping[tuple[Scope, str], str]  # (scope, vm_key(name)) -> VmId
    scopes: Mapping[str, tuple[Scope, ...]]  # vm_key(name) -> the scopes that have it
    # VmId -> its scope, of every VM it was made from: an event's reporters are looked up
    # at each decision, hundreds where a placement group reports each event.
    where: Mapping[str, Scope]
    # A VM's full resource id (lower case) -> its VmId: how Event Grid's names resolve first.
    by_id: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, vms: Iterable[VmView]) -> Names:
        newest: dict[tuple[Scope, str], VmView] = {}
        where: dict[str, Scope] = {}
        for vm in vms:
            where[vm.vm_id] = scope = scope_of(vm)
            key = (scope, vm_key(vm.name))
            held = newest.get(key)
            if held is None or _heard_later(vm, held):
                newest[key] = vm
        scopes: dict[str, list[Scope]] = {}
        for scope, name in newest:
            scopes.setdefault(name, []).append(scope)
        index = {key: vm.vm_id for key, vm in newest.items()}
        by_id = {vm.resource_id: vm.vm_id for vm in newest.values() if vm.resource_id}
        return cls(index, {name: tuple(found) for name, found in scopes.items()}, where, by_id)

    def resolve(
        self,
        names: Iterable[str],
        scopes: Iterable[Scope],
        ids: Mapping[str, Sequence[str]] | None = None,
    ) -> Resolved:
        """`names` in the reporters' `scopes` (none known: in any scope); a name of `ids`
        (by vm_key: the full resource ids Event Grid's delivery makes of it) is the VM of
        that id first, whatever its scope."""
        within = set(scopes)
        affected: list[str] = []
        unresolved: list[str] = []
        possible: set[str] = set()
        unknown: list[str] = []
        for name in names:
            key = vm_key(name)
            by_id = [self.by_id[i] for i in (ids or {}).get(key, ()) if i in self.by_id]
            if by_id:
                affected.append(by_id[0])
                continue
            found = self.scopes.get(key, ())
            candidates = [self.index[(s, key)] for s in found if not within or s in within]
            if len(candidates) == 1:
                affected.append(candidates[0])
                continue
            unresolved.append(name)
            possible.update(candidates)
            if not candidates:
                unknown.append(name)
        return Resolved(tuple(affected), tuple(unresolved), tuple(sorted(possible)), tuple(unknown))

    def witnesses(
        self, told: Mapping[Scope, Iterable[str]], reporters: Mapping[str, Scope | None]
    ) -> tuple[frozenset[str], tuple[Scope, ...]]:
        """Of an event, the reporters (by key, with their scopes, None where not known) that
        Azure can have shown it to, and their scopes; `told`: the names each scope's VMs
        give in Resources.

        Azure shows an event to the VMs of the scope of the VMs it names: a reporter counts
        unless its scope names known VMs of other scopes only, while some scope names VMs of
        its own. A scope whose names no known VM has (an availability set or scale set whose
        named VMs have no agent yet) may be the event's, so it counts; when no scope names
        VMs of its own, nothing tells which is the event's, and every reporter counts. So a
        VM of another scope that claims a known VM's event (one compromised VM, or a
        misrouted record) changes neither its fields nor how its names resolve, nor its
        status, nor when its slot is released; one that names itself or an unknown name adds
        to what counts and can take nothing away (the worst case of the scopes' words); a
        reporter whose scope is not known yet counts (fail closed).
        """
        scopes = {scope for scope in reporters.values() if scope is not None}
        seeing = {
            scope
            for scope in scopes
            if any((scope, vm_key(name)) in self.index for name in told.get(scope, ()))
        }
        # Only a scope that names known VMs of other scopes and none of its own is left out:
        # Azure names VMs of the reporter's own set. A scope whose names no VM is known by
        # may be the event's own (its named VMs have no agent yet): it keeps counting, or a
        # VM of another scope naming itself would become the event's only witness, and its
        # word (Completed, Scheduled) would free the slot of a VM that may be down.
        foreign = {
            scope
            for scope in scopes - seeing
            if any(vm_key(name) in self.scopes for name in told.get(scope, ()))
        }
        within = scopes - foreign if seeing else scopes
        counted = frozenset(r for r, scope in reporters.items() if scope is None or scope in within)
        return counted, tuple(sorted(within, key=repr))


def _heard_later(vm: VmView, other: VmView) -> bool:
    if vm.last_seen is None or other.last_seen is None:
        return other.last_seen is None and vm.vm_id > other.vm_id
    return (vm.last_seen, vm.vm_id) > (other.last_seen, other.vm_id)


def event_view(
    value: EventDocument,
    vms: Mapping[str, VmView],
    names: Names,
    tried: tuple[str, ...],
    now: datetime,
    *,
    unknown_for: timedelta | None = None,
) -> EventView:
    """The event as the policy sees it: as the reporters that can see it tell it
    (`Names.witnesses`, `_agreed`), and as Event Grid tells it (`azure`), the worse of the
    two where they differ (`_agreed` again: every name of either, the earliest NotBefore);
    a name no VM of their scopes has counts until `unknown_for` has passed since the event
    was first seen (None: for as long as the event counts), or for as long as Azure says
    the event is on."""
    reports = value.get("reporters", {})
    scope_by = {r: names.where.get(r) or (scope_of(vms[r]) if r in vms else None) for r in reports}
    told = _told(value, {s for s in scope_by.values() if s is not None})
    names_told = {scope: told_of.get("resources") or [] for scope, told_of in told.items()}
    seen_by, scopes = names.witnesses(names_told, scope_by)
    agents = _agreed([told[s] for s in scopes if s in told]) if told else None
    if agents is None and reports:
        agents = value
    azure = value.get("azure")
    fields = _agreed([f for f in (agents, azure) if f is not None]) or value
    resources = fields.get("resources") or []
    if azure is not None:
        scopes = tuple(dict.fromkeys((*scopes, _azure_scope(azure))))
    resolved = names.resolve(resources, scopes, _ids(azure))
    first_seen = parse_time(value.get("first_seen")) or now
    vouched = azure is not None and azure.get("status") not in ENDED
    over = unknown_for is not None and now - first_seen >= unknown_for and not vouched
    said = status(value, seen_by)
    not_before = parse_time(fields.get("not_before"))
    azure_only = azure is not None and not reports
    if said == "Scheduled" and azure_only and not_before is not None and not_before <= now:
        # Azure starts an event at NotBefore, approved or not, and Event Grid's Started may
        # come minutes later: an event no agent watches counts as started from then on.
        said = "Started"
    return EventView(
        event_id=str(value.get("event_id")),
        event_type=str(fields.get("event_type") or ""),
        event_source=fields.get("event_source"),
        duration=fields.get("duration"),
        status=said,
        not_before=not_before,
        first_seen=first_seen,
        affected=resolved.affected,
        unresolved=resolved.unresolved,
        possible=resolved.possible,
        unknown=() if over else resolved.unknown,
        lapsed=resolved.unknown if over else (),
        scopes=scopes,
        resources=tuple(resources),
        reporters=active_reporters(value, seen_by),
        ready=frozenset(value.get("ready", [])),
        tried=tried,
        asked_at=parse_time(value.get("asked", {}).get("at")),
        drains=drain_views(value.get("drains")),
        disagreements=disagreements(agents, azure, said if reports else None),
        azure=None if azure is None else str(azure.get("status")),
        advisory=bool(value.get("advisory")),
    )


def _azure_scope(azure: AzureView) -> Scope:
    return scope_from(azure.get("scope"))


def scope_from(stored: object) -> Scope:
    """A scope as a document stores it (a list of three), or one that says nothing."""
    parts = [p if isinstance(p, str) else None for p in stored] if isinstance(stored, list) else []
    sub, group, scale_set = [*parts, None, None, None][:3]
    return (sub, group, scale_set)


def _ids(azure: AzureView | None) -> Mapping[str, Sequence[str]]:
    """Of Event Grid's view, the full ids each name may be, by vm_key."""
    if azure is None:
        return {}
    return {vm_key(name): ids for name, ids in (azure.get("ids") or {}).items()}


def disagreements(
    agents: Told | None, azure: AzureView | None, agents_status: str | None
) -> tuple[str, ...]:
    """Where what the agents report of an event and what Event Grid tells of it differ, a
    sentence each (`policy explain` says them; the second source's intake counts them)."""
    if agents is None or azure is None:
        return ()
    said: list[str] = []
    for key, label in (
        ("event_type", "EventType"),
        ("event_source", "EventSource"),
        ("duration", "DurationInSeconds"),
        ("not_before", "NotBefore"),
    ):
        mine, theirs = agents.get(key), azure.get(key)
        if mine is not None and theirs is not None and mine != theirs:
            said.append(f"{label}: Event Grid says {theirs}, the agents say {mine}")
    ours = {vm_key(n): n for n in agents.get("resources") or []}
    azures = {vm_key(n): n for n in azure.get("resources") or []}
    if ours.keys() != azures.keys():
        only_azure = sorted(azures[k] for k in azures.keys() - ours.keys())
        only_ours = sorted(ours[k] for k in ours.keys() - azures.keys())
        parts = [f"Event Grid alone names {', '.join(only_azure)}"] if only_azure else []
        parts += [f"the agents alone name {', '.join(only_ours)}"] if only_ours else []
        said.append(f"Resources: {'; '.join(parts)} (every name counts)")
    theirs_status = str(azure.get("status"))
    ended_here = agents_status == GONE
    if agents_status is not None and (theirs_status in ENDED) != ended_here:
        ours_said = "gone" if ended_here else agents_status
        said.append(
            f"EventStatus: Event Grid says {theirs_status}, the agents say {ours_said} "
            "(an end from either ends it)"
        )
    return tuple(said)


def stored_disagreements(value: EventDocument) -> tuple[str, ...]:
    """`disagreements` of an event document as stored, the agents' scopes taken together
    (what the intake counts; `event_view` says them for the scopes that can see it)."""
    told = list((value.get("told") or {}).values())
    agents = _agreed(told) if told else None
    reported = bool(value.get("reporters"))
    return disagreements(agents, value.get("azure"), status(value) if reported else None)


def disagreement_fields(lines: Iterable[str]) -> list[str]:
    """The fields `disagreements` names (the metric's label)."""
    return [line.partition(":")[0] for line in lines]


def _told(value: EventDocument, scopes: Iterable[Scope]) -> dict[Scope, Told]:
    """What each of `scopes` told of the event (a document of an earlier release has no
    `told`: its fields, for each)."""
    told = value.get("told")
    if told is None:
        return dict.fromkeys(scopes, value)
    return {scope: told[told_key(scope)] for scope in scopes if told_key(scope) in told}


def _agreed(views: Sequence[Told]) -> Told | None:
    """The fields the scopes of `views` agree on; where they differ (two scopes each have a
    VM of the name, and one tells it otherwise), the worst case: no EventType, EventSource
    or DurationInSeconds (no rule with a condition on them matches), the earliest NotBefore
    and every name of any. None when there is no view."""
    if not views:
        return None
    if len(views) == 1:
        return views[0]
    agreed: Told = {}
    plain = [cast(dict[str, Any], view) for view in views]
    for key in ("event_type", "event_source", "duration", "incarnation"):
        if len({repr(view.get(key)) for view in plain}) == 1:
            cast(dict[str, Any], agreed)[key] = plain[0].get(key)
    due = [str(view["not_before"]) for view in views if view.get("not_before")]
    agreed["not_before"] = min(due) if due else None
    names = dict.fromkeys(str(n) for view in views for n in view.get("resources") or [])
    agreed["resources"] = list(names)
    return agreed


def is_stale(value: EventDocument, now: datetime, stale_after: timedelta) -> bool:
    """No record has changed the event for `stale_after`, on the consumer's clock."""
    heard = value.get("heard") or value.get("updated")
    updated = parse_time(heard) or parse_time(value.get("first_seen"))
    return updated is not None and now - updated > stale_after


def urgency(doc: Doc) -> tuple[bool, str, str, str]:
    """Sort key: what already impacts VMs is counted before anything is approved."""
    value = event_document(doc)
    due = str(value.get("not_before") or "~")
    return (status(value) == "Scheduled", due, str(value.get("first_seen") or ""), doc.key)
