"""The normaliser: previous state + new document + now + identity -> records + new state.

Pure: no I/O, no clock. The state is a JSON-able dict so the agent can persist it in
the same transaction as the records it produced (a crash loses neither or both).

Events are diffed by EventId, never by incarnation: the incarnation may skip, and it
starts over after IMDS's 24-hour switch-off.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from bridge.agent.document import (
    EVENT_FIELDS,
    DocumentError,
    ParsedDocument,
    ParsedEvent,
    is_started,
    parse_document,
    parse_time,
)
from bridge.records import Origin, iso

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


@dataclass(frozen=True)
class Result:
    records: list[dict[str, Any]]
    state: dict[str, Any]
    problems: list[str] = field(default_factory=list)


def empty_state() -> dict[str, Any]:
    return {"incarnation": None, "observed_at": None, "boot_id": None, "events": {}}


def normalise(previous: dict[str, Any] | None, raw: object, ctx: Context) -> Result:
    """Diff the decoded IMDS body `raw` against `previous`. Never raises on any input."""
    prev, problems = _checked_state(previous)
    try:
        doc = parse_document(raw)
    except DocumentError as err:
        return Result([], prev, [*problems, f"not a Scheduled Events document: {err}"])
    result = _diff(prev, doc, ctx)
    return Result(result.records, result.state, problems + result.problems)


_STORED_FIELDS = (*EVENT_FIELDS, "EventId", "NotBefore", "AffectsThisVm", "FirstSeen")


def _checked_state(state: object) -> tuple[dict[str, Any], list[str]]:
    """The persisted state, minus anything an older version or a damaged file left malformed."""
    if state is None:
        return empty_state(), []
    if not isinstance(state, dict) or not isinstance(state.get("events"), dict):
        return empty_state(), ["ignored a malformed saved state; starting from an empty one"]
    events = {
        k: v
        for k, v in state["events"].items()
        if isinstance(v, dict)
        and all(f in v for f in _STORED_FIELDS)
        and isinstance(v["EventId"], str)
        and isinstance(v["Resources"], list)
    }
    dropped = len(state["events"]) - len(events)
    problems = [f"ignored {dropped} malformed event(s) in the saved state"] if dropped else []
    return {**empty_state(), **state, "events": events}, problems


def _diff(prev: dict[str, Any], doc: ParsedDocument, ctx: Context) -> Result:
    watch = _Watch.of(prev, doc, ctx)
    old: dict[str, dict[str, Any]] = prev["events"]
    records: list[dict[str, Any]] = []
    events: dict[str, dict[str, Any]] = {}
    for parsed in doc.events:
        current = _merge(old.get(parsed.key), parsed, ctx)
        events[parsed.key] = current
        record = _change(old.get(parsed.key), current, watch, ctx)
        if record is not None:
            records.append(record)
    for key, gone in old.items():
        if key not in events:
            records.append(_vanished(gone, watch, ctx))
    state = {
        "incarnation": doc.incarnation,
        "observed_at": iso(ctx.now),
        "boot_id": ctx.boot_id if ctx.boot_id is not None else prev.get("boot_id"),
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
    def of(cls, prev: dict[str, Any], doc: ParsedDocument, ctx: Context) -> _Watch:
        last = parse_time(prev.get("observed_at"))
        prev_inc = prev.get("incarnation")
        prev_inc = prev_inc if isinstance(prev_inc, int) else None
        old_boot = prev.get("boot_id")
        return cls(
            incarnation=doc.incarnation,
            previous_incarnation=prev_inc,
            gap=last is not None and ctx.now - last > ctx.gap,
            skipped=prev_inc is not None and doc.incarnation > prev_inc + 1,
            rebooted=bool(old_boot and ctx.boot_id and old_boot != ctx.boot_id),
        )


def _merge(old: dict[str, Any] | None, parsed: ParsedEvent, ctx: Context) -> dict[str, Any]:
    """The event's fields now: what the document says, the last known value where it is silent."""
    current: dict[str, Any] = dict.fromkeys(EVENT_FIELDS)
    current["Resources"] = []
    if old is not None:
        current.update({k: old[k] for k in EVENT_FIELDS if k in old})
    current.update(parsed.present)
    current["EventId"] = parsed.event_id
    not_before = parse_time(current["NotBeforeRaw"])
    current["NotBefore"] = iso(not_before) if not_before else None
    current["AffectsThisVm"] = _affects(current["Resources"], ctx.origin.identity.vm_name)
    current["FirstSeen"] = old["FirstSeen"] if old else iso(ctx.now)
    return current


