"""What a person decides about the fleet (issue 29), as the consumer takes it.

Helper P1 owns this module (Consumer.operate, open_events and pauses act on these shapes);
this copy defines only what the approval page and its API build on, as the shared design
note names them, so that the page compiles and is tested before the two are merged.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

OperatorKind = Literal["approve", "hold", "pause", "resume"]


@dataclass(frozen=True)
class Person:
    """Who decided, as the API proved it: an Entra ID token's `oid`, or `local:<os user>` for
    the standalone consumer's loopback page."""

    object_id: str
    name: str


@dataclass(frozen=True)
class OperatorAction:
    kind: OperatorKind
    by: Person
    reason: str
    at: datetime
    event_id: str | None = None
    resources_digest: str | None = None
    override_budget: bool = False
    scope: str | None = None
    until: datetime | None = None


@dataclass(frozen=True)
class Answer:
    accepted: bool
    code: str
    detail: str


@dataclass(frozen=True)
class OpenEvent:
    """An open event as the approval page lists it."""

    event_id: str
    event_type: str
    vms: tuple[str, ...]
    not_before: datetime | None
    explanation: tuple[str, ...]
    ask: str | None  # who was asked and until when; None when nobody is asked
    resources_digest: str


@dataclass(frozen=True)
class Pause:
    scope: str | None  # None: the whole fleet
    until: datetime | None  # None: until resumed
    by: Person
    reason: str
    at: datetime
