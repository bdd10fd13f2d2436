"""Approving one event through IMDS: the step the command listener and local mode share.

Both end here so they share one memory of what this agent approved: an event approved
by a central command is never approved again by the local policy (or the other way
round), and a redelivered command does not POST twice. Before every POST the event is
checked against a Scheduled Events document fetched fresh from IMDS, because the
agent's last observation may be a second old and a command may be minutes old.

The memory is saved in the spool's state in the same transaction as the Approval
record, so it survives a restart as far as the record does. So is the memory of the
commands this agent handled (approved, refused or failed): a command with a CommandId in
it is a replay. An entry is kept until the command expires, after which a replay is
refused as expired anyway; a sample of the saved state:

    {"seen": {"3d0c...": {"outcome": "Refused", "until": "2026-11-21T10:15:00.000Z"}}}

A command that comes after its event Started, or after the event left this VM's document
(one the agent saw: an event it never saw may be shown to other VMs only), is refused as
`Late`: nothing can approve the event any more, and the consumer must not ask another VM.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, TypeVar

from bridge import recordtypes as rt
from bridge.agent.advisory import is_recommendation
from bridge.agent.document import ParsedDocument, ParsedEvent, is_started, parse_document
from bridge.agent.imds import excerpt
from bridge.commands.message import LATE, Command, resources_digest
from bridge.outbox.spool import SPOOL_ERRORS, Spool, StateKey
from bridge.records import ApprovalOutcome, Origin, approval_record, iso
from bridge.retry import DeliveryError, PermanentError, RetryableError

log = logging.getLogger(__name__)
T = TypeVar("T")
MEMORY = 256  # events remembered: far more than can be pending on one VM at once
# Commands remembered: only verified ones for this VM get in, one per event at most, so
# this bound is never reached in practice; past it the soonest to expire go first.
SEEN_MEMORY = 1024
# Kept a little past expiry, so a clock step on this VM does not reopen the door at once.
SEEN_GRACE = timedelta(minutes=5)

# Approved/Refused/Failed carry an outcome; Duplicate: approved before, do nothing;
# Busy: the other path is approving it right now; Retry: IMDS did not answer, try later.
# For a command only (`consider`): Replayed, refused as a replay (its outcome names no ids);
# Redelivered, handled here before and handed over again: nothing new to record;
# Prepared, a Prepare accepted: the drain started (its Hook records follow, no Approval).
Kind = Literal[
    "Approved",
    "Refused",
    "Failed",
    "Duplicate",
    "Busy",
    "Retry",
    "Replayed",
    "Redelivered",
    "Prepared",
]


class Runner(Protocol):
    """Runs an IMDS call on the agent's approvals worker (`ImdsCalls.approve`)."""

    def __call__(self, call: Callable[[], T]) -> T: ...


class Prepare(Protocol):
    """This VM's prepare step, as a Prepare command sees it (bridge.agent.prepare)."""

    @property
    def granted(self) -> bool:
        """Whether a Prepare command starts it (a drain under a central policy)."""

    def grant(self, event_id: str, command_id: str) -> bool: ...


class EventsApi(Protocol):
    def scheduled_events(self) -> bytes: ...

    def start_events(self, event_ids: list[str]) -> int: ...


@dataclass(frozen=True)
class Request:
    """Approve `event_id`: what a command (Central) or the local policy (Local) asks for."""

    event_id: str
    command_id: str
    source: rt.ApprovalSource
    rule: str | None
    reason: str
    issued_at: datetime  # the command's IssuedAt, or the moment of the local decision
    expires_at: datetime | None = None  # a command's ExpiresAt: remembered as seen until then
    resources_digest: str | None = None  # a command's ResourcesDigest: the VMs it approves


@dataclass(frozen=True)
class Attempt:
    kind: Kind
    detail: str
    outcome: ApprovalOutcome | None = None