def _affects(resources: list[str], vm_name: str | None) -> bool | None:
    if not vm_name:
        return None
    mine = _vm_key(vm_name)
    return any(_vm_key(name) == mine for name in resources)


def _vm_key(name: str) -> str:
    # Scale-set instances appear as "web_3" or "_web_3"; case never matters in Azure names.
    return name.strip().lstrip("_").lower()


# Compared to decide Updated; NotBefore by its parsed value so a reformatted time is no change.
_COMPARED = ("EventType", "ResourceType", "Resources", "NotBefore", "Description",
             "EventSource", "DurationInSeconds", "AffectsThisVm")  # fmt: skip


def _change(
    old: dict[str, Any] | None, cur: dict[str, Any], watch: _Watch, ctx: Context
) -> dict[str, Any] | None:
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


def _differs(name: str, old: dict[str, Any], cur: dict[str, Any]) -> bool:
    if name == "Resources":
        return sorted(map(_vm_key, old["Resources"])) != sorted(map(_vm_key, cur["Resources"]))
    if name == "NotBefore" and old["NotBefore"] is None and cur["NotBefore"] is None:
        return bool(old["NotBeforeRaw"] != cur["NotBeforeRaw"])
    return bool(old.get(name) != cur.get(name))


def _vanished(gone: dict[str, Any], watch: _Watch, ctx: Context) -> dict[str, Any]:
    """Completed or Canceled for an event no longer in the document."""
    if is_started(gone["EventStatus"]):
        return _record(_ended(gone), gone, "Completed", watch, ctx, inferred=watch.gap)
    if _ran_unseen(gone, watch, ctx.now):
        return _record(_ended(gone), gone, "Completed", watch, ctx, inferred=True)
    unsure = watch.gap or watch.skipped or watch.rebooted
    return _record(_ended(gone), gone, "Canceled", watch, ctx, inferred=unsure)


def _ran_unseen(gone: dict[str, Any], watch: _Watch, now: datetime) -> bool:
    """Signs that a Scheduled event which vanished while unobserved actually ran."""
    kind = str(gone.get("EventType") or "").lower()
    if watch.rebooted and kind in REBOOTING_TYPES and gone.get("AffectsThisVm") is not False:
        return True
    if not (watch.gap or watch.skipped):
        return False
    not_before = parse_time(gone.get("NotBefore"))
    return not_before is None or not_before <= now


def _ended(gone: dict[str, Any]) -> dict[str, Any]:
    return {**gone, "EventStatus": None}


def _record(
    cur: dict[str, Any],
    old: dict[str, Any] | None,
    transition: str,
    watch: _Watch,
    ctx: Context,
    *,
    changed: list[str] | None = None,
    inferred: bool = False,
) -> dict[str, Any]:
    rid = ctx.origin.record_id(
        "Event", cur["EventId"].lower(), transition, watch.incarnation, _digest(cur)
    )
    record = ctx.origin.common_fields("Event", rid, ctx.now)
    record.update(
        DocumentIncarnation=watch.incarnation,
        PreviousIncarnation=watch.previous_incarnation,
        EventId=cur["EventId"],
        EventType=cur["EventType"],
        ResourceType=cur["ResourceType"],
        Resources=list(cur["Resources"]),
        EventSource=cur["EventSource"],
        Description=cur["Description"],
        DurationInSeconds=cur["DurationInSeconds"],
        EventStatus=cur["EventStatus"],
        PreviousStatus=old["EventStatus"] if old is not None else None,
        Transition=transition,
        NotBefore=cur["NotBefore"],
        NotBeforeRaw=cur["NotBeforeRaw"],
        AffectsThisVm=cur["AffectsThisVm"],
        Inferred=inferred,
        ChangedFields=changed or [],
    )
    return record


def _digest(event: dict[str, Any]) -> str:
    content = {k: event.get(k) for k in (*EVENT_FIELDS, "AffectsThisVm")}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def pending_events(state: dict[str, Any]) -> int:
    events = state.get("events")
    return len(events) if isinstance(events, dict) else 0
