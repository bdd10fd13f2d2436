"""The people desk: a person's action (approve or hold an event, an override of the budgets,
pause or resume early approvals) checked and refused with a code and a sentence, or signed
into the operator log (bridge.consumer.people.operatorlog) and decided on at once; and what
people are shown: the open events with what the policy decides now and why, the pauses in
force, what people decided (docs/people.md).

The desk reaches the consumer through a narrow port, `ConsumerPort`, which
bridge.consumer.core.Consumer provides: an action on an event asks it once for the event's
situation, is refused on that, or passes it on to the decision pass, which starts from it. An
import contract (pyproject.toml) keeps the desk out of the decision pass's modules.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Generic, Protocol, TypeVar

from bridge.commands.message import resources_digest
from bridge.consumer.people.operatorlog import (
    OperatorAction,
    OperatorLog,
    canonical_scope,
    scope_error,
    scope_key,
)
from bridge.policy.evaluation import evaluate
from bridge.policy.gates.pause import active_pause, covers
from bridge.policy.model import (
    EventView,
    FleetView,
    Pause,
    Person,
    PersonDecision,
    Policy,
    VmView,
)
from bridge.records import iso
from bridge.redact import describe
from bridge.retry import RetryableError

log = logging.getLogger(__name__)

# A person's reason goes into Decision records and notices: a paragraph, not a document.
MAX_REASON = 1000
# Every code `operate` refuses with (docs/people.md#refusals).
REFUSALS = (
    "Invalid",
    "NoReason",
    "NotOpen",
    "ResourcesChanged",
    "Paused",
    "BadScope",
    "NotPaused",
    "NoSigningKey",
    "NotAsked",
    "Advisory",
)


@dataclass(frozen=True)
class Answer:
    """What `PeopleDesk.operate` says to the person: accepted, or refused and why."""

    accepted: bool
    code: str  # Accepted, NotOpen, ResourcesChanged, NoReason, Paused, ... (see REFUSALS)
    detail: str  # a sentence for the person
    warning: str = ""  # what the person may not have meant, in a sentence (a pause of no VM)


@dataclass(frozen=True)
class AskState:
    """An event a person is asked about: who, since when, until when."""

    target: str
    since: datetime | None  # None: the ask is decided but not said yet
    deadline: datetime | None  # None: until NotBefore, which is not known

    def __str__(self) -> str:
        since = f" since {iso(self.since)}" if self.since else ""
        until = f"until {iso(self.deadline)}" if self.deadline else "until NotBefore"
        return f"{self.target}{since}, waiting {until}"


@dataclass(frozen=True)
class OpenEvent:
    """One open (Scheduled) event as the page lists it."""

    event_id: str
    event_type: str
    event_source: str | None
    not_before: datetime | None
    vms: tuple[str, ...]  # the names of the VMs it affects (and the names not resolved)
    resources: tuple[str, ...]
    resources_digest: str  # what an approve or hold must carry (OperatorAction)
    action: str  # what the policy decides now: Approve, Defer, Hold, Ask
    rule: str
    reason: str
    explanation: tuple[str, ...]
    ask: str | None  # who is asked, since and until when, in a sentence; None: nobody
    asked: AskState | None  # the same, as values
    person: PersonDecision | None  # the last decision a person made about it
    pause: Pause | None  # the pause that stops its approval now
    # A Spot rebalance recommendation (an Advisory): never approved; `reason` says what the
    # policy's rebalance section did on it (drained, notified, nothing).
    advisory: bool = False


@dataclass(frozen=True)
class PatchAsk:
    """An Update Manager patch run a person is asked about (issue 40; the page lists it): run
    it over the budget, or cancel it, until `deadline` (a margin before its cut-off)."""

    subject: str  # `(patch:CONFIGURATION/RUN)`, as notices and Decision records name it
    configuration: str  # the maintenance configuration's id
    name: str  # the run's name, yyyyMMddHHmmss
    vms: int  # the VMs it counts
    start: datetime
    end: datetime  # its window's end
    cutoff: datetime | None  # Azure's cancellation cut-off
    target: str  # who is asked
    deadline: datetime | None  # until when the answer is taken
    on_deadline: str  # what happens unanswered: run or cancel
    breaches: tuple[str, ...]  # the budgets it would break, a sentence each


@dataclass(frozen=True)
class PeopleCounts:
    """What the metrics say of people (bridge.consumer.metrics)."""

    asks_pending: int  # open events waiting for a person's answer, as of the last tick
    pauses_active: int
    operated: Mapping[str, int]  # actions people made that were accepted, by kind
    forged: int  # operator documents in the state that did not verify, ignored
    on_previous_key: int = 0  # actions that apply only through a previous signing key
    # Documents refused, by why (REFUSED): deleted (and written back), reappeared after they
    # were forgotten, or signed by a previous key after the current one took over.
    refused: Mapping[str, int] = field(default_factory=dict)


# --- the port -------------------------------------------------------------------------------


class Situated(Protocol):
    """A live event as the consumer's decision pass sees it: what the desk reads of it."""

    @property
    def view(self) -> EventView: ...

    @property
    def fleet(self) -> FleetView: ...

    @property
    def asked(self) -> datetime | None:
        """When its ask was said; None when it was not (yet)."""
        ...