class Approver:
    """Check against a fresh document, POST StartRequests, write the Approval record."""

    def __init__(
        self,
        imds: EventsApi,
        run: Runner,
        spool: Spool,
        origin: Callable[[], Origin],
        now: Callable[[], datetime],
        *,
        on_record: Callable[[ApprovalOutcome], None] | None = None,
        prepare: Prepare | None = None,
    ) -> None:
        self._imds, self._run, self._spool = imds, run, spool
        self._origin, self._now = origin, now
        self._on_record = on_record  # the metrics' count of approvals by source and outcome
        # The prepare step a verified Prepare starts ([kubernetes] on: the drain).
        self._prepare = prepare
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._approved: dict[str, str] = _load(spool)  # event key -> CommandId
        self._seen: dict[str, dict[str, str]] = _load_seen(spool)  # CommandId -> outcome, until
        self._in_flight: set[str] = set()
        # Events the agent observed, newest last, each as its last look found it: Scheduled,
        # Started, or Ended (in an earlier document, not in the last). A command for one that
        # Started or Ended came too late; one no look ever found may be other VMs' only.
        self._observed: OrderedDict[str, str] = OrderedDict()
        # The Spot rebalance recommendations naming this VM (or none) open now: a Prepare for
        # one grants its drain (rebalance.drain); nothing ever approves one.
        self._advised: frozenset[str] = frozenset()

    def handled(self, command_id: str) -> str | None:
        """How this agent ended the command `command_id` before (Approved, ...); None if new."""
        # Only commands: an event the local policy approved is not a replay of anything.
        with self._lock:
            entry = self._seen.get(command_id)
            return entry.get("outcome") if entry else None

    def observe(self, state: Mapping[str, object] | None) -> None:
        """What the agent's last observation holds (its normaliser state): the events in this
        VM's document now, and their status."""
        events = (state or {}).get("events")
        now = {
            str(key).lower(): "Started" if is_started(e.get("EventStatus")) else "Scheduled"
            for key, e in (events.items() if isinstance(events, dict) else ())
            if isinstance(e, dict)
        }
        with self._lock:
            for key in self._observed.keys() - now.keys():
                self._observed[key] = "Ended"
            for key, status in now.items():
                self._observed[key] = status
                self._observed.move_to_end(key)
            while len(self._observed) > MEMORY:
                self._observed.popitem(last=False)

    def advised(self, keys: frozenset[str]) -> None:
        """The recommendations (EventIds, lower case) open now (from the poll loop)."""
        with self._lock:
            self._advised = keys

    def _went_ahead(self, event_id: str) -> str | None:
        """Started or Ended when the agent's last look found the event past Scheduled; None
        when it found it Scheduled, or never."""
        with self._lock:
            status = self._observed.get(event_id.lower())
        return status if status in ("Started", "Ended") else None

    def _came(self, request: Request) -> str:
        """How long after its issue the request came: "12.3 s after the consumer issued it"."""
        age = (self._now() - request.issued_at).total_seconds()
        issuer = "the consumer issued it" if request.source == "Central" else "it was decided"
        return f"{age:.1f} s after {issuer}"

    def _late_detail(self, request: Request, went: str) -> str:
        """The ApprovalDetail of a request refused as Late: its event `went` (Started, Ended)."""
        when = self._came(request)
        if went == "Started":
            return (
                f"{LATE}: event {request.event_id} has already Started: the approval came "
                f"{when}, nothing to approve"
            )
        return (
            f"{LATE}: event {request.event_id} has ended: it left this VM's Scheduled "
            f"Events document before the approval came, {when}"
        )

    def approved(self, event_id: str) -> bool:
        with self._lock:
            return event_id.lower() in self._approved

    def approved_events(self) -> frozenset[str]:
        """EventIds (lower case) this agent approved."""
        with self._lock:
            return frozenset(self._approved)

    def consider(self, command: Command, *, redelivered: bool = False) -> Attempt:
        """Act on a verified command for this VM, written down as its Approval record unless
        it was handled before; Busy and Retry leave it to be read again. `redelivered`: the
        channel handed it over before (dequeue count above 1)."""
        before = self.handled(command.command_id)
        if before is not None:
            return self._repeat(command, before, redelivered)
        if self.approved(command.event_id):
            # Another command (or the local policy) approved the event: no news.
            return Attempt("Duplicate", f"event {command.event_id} was approved already")
        if command.type == "Prepare":
            granted = self._prepare is not None and self._prepare.granted
            return self._drain(command) if granted else self._not_draining(command)
        request = request_for(command)
        if command.expired(self._now()):
            return self._expired(command, request)
        attempt = self.attempt(request)
        if attempt.kind == "Refused" and attempt.outcome is not None:
            self.record(attempt.outcome, seen_until=command.expires_at)
        return attempt

    def _repeat(self, command: Command, before: str, redelivered: bool) -> Attempt:
        if redelivered:  # its record was written, with the seen mark, the first time
            return Attempt("Redelivered", f"already {before.lower()} here")
        why = f"command {command.command_id} was {before.lower()} here already"
        outcome = untrusted(command, "Replayed", why + "; a replay is never acted on")
        self.record(outcome)
        return Attempt("Replayed", outcome.detail, outcome)

    def _not_draining(self, command: Command) -> Attempt:
        """A Prepare grants a drain; an agent with no node to drain refuses it, so that the
        consumer stops waiting for a drain that never comes."""
        return self._refuse(
            command,
            "Prepare: this agent drains no Kubernetes node (its "
            "[kubernetes] section is off), so it has nothing to prepare; it "
            "approves nothing on a Prepare",
        )

    def _drain(self, command: Command) -> Attempt:
        """A Prepare grants a drain: checked as an approval is (expiry, then a fresh document
        in which the event is Scheduled, for the same VMs), then the drain starts; no POST."""
        request = request_for(command)
        if command.expired(self._now()):
            return self._expired(command, request)
        with self._lock:
            advised = command.event_id.lower() in self._advised
        if advised:
            # Listed only at the preview api-version the poll reads (the approvals read the
            # GA one): the poll loop's last look vouches for it.
            return self._granted(command)
        look = self._look(request)
        if isinstance(look, Attempt):
            return look
        document, event, base, went = look
        # A late one keeps the detail the consumer reads as Late (it starts "Late:").
        why = (
            f"{self._late_detail(request, went)} (a Prepare)"
            if went is not None
            else _prepare_refusal(document, event, request)
        )
        if why is not None:
            refused = replace(base, detail=why, late=went)
            self.record(refused, seen_until=command.expires_at)
            return Attempt("Refused", refused.detail, refused)
        return self._granted(command)

    def _granted(self, command: Command) -> Attempt:
        """A Prepare checked: its drain starts, and the command is seen."""
        assert self._prepare is not None  # only called with it set
        self._prepare.grant(command.event_id, command.command_id)
        with self._save_lock:
            seen = self._see(command.command_id, "Prepared", command.expires_at)
            try:
                self._spool.commit([], state={StateKey.SEEN_COMMANDS: seen})
            except SPOOL_ERRORS as err:
                log.warning(
                    "could not save that command %s was handled (%s): a replay "
                    "starts the same drain again, which finds it done",
                    command.command_id,
                    err,
                )
        return Attempt(
            "Prepared",
            f"Prepare accepted: the drain of this node for event {command.event_id} started",
        )

    def _expired(self, command: Command, request: Request) -> Attempt:
        """It expires at the event's NotBefore, when the platform starts the event: the
        agent's last look may show that it went ahead, and then it came Late."""
        went = self._went_ahead(command.event_id)
        if went is not None:
            why = self._late_detail(request, went)
        else:
            came = self._came(request)
            why = f"Expired: it expired at {iso(command.expires_at)}; the approval came {came}"
        return self._refuse(command, why, late=went or "Expired")

    def _refuse(self, command: Command, why: str, *, late: str | None = None) -> Attempt:
        """A refusal of a verified command for this VM: the consumer may trust its ids."""
        outcome = ApprovalOutcome(
            event_id=command.event_id,
            event_type=None,
            incarnation=command.document_incarnation,
            command_id=command.command_id,
            source="Central",
            outcome="Refused",
            detail=why,
            rule=command.rule,
            issued_at=command.issued_at,
            late=late,
        )
        self.record(outcome)
        return Attempt("Refused", why, outcome)

    def attempt(self, request: Request) -> Attempt:
        key = request.event_id.lower()
        with self._lock:
            if key in self._approved or request.command_id in self._approved.values():
                return Attempt("Duplicate", f"event {request.event_id} was approved already")
            if key in self._in_flight:
                return Attempt("Busy", f"event {request.event_id} is being approved right now")
            self._in_flight.add(key)
        try:
            return self._attempt(request)
        finally:
            with self._lock:
                self._in_flight.discard(key)

    def record(
        self,
        outcome: ApprovalOutcome,
        *,
        remember: bool = False,
        seen_until: datetime | None = None,
    ) -> None:
        """Write the Approval record; `remember` the event, and the command as seen until
        `seen_until`, in the same transaction."""
        record = approval_record(self._origin(), outcome, self._now())
        if self._on_record is not None:
            self._on_record(outcome)
        # One writer at a time, so two threads' snapshots of the memory never land out of order.
        with self._save_lock:
            state: dict[str, dict[str, Any]] = {}
            if remember and outcome.event_id is not None:
                state[StateKey.APPROVALS] = self._remember(
                    outcome.event_id, outcome.command_id or ""
                )
            if seen_until is not None and outcome.command_id:
                state[StateKey.SEEN_COMMANDS] = self._see(
                    outcome.command_id, outcome.outcome, seen_until
                )
            try:
                self._spool.commit([record], state=state or None)
            except SPOOL_ERRORS as err:
                log.error(
                    "the Approval record of event %s (%s) could not be written to the spool %s: %s",
                    outcome.event_id,
                    outcome.outcome,
                    self._spool.path,
                    err,
                )

    def _look(
        self, request: Request
    ) -> Attempt | tuple[ParsedDocument, ParsedEvent | None, ApprovalOutcome, str | None]:
        """The fresh document, the request's event in it, the outcome to fill in, and whether
        the event went ahead (Started, Ended); a Retry when IMDS does not answer."""
        try:
            document = self._document()
        except DeliveryError as err:
            return Attempt("Retry", f"cannot read the current Scheduled Events document: {err}")
        event = _find(document, request.event_id)
        return document, event, _outcome(request, document, event), self._late(event, request)

    def _attempt(self, request: Request) -> Attempt:
        look = self._look(request)
        if isinstance(look, Attempt):
            return look
        document, event, base, went = look
        if went is not None:
            detail = self._late_detail(request, went)
            return Attempt("Refused", detail, replace(base, detail=detail, late=went))
        refusal = (
            _advisory(event, request.event_id)
            or _refusal(document, event, request.event_id)
            or _changed(event, request)
        )
        if refusal is not None:
            return Attempt("Refused", refusal, replace(base, outcome="Refused", detail=refusal))
        return self._start(request, base)

    def _late(self, event: ParsedEvent | None, request: Request) -> str | None:
        """Started or Ended when, in the fresh document, the request's event has Started, or
        an event this agent saw is gone; None otherwise."""
        if event is not None:
            return "Started" if is_started(event.present.get("EventStatus")) else None
        with self._lock:
            seen = request.event_id.lower() in self._observed
        return "Ended" if seen else None

    def _start(self, request: Request, base: ApprovalOutcome) -> Attempt:
        try:
            self._run(lambda: self._imds.start_events([request.event_id]))
        except PermanentError as err:
            detail = f"IMDS refused StartRequests for event {request.event_id}: {err}"
            failed = replace(base, outcome="Failed", detail=detail)
            self.record(failed, seen_until=request.expires_at)
            return Attempt("Failed", detail, failed)
        except DeliveryError as err:
            return Attempt("Retry", f"IMDS did not accept StartRequests: {err}")
        answered = self._now()
        latency = max(0, round((answered - request.issued_at).total_seconds() * 1000))
        detail = f"IMDS accepted StartRequests for {base.event_type} {request.event_id}: "
        approved = replace(
            base, outcome="Approved", detail=detail + request.reason, latency_ms=latency
        )
        self.record(approved, remember=True, seen_until=request.expires_at)
        return Attempt("Approved", approved.detail, approved)

    def _document(self) -> ParsedDocument:
        body = self._run(self._imds.scheduled_events)
        try:
            return parse_document(json.loads(body))
        except (ValueError, RecursionError) as err:  # DocumentError is one; too deep a body
            raise RetryableError(f"unreadable document ({err}): {excerpt(body)!r}") from err

    def _remember(self, event_id: str, command_id: str) -> dict[str, Any]:
        with self._lock:
            self._approved[event_id.lower()] = command_id
            while len(self._approved) > MEMORY:
                del self._approved[next(iter(self._approved))]  # the oldest
            return {"events": dict(self._approved)}

    def _see(self, command_id: str, outcome: str, until: datetime) -> dict[str, Any]:
        horizon = iso(self._now() - SEEN_GRACE)
        with self._lock:
            self._seen[command_id] = {"outcome": outcome, "until": iso(until)}
            # ISO UTC strings of one format sort as the times they name.
            for key in [k for k, v in self._seen.items() if v["until"] < horizon]:
                del self._seen[key]
            while len(self._seen) > SEEN_MEMORY:
                del self._seen[min(self._seen, key=lambda k: self._seen[k]["until"])]
            return {"seen": {k: dict(v) for k, v in self._seen.items()}}


