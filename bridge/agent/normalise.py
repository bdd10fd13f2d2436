"""The normaliser: previous state + new document + now + identity -> records + new state.

Pure: no I/O, no clock. The state is a JSON-able dict so the agent can persist it in
the same transaction as the records it produced (a crash loses neither or both).

Events are diffed by EventId, never by incarnation: the incarnation may skip, and it
starts over after IMDS's 24-hour switch-off.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypedDict, cast

from bridge import recordtypes as rt
from bridge.agent.document import (
    EVENT_FIELDS,
    DocumentError,
    ParsedDocument,
    ParsedEvent,
    is_started,
    parse_document,
)
from bridge.imdstime import parse_time
from bridge.records import Origin, iso, vm_key

# Event types after which a vanished, still-Scheduled event must have run if the VM rebooted.
REBOOTING_TYPES = frozenset({"reboot", "redeploy", "preempt", "terminate"})
DEFAULT_GAP = timedelta(seconds=90)


@dataclass(frozen=True)
class Context:
    """What the agent knows besides the document, for this one observation."""

    now: datetime
    origin: Origin
    boot_id: str | None = None
    # Longer than this since the last observation means the agent was not watching.
    gap: timedelta = DEFAULT_GAP


class SavedEvent(TypedDict):
    """One event as the normaliser keeps it between observations: the IMDS fields (as the
    document gave them, or the last known value where a document is silent) and what the
    agent derived. A sample, from the seeds' live-migration documents:

        {"EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123", "EventType": "Freeze",
         "ResourceType": "VirtualMachine", "Resources": ["WestNO_0", "WestNO_1"],
         "EventStatus": "Scheduled", "NotBeforeRaw": "Mon, 11 Apr 2022 22:26:58 GMT",
         "Description": "Virtual machine is being paused because of a memory-preserving
         Live Migration operation.", "EventSource": "Platform", "DurationInSeconds": 5,
         "NotBefore": "2022-04-11T22:26:58.000Z", "AffectsThisVm": true,
         "FirstSeen": "2022-04-11T22:10:01.000Z"}
    """

    EventId: str
    EventType: Any
    ResourceType: Any
    Resources: list[str]
    EventStatus: Any  # None once the event is gone (the Completed or Canceled record)
    NotBeforeRaw: Any
    Description: Any
    EventSource: Any
    DurationInSeconds: Any
    NotBefore: str | None
    AffectsThisVm: bool | None
    FirstSeen: str


class NormaliserState(TypedDict):
    """What the normaliser hands from one observation to the next, kept in the spool under
    bridge.outbox.spool.StateKey.NORMALISER. A sample:

        {"incarnation": 3, "observed_at": "2022-04-11T22:10:01.000Z", "boot_id": "5c1e0f...",
         "events": {"c7061bac-afdc-4513-b24b-aa5f13a16123": {...a SavedEvent...}}}
    """

    incarnation: int | None
    observed_at: str | None
    boot_id: str | None
    events: dict[str, SavedEvent]


@dataclass(frozen=True)
class Result:
    records: list[rt.Event]
    state: NormaliserState
    problems: list[str] = field(default_factory=list)


def empty_state() -> NormaliserState:
    return {"incarnation": None, "observed_at": None, "boot_id": None, "events": {}}


def normalise(previous: Mapping[str, Any] | None, raw: object, ctx: Context) -> Result:
    """Diff the decoded IMDS body `raw` against `previous`. Never raises on any input."""
    prev, problems = _checked_state(previous)
    try:
        doc = parse_document(raw)
    except DocumentError as err:
        return Result([], prev, [*problems, f"not a Scheduled Events document: {err}"])
    result = _diff(prev, doc, ctx)
    return Result(result.records, result.state, problems + result.problems)


def restore(saved: object) -> tuple[NormaliserState | None, list[str]]:
    """The state the spool kept, checked as `normalise` checks it (None: nothing was kept),
    and what had to be dropped from it."""
    return (None, []) if saved is None else _checked_state(saved)


_STORED_FIELDS = (*EVENT_FIELDS, "EventId", "NotBefore", "AffectsThisVm", "FirstSeen")


def _checked_state(state: object) -> tuple[NormaliserState, list[str]]:
    """The persisted state, minus anything an older version or a damaged file left malformed."""
    if state is None:
        return empty_state(), []
    if not isinstance(state, dict) or not isinstance(state.get("events"), dict):
        return empty_state(), ["ignored a malformed saved state; starting from an empty one"]
    events: dict[str, SavedEvent] = {
        k: cast(SavedEvent, v)
        for k, v in state["events"].items()
        if isinstance(v, dict)
        and all(f in v for f in _STORED_FIELDS)
        and isinstance(v["EventId"], str)
        and isinstance(v["Resources"], list)
    }
    dropped = len(state["events"]) - len(events)
    problems = [f"ignored {dropped} malformed event(s) in the saved state"] if dropped else []
    incarnation, observed, boot = (state.get(k) for k in ("incarnation", "observed_at", "boot_id"))
    checked: NormaliserState = {
        "incarnation": incarnation if isinstance(incarnation, int) else None,
        "observed_at": observed if isinstance(observed, str) else None,
        "boot_id": boot if isinstance(boot, str) else None,
        "events": events,
    }
    return checked, problems


def _diff(prev: NormaliserState, doc: ParsedDocument, ctx: Context) -> Result:
    watch = _Watch.of(prev, doc, ctx)
    old = prev["events"]
    records: list[rt.Event] = []
    events: dict[str, SavedEvent] = {}
    for parsed in doc.events:
        current = _merge(old.get(parsed.key), parsed, ctx)
        events[parsed.key] = current
        record = _change(old.get(parsed.key), current, watch, ctx)
        if record is not None:
            records.append(record)
    for key, gone in old.items():
        if key not in events:
            records.append(_vanished(gone, watch, ctx))
    state: NormaliserState = {
        "incarnation": doc.incarnation,
        "observed_at": iso(ctx.now),
        "boot_id": ctx.boot_id if ctx.boot_id is not None else prev["boot_id"],
        "events": events,
    }
    return Result(records, state, list(doc.problems))


@dataclass(frozen=True)
class _Watch:
    """How continuously the agent watched between the previous observation and this one."""

    incarnation: int
    previous_incarnation: int | None
    gap: bool
    skipped: bool
    rebooted: bool

    @classmethod
    def of(cls, prev: NormaliserState, doc: ParsedDocument, ctx: Context) -> _Watch:
        last = parse_time(prev["observed_at"])
        prev_inc = prev["incarnation"]
        old_boot = prev["boot_id"]
        return cls(
            incarnation=doc.incarnation,
            previous_incarnation=prev_inc,
            gap=last is not None and ctx.now - last > ctx.gap,
            skipped=prev_inc is not None and doc.incarnation > prev_inc + 1,
            rebooted=bool(old_boot and ctx.boot_id and old_boot != ctx.boot_id),
        )


def _merge(old: SavedEvent | None, parsed: ParsedEvent, ctx: Context) -> SavedEvent:
    """The event's fields now: what the document says, the last known value where it is silent."""
    fields: dict[str, Any] = dict.fromkeys(EVENT_FIELDS)
    fields["Resources"] = []
    if old is not None:
        fields.update({k: v for k, v in old.items() if k in EVENT_FIELDS})
    fields.update(parsed.present)
    not_before = parse_time(fields["NotBeforeRaw"])
    return {
        "EventId": parsed.event_id,
        "EventType": fields["EventType"],
        "ResourceType": fields["ResourceType"],
        "Resources": fields["Resources"],
        "EventStatus": fields["EventStatus"],
        "NotBeforeRaw": fields["NotBeforeRaw"],
        "Description": fields["Description"],
        "EventSource": fields["EventSource"],
        "DurationInSeconds": fields["DurationInSeconds"],
        "NotBefore": iso(not_before) if not_before else None,
        "AffectsThisVm": _affects(fields["Resources"], ctx.origin),
        "FirstSeen": old["FirstSeen"] if old else iso(ctx.now),
    }