S = TypeVar("S", bound=Situated)


class ConsumerPort(Protocol[S]):
    """What the desk needs of the consumer (bridge.consumer.core.Consumer provides it)."""

    asks_pending: int  # open events waiting for a person's answer, as of the last tick

    def situation(self, event_id: str, now: datetime) -> S | None:
        """The live event `event_id` now; None when the state holds no such event."""
        ...

    def open_situations(self, now: datetime) -> list[S]:
        """The Scheduled events now, the soonest first."""
        ...

    def decide(self, situation: S) -> tuple[str | None, str | None]:
        """Decide the event of `situation` at once, starting from it (a person's decision
        about it was just recorded): the kind and reason of the decision it stands on then.
        RetryableError when the state or a channel failed: the next pass decides it."""
        ...

    def decide_all(self) -> None:
        """Decide every open event again (a pause or a resume was just recorded)."""
        ...

    def say(self, action: OperatorAction, now: datetime) -> None:
        """The Decision record and the notice of a pause or a resume."""
        ...

    def known_vms(self) -> Iterable[VmView]: ...

    def budget_use(self) -> dict[str, float]: ...

    def patch_runs_asked(self, now: datetime) -> list[PatchAsk]:
        """The patch runs a person is asked about now, the soonest first."""
        ...

    def answer_patch_run(self, run: str, said: str, by: Person, reason: str) -> tuple[str, str]:
        """A person's answer (`said`: run or cancel) to the ask about the patch run `run`
        (`(patch:CONFIGURATION/RUN)`): (code, detail), code Accepted, NotOpen or NotAsked."""
        ...


# --- the desk -------------------------------------------------------------------------------