def _advisory(event: ParsedEvent | None, event_id: str) -> str | None:
    """A Spot rebalance recommendation is never approved, whoever asks: acknowledging it does
    nothing, and an approval counted for it would hold a budget for nothing. The agent never
    makes it an Event record; this is the last guard, should IMDS list one in the document
    the approvals read."""
    if event is None or not is_recommendation(event.present.get("EventType")):
        return None
    return (
        f"event {event_id} is a Spot rebalance recommendation: an advisory, never approved "
        "(no StartRequests was sent)"
    )


def request_for(command: Command) -> Request:
    return Request(
        event_id=command.event_id,
        command_id=command.command_id,
        source="Central",
        rule=command.rule or None,
        reason=f"rule {command.rule or '(none)'}: {command.reason}",
        issued_at=command.issued_at,
        expires_at=command.expires_at,
        resources_digest=command.resources_digest,
    )


def untrusted(command: Command | None, code: str, why: str) -> ApprovalOutcome:
    """A refusal whose ids nobody vouches for: named in the detail, not in the fields."""
    claimed = ""
    if command is not None:
        claimed = (
            f" (it claims CommandId {command.command_id}, EventId "
            f"{command.event_id}, VmId {command.vm_id})"
        )
    return ApprovalOutcome(
        event_id=None,
        event_type=None,
        incarnation=None,
        command_id=None,
        source="Central",
        outcome="Refused",
        detail=f"{code}: {why}{claimed}",
    )