def _affects(resources: list[str], origin: Origin) -> bool | None:
    """Whether `resources` names this VM; None when that cannot be told.

    Without a VM name (an IMDS that serves no instance metadata, and no agent.vm_name) the
    host name stands in, but only to say yes: a scale-set instance's host name differs from
    its instance name, so a miss rules nothing out.
    """
    if origin.identity.vm_name:
        mine = vm_key(origin.identity.vm_name)
        return any(vm_key(name) == mine for name in resources)
    host = vm_key(origin.host_name)
    return True if host and any(vm_key(name) == host for name in resources) else None


# Compared to decide Updated; NotBefore by its parsed value so a reformatted time is no change.
_COMPARED = (
    "EventType",
    "ResourceType",
    "Resources",
    "NotBefore",
    "Description",
    "EventSource",
    "DurationInSeconds",
    "AffectsThisVm",
)


def _change(
    old: SavedEvent | None, cur: SavedEvent, watch: _Watch, ctx: Context
) -> rt.Event | None:
    started = is_started(cur["EventStatus"])
    if old is None:
        return _record(cur, None, "Started" if started else "Scheduled", watch, ctx)
    if started and not is_started(old["EventStatus"]):
        return _record(cur, old, "Started", watch, ctx)
    changed = [name for name in _COMPARED if _differs(name, old, cur)]
    if cur["EventStatus"] != old["EventStatus"]:
        changed.append("EventStatus")
    if not changed:
        return None
    return _record(cur, old, "Updated", watch, ctx, changed=changed)