class PeopleDesk(Generic[S]):
    """A person's actions and what people are shown, over the consumer's port and the
    operator log; the approval page and its API (bridge.consumer.people.app), `status
    --consumer` and the metrics ask it."""

    def __init__(
        self,
        consumer: ConsumerPort[S],
        operators: OperatorLog,
        policy: Policy,
        lock: AbstractContextManager[object],
        *,
        now: Callable[[], datetime],
    ) -> None:
        """`lock`: the consumer's, so that an action is checked, recorded and decided with no
        batch folded in between."""
        self.consumer = consumer
        self.operators = operators
        self.policy = policy
        self._lock = lock
        self._now = now
        self.operated: Counter[str] = Counter()  # people's actions accepted, by kind

    def operate(self, action: OperatorAction) -> Answer:
        """A person's decision, from a path that proved who they are (the API, the loopback
        page): checked, signed and stored, and acted on at once. Refused with a code and a
        sentence when the event is no longer open, its Resources are not the ones shown to
        the person, a reason is missing, or a pause stops it (docs/people.md)."""
        with self._lock:
            now = self._now()
            self.operators.refresh()
            refused = refusal(action, can_sign=self.operators.can_sign)
            seen = None
            if refused is None and action.kind in ("pause", "resume"):
                # The operator log was read just now: not again (a query on Tables).
                refused = scope_refusal(action, self.operators.pauses(now), now)
            elif refused is None:
                seen = self.consumer.situation(str(action.event_id), now)
                refused = event_refusal(action, seen, now)
            if refused is not None:
                log.info(
                    "%s by %s (%s) refused: %s: %s",
                    action.kind,
                    action.by.name,
                    action.by.object_id,
                    refused.code,
                    refused.detail,
                )
                return refused
            if action.kind in ("pause", "resume"):
                action = replace(action, scope=canonical_scope(action.scope))
            self.operators.record(action)
            self.operated[action.kind] += 1
            what = action.event_id or f"({scope_key(action.scope)})"
            log.info(
                "%s of %s by %s (%s) recorded: %s",
                action.kind,
                what,
                action.by.name,
                action.by.object_id,
                action.reason or "no reason given",
            )
            if seen is None:
                self.consumer.say(action, now)
            detail = self._decided(seen)
            return Answer(True, "Accepted", detail, self._covers_nothing(action))

    def answer_patch_run(self, run: str, said: str, by: Person, reason: str) -> Answer:
        """A person's answer to the ask about an Update Manager patch run (issue 40): `run`
        (let it run over the budget) or `cancel` (cancelled through applyUpdates, if its
        cut-off's margin has not passed). The Decision record it leads to names the person
        and their reason; refused like an event's action without a reason."""
        if said not in ("run", "cancel"):
            return Answer(False, "Invalid", f"answer {said[:40]!r} is neither run nor cancel")
        if not reason.strip():
            return Answer(False, "NoReason", "say why: the Decision record carries it")
        if len(reason) > MAX_REASON:
            return Answer(False, "Invalid", f"a reason of at most {MAX_REASON} characters")
        with self._lock:
            code, detail = self.consumer.answer_patch_run(run, said, by, reason.strip())
        log.info("%s (%s) answered %s to patch run %s: %s, %s",
                 by.name, by.object_id, said, run, code, detail)  # fmt: skip
        if code == "Accepted":
            self.operated[f"patch_{said}"] += 1
        return Answer(code == "Accepted", code, detail)

    def _decided(self, seen: S | None) -> str:
        """Decide on what was just recorded: the event of `seen` (None: every open event)."""
        try:
            if seen is None:
                self.consumer.decide_all()
                return "recorded; every open event was decided again"
            kind, reason = self.consumer.decide(seen)
        except RetryableError as err:
            return f"recorded; the next pass applies it ({describe(err)})"
        return f"recorded; the event now: {kind}: {reason}"

    def _covers_nothing(self, action: OperatorAction) -> str:
        """A warning when a scoped pause covers no VM known: most likely a misspelt scope."""
        if action.kind != "pause" or action.scope is None:
            return ""
        pause = Pause(action.scope, action.until, action.by, action.reason, action.at)
        if covers(pause, self.consumer.known_vms()):
            return ""
        return (
            f"no VM the consumer knows is in {action.scope}: the pause stops no approval "
            "now, only those of VMs that join it; is the scope spelt as the VMs' "
            "heartbeats name it?"
        )

    # --- what people are shown ----------------------------------------------------------------

    def open_events(self, now: datetime) -> list[OpenEvent]:
        """The Scheduled events as the approval page lists them, the soonest first, each with
        what the policy decides now and why (nothing is written)."""
        with self._lock:
            self.operators.refresh(now)
            return [self._open_event(s, now) for s in self.consumer.open_situations(now)]

    def _open_event(self, seen: S, now: datetime) -> OpenEvent:
        view, fleet = seen.view, seen.fleet
        verdict = evaluate(self.policy, fleet, view, now)
        ask = None
        if verdict.asked is not None and verdict.kind == "Ask":
            ask = AskState(verdict.asked, seen.asked, verdict.ask_deadline)
        names = [fleet.vms[v].name if v in fleet.vms else v for v in view.affected]
        return OpenEvent(
            event_id=view.event_id,
            event_type=view.event_type,
            event_source=view.event_source,
            not_before=view.not_before,
            vms=(*names, *view.unresolved),
            resources=view.resources,
            resources_digest=resources_digest(view.resources),
            action=verdict.kind,
            rule=verdict.rule,
            reason=verdict.reason,
            explanation=verdict.explanation,
            ask=str(ask) if ask else None,
            asked=ask,
            person=view.person,
            pause=verdict.pause or active_pause(fleet, view, now),
            advisory=view.advisory,
        )

    def patch_runs_asked(self, now: datetime) -> list[PatchAsk]:
        """The patch runs a person is asked about now, as the page lists them."""
        with self._lock:
            return self.consumer.patch_runs_asked(now)

    def pauses(self, now: datetime) -> list[Pause]:
        """The pauses in force at `now`, fleet-wide first."""
        with self._lock:
            self.operators.refresh(now)
            return list(self.operators.pauses(now))

    def actions(self, since: datetime) -> list[OperatorAction]:
        """What people decided at or after `since` (verified as the decision pass does),
        oldest first."""
        with self._lock:
            self.operators.refresh()
            return self.operators.actions(since)

    def budget_use(self) -> dict[str, float]:
        """Per budget, how full its fullest group is now (the page shows it)."""
        return self.consumer.budget_use()

    def counts(self) -> PeopleCounts:
        """For the metrics: no read of the fleet state (what the last pass and tick saw)."""
        with self._lock:
            operators = self.operators
            return PeopleCounts(
                self.consumer.asks_pending,
                len(operators.pauses(self._now())),
                dict(self.operated),
                operators.forged,
                operators.on_previous_key,
                dict(operators.refused),
            )