def _find(document: ParsedDocument, event_id: str) -> ParsedEvent | None:
    return next((e for e in document.events if e.key == event_id.lower()), None)


def _refusal(document: ParsedDocument, event: ParsedEvent | None, event_id: str) -> str | None:
    """Why IMDS's current document forbids approving `event_id`; None when it allows it."""
    if event is None:
        where = f"this VM's current Scheduled Events document (incarnation {document.incarnation})"
        return (
            f"event {event_id} is not in {where}, and this agent never saw it: it may be "
            "shown to other VMs only, or have ended before this agent looked"
        )
    status = event.present.get("EventStatus")
    if not (isinstance(status, str) and status.strip().lower() == "scheduled"):
        return f"event {event_id} is {status!r}, not Scheduled"
    return None


def _prepare_refusal(
    document: ParsedDocument, event: ParsedEvent | None, request: Request
) -> str | None:
    why = _refusal(document, event, request.event_id) or _changed(event, request)
    return None if why is None else f"Prepare: {why}"


def _changed(event: ParsedEvent | None, request: Request) -> str | None:
    """ResourcesChanged when the live event names other VMs than the command approved."""
    if event is None or request.resources_digest is None:
        return None
    live = event.present.get("Resources")
    names = [str(n) for n in live] if isinstance(live, list) else []
    if resources_digest(names) == request.resources_digest:
        return None
    return (
        f"ResourcesChanged: event {request.event_id} now names {names[:20]}, not the VMs the "
        "consumer approved; it decides again on the new Resources"
    )


