"""Spot rebalance recommendations: an early warning that a Spot VM's eviction risk rose, read
from IMDS Scheduled Events and written as Advisory records, never as Event records, so that
nothing ever approves one (docs/policy.md#spot-rebalance-recommendations).

What is known, and where it comes from (checked December 2026; the feature is a preview):

- The recommendation exists, is best effort, is "delivered by Scheduled Events" in the VM on
  "the same endpoint [as] preempt notifications, but ... a different version", and
  "acknowledging them has no effect"; it needs the feature Microsoft.Compute/SpotPlus
  (learn.microsoft.com/azure/virtual-machines/spot-eviction-risk-notifications). That page
  names neither the api-version nor the event's fields.
- The api-version is 2024-07-09 and the EventType SpotRebalanceRecommendation: OpenShift's
  Azure termination handler (github.com/openshift/machine-api-provider-azure,
  pkg/termination/termination.go, commit 606d8255 of 2026-06-04: "apiVersion20240709 adds
  SpotRebalanceRecommendation as an event type, but as of June 2026 is not generally
  available"), which polls that one version and finds Preempt and the recommendation in the
  same Events array. One poll on 2024-07-09 therefore serves both: a Spot VM with this on
  makes no more requests than before, only different ones.
- Where 2024-07-09 is not served, that handler says IMDS answers 404; the Scheduled Events
  docs say an unsupported api-version is a 400 listing the newest versions. The agent takes
  either as "not served here" (`not_served`), goes back to the GA version and says so.
- The fields: the handler's test sample below has EventType and ResourceType only, no
  EventId. Nobody public shows more. The parser takes the ordinary Scheduled Events fields
  when they are there and does without them when they are not: with no EventId the entry is
  known by a digest of what it says (`_key`), so a recommendation that changes and has no id
  is a new one.

The handler's sample (test data, api-version 2024-07-09):

    {"DocumentIncarnation":0,"Events":[{"EventType":"SpotRebalanceRecommendation",
     "ResourceType": "VirtualMachine"}]}

Pure: `split` takes the recommendations out of a decoded document before the normaliser sees
it, `advise` diffs them against what the agent saw before and makes the records.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypedDict, cast

from bridge import recordtypes as rt
from bridge.imdstime import parse_time
from bridge.records import REBALANCE_EVENT_TYPE, Origin, is_recommendation, iso, vm_key

__all__ = ["REBALANCE_EVENT_TYPE", "is_recommendation"]  # also read from here by the agent

REBALANCE_API_VERSION = "2024-07-09"
# What an IMDS that does not serve an api-version answers: 404 (the handler above) or 400
# (the Scheduled Events docs).
NOT_SERVED = frozenset({400, 404})


def not_served(status: int) -> bool:
    return status in NOT_SERVED


def split(raw: object) -> tuple[object, list[Mapping[str, Any]]]:
    """`raw` without its recommendations, and the recommendations; `raw` itself when it has
    none (or is no document: the normaliser says what is wrong with it)."""
    if not isinstance(raw, Mapping):
        return raw, []
    name = next((k for k in raw if str(k).strip().lower() == "events"), None)
    events = raw.get(name) if name is not None else None
    if not isinstance(events, list):
        return raw, []
    found = [
        e for e in events if isinstance(e, Mapping) and is_recommendation(_get(e, "eventtype"))
    ]
    if not found:
        return raw, []
    rest = [
        e
        for e in events
        if not (isinstance(e, Mapping) and is_recommendation(_get(e, "eventtype")))
    ]
    return {**raw, name: rest}, found


class SavedAdvice(TypedDict):
    """A recommendation as the agent keeps it between polls (StateKey.ADVISORIES):

    {"EventId": "6b1e0c2a-...", "EventType": "SpotRebalanceRecommendation",
     "EventStatus": "Scheduled", "Resources": ["spot_1"], "NotBeforeRaw": "",
     "NotBefore": null, "Description": null, "AffectsThisVm": true,
     "FirstSeen": "2026-12-02T19:40:00.000Z"}
    """

    EventId: str
    EventType: str
    EventStatus: str | None
    Resources: list[str]
    NotBeforeRaw: str | None
    NotBefore: str | None
    Description: str | None
    AffectsThisVm: bool | None
    FirstSeen: str


AdviceState = dict[str, SavedAdvice]  # by `_key`


@dataclass(frozen=True)
class Advice:
    records: list[rt.Advisory]
    state: AdviceState
    problems: list[str] = field(default_factory=list)


def restore(saved: object) -> AdviceState:
    """What the spool kept, minus entries an older version or a damaged file left malformed."""
    if not isinstance(saved, dict):
        return {}
    return {
        str(k): cast(SavedAdvice, v)
        for k, v in saved.items()
        if isinstance(v, dict)
        and isinstance(v.get("EventId"), str)
        and isinstance(v.get("Resources"), list)
        and isinstance(v.get("FirstSeen"), str)
    }


def advise(
    previous: Mapping[str, SavedAdvice],
    found: Sequence[Mapping[str, Any]],
    origin: Origin,
    now: datetime,
    source: rt.Source = "Agent",
) -> Advice:
    """Raised for each recommendation not seen before, Cleared for each one gone; pure."""
    state: AdviceState = {}
    problems: list[str] = []
    for entry in found:
        key = _key(entry, origin)
        if key in state:
            problems.append(f"recommendation {state[key]['EventId']} appears more than once")
            continue
        old = previous.get(key)
        state[key] = _saved(entry, key, origin, old["FirstSeen"] if old else iso(now))
    records = [_record(state[k], "Raised", origin, now, source) for k in state if k not in previous]
    records += [
        _record(v, "Cleared", origin, now, source) for k, v in previous.items() if k not in state
    ]
    return Advice(records, state, problems)


def _get(entry: Mapping[str, Any], folded: str) -> Any:
    """A field by its name in any case: a proxied or hand-written document may change it."""
    return next((v for k, v in entry.items() if str(k).strip().lower() == folded), None)


def _key(entry: Mapping[str, Any], origin: Origin) -> str:
    """The EventId; without one, a digest of what the entry says and of this VM (two Spot
    VMs each told the same id-less sample are two recommendations, not one)."""
    event_id = _get(entry, "eventid")
    if isinstance(event_id, str) and event_id.strip():
        return event_id.strip().lower()
    said = {str(k): v for k, v in entry.items()}
    text = json.dumps([origin.identity.key(origin.host_name), said], sort_keys=True, default=str)
    return "digest-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def _text(value: object) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    return value if isinstance(value, str) else str(value)


def _saved(entry: Mapping[str, Any], key: str, origin: Origin, first_seen: str) -> SavedAdvice:
    event_id = _get(entry, "eventid")
    raw_resources = _get(entry, "resources")
    resources = (
        [str(r) for r in raw_resources if r is not None]
        if isinstance(raw_resources, list)
        else [raw_resources]
        if isinstance(raw_resources, str) and raw_resources.strip()
        else []
    )
    not_before_raw = _text(_get(entry, "notbefore"))
    not_before = parse_time(not_before_raw)
    return {
        "EventId": event_id.strip() if isinstance(event_id, str) and event_id.strip() else key,
        "EventType": REBALANCE_EVENT_TYPE,
        "EventStatus": _text(_get(entry, "eventstatus")),
        "Resources": resources,
        "NotBeforeRaw": not_before_raw,
        "NotBefore": iso(not_before) if not_before else None,
        "Description": _text(_get(entry, "description")),
        "AffectsThisVm": _affects(resources, origin),
        "FirstSeen": first_seen,
    }


def _affects(resources: list[str], origin: Origin) -> bool | None:
    """Whether the recommendation names this VM; None when it names none (the handler's sample
    has no Resources: a recommendation IMDS shows this VM is taken as this VM's, maybe)."""
    if not resources:
        return None
    name = origin.identity.vm_name or origin.host_name
    return any(vm_key(r) == vm_key(name) for r in resources) if name else None


def _record(
    saved: SavedAdvice,
    state: rt.AdvisoryState,
    origin: Origin,
    now: datetime,
    source: rt.Source,
) -> rt.Advisory:
    rid = origin.record_id("Advisory", saved["EventId"].lower(), state, saved["FirstSeen"])
    return {
        **origin.common("Advisory", rid, now),
        rt.RECORD_TYPE: "Advisory",
        "EventId": saved["EventId"],
        "EventType": saved["EventType"],
        "EventStatus": saved["EventStatus"],
        "Resources": list(saved["Resources"]),
        "NotBefore": saved["NotBefore"],
        "NotBeforeRaw": saved["NotBeforeRaw"],
        "Description": saved["Description"],
        "AffectsThisVm": saved["AffectsThisVm"],
        "AdvisoryState": state,
        "Source": source,
    }
