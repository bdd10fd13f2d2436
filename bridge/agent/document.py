"""Reading a Scheduled Events document as IMDS sends it, leniently and without ever raising.

A real document (Microsoft's live-migration sample, api-version 2020-07-01):

    {
        "DocumentIncarnation":  2,
        "Events":  [
                       {
                           "EventId":  "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
                           "EventStatus":  "Scheduled",
                           "EventType":  "Freeze",
                           "ResourceType":  "VirtualMachine",
                           "Resources":  ["WestNO_0", "WestNO_1"],
                           "NotBefore":  "Mon, 11 Apr 2022 22:26:58 GMT",
                           "Description":  "Virtual machine is being paused because of a
                                            memory-preserving Live Migration operation.",
                           "EventSource":  "Platform",
                           "DurationInSeconds":  5
                       }
                   ]
    }

The 2017 shape has no EventSource, Description or DurationInSeconds, an ISO 8601
NotBefore ("2016-09-19T18:29:47Z"), and some clients of that era sent the
incarnation as a string ("5").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Fields an event may carry; a field missing from the document is left out of `present`,
# so an older api-version never looks like a change.
EVENT_FIELDS = (
    "EventType",
    "ResourceType",
    "Resources",
    "EventStatus",
    "NotBeforeRaw",
    "Description",
    "EventSource",
    "DurationInSeconds",
)


class DocumentError(ValueError):
    """The body is not a Scheduled Events document; the message says why, briefly."""


@dataclass(frozen=True)
class ParsedEvent:
    event_id: str
    present: dict[str, Any]

    @property
    def key(self) -> str:
        return self.event_id.lower()

    @property
    def started(self) -> bool:
        return is_started(self.present.get("EventStatus"))


@dataclass(frozen=True)
class ParsedDocument:
    incarnation: int
    events: list[ParsedEvent]
    problems: list[str] = field(default_factory=list)


def is_started(status: object) -> bool:
    return isinstance(status, str) and status.strip().lower() == "started"


def parse_document(raw: object) -> ParsedDocument:
    """Parse a decoded JSON body; DocumentError when it is not a document at all."""
    if not isinstance(raw, Mapping):
        raise DocumentError(f"expected a JSON object, got {type(raw).__name__}")
    keys = _folded(raw)
    incarnation = _incarnation(keys.get("documentincarnation", _MISSING))
    events_raw = keys.get("events", _MISSING)
    if events_raw is _MISSING or events_raw is None:
        raise DocumentError("the document has no Events array")
    if not isinstance(events_raw, list):
        raise DocumentError(f"Events is a {type(events_raw).__name__}, not an array")
    problems: list[str] = []
    events = _dedupe([e for e in (_event(item, problems) for item in events_raw) if e], problems)
    return ParsedDocument(incarnation, events, problems)


_MISSING: Any = object()


def _folded(raw: Mapping[Any, Any]) -> dict[str, Any]:
    """Keys folded to lower case: a hand-written or proxied document may change their case."""
    return {str(k).strip().lower(): v for k, v in raw.items()}


# ASCII digits only, and few enough for int(): str.isdigit() also accepts "²" and "٣", and
# lstrip("-") let "--5" through, all of which int() refuses with a bare ValueError.
_WHOLE = re.compile(r"-?[0-9]{1,30}")


def _incarnation(value: object) -> int:
    if value is _MISSING:
        raise DocumentError("the document has no DocumentIncarnation")
    if isinstance(value, bool):
        raise DocumentError("DocumentIncarnation is a boolean, not a number")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _WHOLE.fullmatch(value.strip()):
        return int(value.strip())
    raise DocumentError(f"DocumentIncarnation is not a whole number: {str(value)[:40]!r}")


def _event(item: object, problems: list[str]) -> ParsedEvent | None:
    if not isinstance(item, Mapping):
        problems.append(f"skipped an event that is not an object: {str(item)[:60]!r}")
        return None
    keys = _folded(item)
    event_id = keys.get("eventid")
    if not isinstance(event_id, str) or not event_id.strip():
        problems.append(f"skipped an event without an EventId: {str(dict(item))[:80]!r}")
        return None
    event_id = _unicode(event_id, "EventId", problems, event_id)
    present: dict[str, Any] = {}
    for name in EVENT_FIELDS:
        source = "notbefore" if name == "NotBeforeRaw" else name.lower()
        if source in keys:
            present[name] = _field(name, keys[source], problems, event_id)
    return ParsedEvent(event_id.strip(), present)


def _field(name: str, value: Any, problems: list[str], event_id: str) -> Any:
    if name == "Resources":
        return [_unicode(r, name, problems, event_id) for r in _resources(value)]
    if name == "DurationInSeconds":
        return _duration(value, problems, event_id)
    if value is None:
        return None
    return _unicode(value if isinstance(value, str) else str(value), name, problems, event_id)


def _resources(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, list):
        return [v if isinstance(v, str) else str(v) for v in value if v is not None]
    return [str(value)]


_SURROGATE = re.compile("[\ud800-\udfff]")


def _unicode(text: str, name: str, problems: list[str], event_id: str) -> str:
    """`text` as Unicode text. JSON's escapes let an unpaired surrogate through ("\\ud800"),
    which UTF-8 cannot carry: it broke the record id and made a record the consumer refuses.
    The event is kept, each such character replaced by U+FFFD, and the problem said."""
    if text.isascii():
        return text
    fixed, count = _SURROGATE.subn("\ufffd", text)
    if count:
        shown = _SURROGATE.sub("\ufffd", event_id)
        problems.append(
            f"event {shown}: {name} held text that is not valid Unicode (an unpaired "
            "surrogate); it is kept with U+FFFD in its place"
        )
    return fixed


def _duration(value: Any, problems: list[str], event_id: str) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(float(str(value).strip()))
    except (ValueError, OverflowError):
        problems.append(f"event {event_id}: DurationInSeconds {str(value)[:20]!r} is not a number")
        return None


def _dedupe(events: list[ParsedEvent], problems: list[str]) -> list[ParsedEvent]:
    """One entry per EventId: the most advanced status wins, then the first occurrence."""
    chosen: dict[str, ParsedEvent] = {}
    for event in events:
        kept = chosen.get(event.key)
        if kept is None:
            chosen[event.key] = event
            continue
        problems.append(f"EventId {event.event_id} appears more than once; kept one entry")
        if event.started and not kept.started:
            chosen[event.key] = event
    return list(chosen.values())