def _outcome(
    request: Request, document: ParsedDocument, event: ParsedEvent | None
) -> ApprovalOutcome:
    event_type = event.present.get("EventType") if event is not None else None
    return ApprovalOutcome(
        event_id=request.event_id,
        event_type=event_type if isinstance(event_type, str) else None,
        incarnation=document.incarnation,
        command_id=request.command_id,
        source=request.source,
        outcome="Refused",
        detail="",
        rule=request.rule,
        issued_at=request.issued_at,
    )


def _load(spool: Spool) -> dict[str, str]:
    try:
        saved = spool.load_state(StateKey.APPROVALS) or {}
    except SPOOL_ERRORS as err:
        log.warning(
            "cannot read which events this agent approved before (%s): a command "
            "delivered again may be approved again, which IMDS accepts",
            err,
        )
        return {}
    events = saved.get("events")
    if not isinstance(events, dict):
        return {}
    return {str(k).lower(): str(v) for k, v in events.items()}


def _load_seen(spool: Spool) -> dict[str, dict[str, str]]:
    try:
        saved = spool.load_state(StateKey.SEEN_COMMANDS) or {}
    except SPOOL_ERRORS as err:
        log.warning(
            "cannot read which commands this agent handled before (%s): a replay "
            "is checked against IMDS again, not refused as a replay",
            err,
        )
        return {}
    seen = saved.get("seen")
    if not isinstance(seen, dict):
        return {}
    return {
        str(k): {"outcome": str(v.get("outcome")), "until": str(v.get("until"))}
        for k, v in seen.items()
        if isinstance(v, dict)
    }