def _differs(name: str, old: SavedEvent, cur: SavedEvent) -> bool:
    if name == "Resources":
        return sorted(map(vm_key, old["Resources"])) != sorted(map(vm_key, cur["Resources"]))
    if name == "NotBefore" and old["NotBefore"] is None and cur["NotBefore"] is None:
        return bool(old["NotBeforeRaw"] != cur["NotBeforeRaw"])
    before: Mapping[str, object] = old
    now: Mapping[str, object] = cur
    return before.get(name) != now.get(name)


def _vanished(gone: SavedEvent, watch: _Watch, ctx: Context) -> rt.Event:
    """Completed or Canceled for an event no longer in the document."""
    if is_started(gone["EventStatus"]):
        return _record(_ended(gone), gone, "Completed", watch, ctx, inferred=watch.gap)
    if _ran_unseen(gone, watch, ctx.now):
        return _record(_ended(gone), gone, "Completed", watch, ctx, inferred=True)
    unsure = watch.gap or watch.skipped or watch.rebooted
    return _record(_ended(gone), gone, "Canceled", watch, ctx, inferred=unsure)


def _ran_unseen(gone: SavedEvent, watch: _Watch, now: datetime) -> bool:
    """Signs that a Scheduled event which vanished while unobserved actually ran."""
    kind = str(gone["EventType"] or "").lower()
    if watch.rebooted and kind in REBOOTING_TYPES and gone["AffectsThisVm"] is not False:
        return True
    if not (watch.gap or watch.skipped):
        return False
    not_before = parse_time(gone["NotBefore"])
    return not_before is None or not_before <= now


def _ended(gone: SavedEvent) -> SavedEvent:
    return {**gone, "EventStatus": None}


def _record(
    cur: SavedEvent,
    old: SavedEvent | None,
    transition: rt.Transition,
    watch: _Watch,
    ctx: Context,
    *,
    changed: list[str] | None = None,
    inferred: bool = False,
) -> rt.Event:
    rid = ctx.origin.record_id(
        "Event", cur["EventId"].lower(), transition, watch.incarnation, _digest(cur)
    )
    return {
        **ctx.origin.common("Event", rid, ctx.now),
        rt.RECORD_TYPE: "Event",
        "DocumentIncarnation": watch.incarnation,
        "PreviousIncarnation": watch.previous_incarnation,
        "EventId": cur["EventId"],
        "EventType": cur["EventType"],
        "ResourceType": cur["ResourceType"],
        "Resources": list(cur["Resources"]),
        "EventSource": cur["EventSource"],
        "Description": cur["Description"],
        "DurationInSeconds": cur["DurationInSeconds"],
        "EventStatus": cur["EventStatus"],
        "PreviousStatus": old["EventStatus"] if old is not None else None,
        "Transition": transition,
        "NotBefore": cur["NotBefore"],
        "NotBeforeRaw": cur["NotBeforeRaw"],
        "AffectsThisVm": cur["AffectsThisVm"],
        "Inferred": inferred,
        "ChangedFields": changed or [],
        "Source": "Agent",
    }


def _digest(event: SavedEvent) -> str:
    fields: Mapping[str, object] = event
    content = {k: fields.get(k) for k in (*EVENT_FIELDS, "AffectsThisVm")}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def pending_events(state: NormaliserState) -> int:
    return len(state["events"])