# --- the refusals (pure) --------------------------------------------------------------------


def refusal(action: OperatorAction, *, can_sign: bool) -> Answer | None:  # noqa: PLR0911
    """Why `action` is refused whatever the state holds; None when it is not."""

    def no(code: str, detail: str) -> Answer:
        return Answer(False, code, detail)

    if not action.by.object_id.strip():
        return no("Invalid", "who decided is not known (no object id)")
    if action.at.tzinfo is None or (action.until is not None and action.until.tzinfo is None):
        return no("Invalid", "times must say their time zone (UTC)")
    if len(action.reason) > MAX_REASON:
        return no("Invalid", f"the reason is longer than {MAX_REASON} characters")
    if not can_sign:
        return no(
            "NoSigningKey",
            "this consumer has no command signing key "
            "(commands.signing_key) to sign what a person decides with",
        )
    override = action.kind == "approve" and action.override_budget
    if (action.kind in ("pause", "resume") or override) and not action.reason.strip():
        what = "an override of the budgets" if override else f"a {action.kind}"
        return no("NoReason", f"{what} needs a reason (--reason): it is audited")
    if action.kind in ("pause", "resume"):
        return None  # scope_refusal
    if action.event_id is None or action.kind not in ("approve", "hold"):
        return no("Invalid", f"{action.kind} of no event: name the event")
    if action.override_budget and action.kind != "approve":
        return no("Invalid", "only an approval can override the budgets")
    return None


def scope_refusal(action: OperatorAction, pauses: Iterable[Pause], now: datetime) -> Answer | None:
    """Why a pause or a resume is refused, given the `pauses` in force; None when it is not."""
    bad = scope_error(action.scope)
    if bad is not None:
        return Answer(False, "BadScope", bad)
    if action.kind == "pause":
        if action.until is not None and action.until <= now:
            return Answer(False, "Invalid", f"--until {iso(action.until)} has passed")
        return None
    if not any(scope_key(p.scope) == scope_key(action.scope) for p in pauses):
        return Answer(False, "NotPaused", f"{scope_key(action.scope)} is not paused")
    return None


def event_refusal(action: OperatorAction, seen: Situated | None, now: datetime) -> Answer | None:
    """Why an approve or a hold of the event `seen` (None: not known) is refused; None when it
    is not."""
    if seen is None:
        return Answer(False, "NotOpen", f"no event {action.event_id} is known")
    view = seen.view
    if view.advisory:
        # The rebalance gate runs before a person's decision: an approve or a hold would be
        # recorded and change nothing, so it is refused rather than accepted in vain.
        return Answer(
            False,
            "Advisory",
            f"{action.event_id} is a Spot rebalance recommendation, an advisory: it is never "
            "approved or held; the policy's rebalance section decides what is done on it "
            "(drain, notify)",
        )
    if view.status != "Scheduled":
        return Answer(
            False,
            "NotOpen",
            f"event {action.event_id} is {view.status}: there is nothing left to decide",
        )
    digest = resources_digest(view.resources)
    if action.resources_digest != digest:
        return Answer(
            False,
            "ResourcesChanged",
            f"the VMs of event {action.event_id} changed "
            f"since they were shown to you (now {', '.join(view.resources) or 'none'}, "
            f"digest {digest}): look again and decide on what it is now",
        )
    pause = active_pause(seen.fleet, view, now) if action.kind == "approve" else None
    if pause is not None:
        return Answer(
            False,
            "Paused",
            f"{pause.where} is paused by {pause.by.name} "
            f"({pause.reason}): no early approval while it lasts; resume it "
            "first",
        )
    return None
