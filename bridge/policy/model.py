"""The approval policy: what it says (the model) and what it decides (a pure evaluator).

`evaluate(policy, fleet, event, now)` looks at one event and the fleet as the consumer
knows it and returns a Verdict: approve it now (and through which VM), defer it (look
again later: a budget is full, hooks are not ready, the window is closed), or hold it
(let NotBefore arrive). It does no I/O and reads no clock: the same inputs always give
the same verdict, which is what the table-driven and property tests rely on.

Policy files are read by `bridge.policy.file`; the model here is what they become.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, time, timedelta, timezone
from typing import Literal
from zoneinfo import ZoneInfo

ActionKind = Literal["approve", "approve_when_ready", "approve_in_window", "hold", "ask"]
# Release is the consumer's, never evaluate's: a budget slot freed though no VM said the
# event ended (its VMs are gone). Ask: a person is asked and has not answered yet.
VerdictKind = Literal["Approve", "Defer", "Hold", "Ignore", "Release", "Ask"]
# The DecisionRule of what a person decided (bridge.consumer.operators), not a rule.
PERSON_RULE = "(person)"
# A live VM the event names is asked to carry the approval before its own report is read only
# this soon after the event was first seen: past it, a VM that still has not reported it is
# most likely not running an agent that would (choose_target).
UNREPORTED_CARRIER_WITHIN = timedelta(minutes=2)
GROUP_KINDS = (
    "fleet",
    "scale_set",
    "zone",
    "fault_domain",
    "update_domain",
    "resource_group",
    "node_pool",
)
# A node cordoned by someone else counts in every budget as impacted by this pseudo event.
CORDONED = "cordoned:"
# A node se-bridge's own drain still holds cordoned (heartbeat NodeDraining), its event over
# or not: counted until its agent says it uncordoned it, so that the next node of its pool is
# not drained before it is back. Only while its agent is alive: a deleted node holds nothing.
HELD = "held:"
# A VM resource health reports Unavailable or Degraded counts in every budget as impacted by
# this pseudo event until it is Available again (issue 36), whatever its agent says.
HEALTH = "health:"
# The carrier of last resort (issue 36): ARM's acknowledge, when no live agent can carry an
# approval (choose_target). It stands where a VmId would as the target of a verdict, a ledger
# entry and the command kept for a resend; no channel ever sees it (bridge.consumer.armcarrier).
ARM_CARRIER = "(arm)"


@dataclass(frozen=True)
class Range:
    """DurationInSeconds bounds: at_least <= d < below; None leaves that side open."""

    at_least: int | None = None
    below: int | None = None

    def contains(self, value: int | None) -> bool:
        if value is None:
            return False
        low_ok = self.at_least is None or value >= self.at_least
        return low_ok and (self.below is None or value < self.below)


@dataclass(frozen=True)
class Match:
    """Every condition given must hold; an empty set means "any". Names compare case-blind."""

    event_types: frozenset[str] = frozenset()
    event_sources: frozenset[str] = frozenset()
    statuses: frozenset[str] = frozenset()
    duration: Range | None = None
    tags: tuple[tuple[str, str], ...] = ()
    scale_sets: frozenset[str] = frozenset()
    resource_groups: frozenset[str] = frozenset()
    locations: frozenset[str] = frozenset()
    zones: frozenset[str] = frozenset()
    names: tuple[str, ...] = ()

    @property
    def about_vms(self) -> bool:
        return bool(
            self.tags
            or self.scale_sets
            or self.resource_groups
            or self.locations
            or self.zones
            or self.names
        )


@dataclass(frozen=True)
class Window:
    """A weekly window: `days` (0 = Monday), from `start` to `end` local time (end may wrap)."""

    days: frozenset[int]
    start: time
    end: time


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    deadline: timedelta | None = None
    on_deadline: Literal["approve", "hold"] = "hold"
    windows: tuple[Window, ...] = ()
    timezone: str = "UTC"
    # ask: the notification target asked (bridge.notify); `deadline` counts from the ask.
    target: str | None = None


@dataclass(frozen=True)
class Rule:
    name: str
    match: Match
    action: Action


@dataclass(frozen=True)
class Budget:
    """At most `max_vms`, or `max_percent` of each group, impacted at once."""

    name: str
    group: str  # one of GROUP_KINDS, or "tag:NAME"
    max_vms: int | None = None
    max_percent: float | None = None

    def limit(self, size: int) -> int:
        if self.max_vms is not None:
            return self.max_vms
        # A percentage always lets one VM through, or a small group could never be maintained.
        return max(1, math.floor((self.max_percent or 0) * size / 100))


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...]
    budgets: tuple[Budget, ...] = ()
    source: str = "built-in default"


@dataclass(frozen=True)
class VmView:
    vm_id: str
    name: str
    subscription_id: str | None = None
    resource_group: str | None = None
    location: str | None = None
    zone: str | None = None
    scale_set: str | None = None
    fault_domain: int | None = None
    update_domain: int | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    last_seen: datetime | None = None
    # Whether its agent runs a prepare hook; None: its agent has not said (an older one).
    prepare_hook: bool | None = None
    # The partition its records come on (bridge.consumer.reading): its silence is measured
    # against how far that partition has been read. None: read from no partition.
    partition: str | None = None
    # The Kubernetes node its agent runs on, and the node's pool, as its last heartbeat said
    # (None: not a node, or an agent from before issue 30).
    node_name: str | None = None
    node_pool: str | None = None
    # Its heartbeat says someone other than se-bridge made the node unschedulable.
    cordoned: bool = False
    # The EventId whose drain holds the node cordoned now (heartbeat NodeDraining), or None.
    held: str | None = None
    # Its full resource id (compute.resourceId, lower case), or None: not said.
    resource_id: str | None = None

    @property
    def drains_on_grant(self) -> bool:
        """Its agent drains the node as its prepare step, when the consumer grants it (a
        Prepare command): only an agent that names its node knows the command."""
        return self.node_name is not None and self.prepare_hook is True


Scope = tuple[str | None, str | None, str | None]  # (subscription, resource group, scale set)


def scope_of(vm: VmView) -> Scope:
    """Where Azure keeps a VM name unique: its subscription, resource group and scale set.

    It is also as far as an event reaches: Azure shows an event to the VMs of one
    availability set (in one resource group) or one scale set's placement group, and IMDS
    does not name the availability set."""
    lower = (vm.resource_group or "").lower() or None, (vm.scale_set or "").lower() or None
    return (vm.subscription_id, *lower)


@dataclass(frozen=True)
class Person:
    """Who decides, as the API or the loopback page proved it (bridge.consumer.operators)."""

    object_id: str  # Entra oid, or "local:<os user>" on the standalone loopback page
    name: str  # display name / UPN

    @property
    def who(self) -> str:
        return f"{self.name} ({self.object_id})"


@dataclass(frozen=True)
class PersonDecision:
    """A person's decision about one event, as the policy sees it: proven by the consumer's
    signature (bridge.consumer.operators), never taken from a record."""

    kind: Literal["approve", "hold"]
    by: Person
    reason: str
    at: datetime
    override_budget: bool = False


@dataclass(frozen=True)
class Pause:
    """A person stopped early approvals: fleet-wide (`scope` None) or in one budget group
    (`scope` "KIND:VALUE", KIND one of GROUP_KINDS or tag:NAME), until `until` (None: until
    resumed)."""

    scope: str | None
    until: datetime | None
    by: Person
    reason: str
    at: datetime

    @property
    def where(self) -> str:
        return self.scope or "fleet"

    def active(self, now: datetime) -> bool:
        return self.until is None or now < self.until

    def covers(self, vms: Iterable[VmView]) -> bool:
        """Whether the pause covers an event of `vms` (a fleet-wide one covers every event,
        and so does one whose scope cannot be read: a pause errs on the side of stopping)."""
        try:
            scope = parse_scope(self.scope)
        except ValueError:
            return True
        if scope is None:
            return True
        kind, value = scope
        return any(scope_value_matches(value, group_key(kind, vm)) for vm in vms)


def group_kind(text: str) -> str | None:
    """A budget group's kind as a person writes it, in a policy's budget or a pause's scope:
    one of GROUP_KINDS or tag:NAME, case-blind (a tag's name keeps its case; tags are matched
    case-blind anyway). None when it is neither."""
    text = text.strip()
    if text.lower().startswith("tag:"):
        name = text[4:].strip()
        return f"tag:{name}" if name else None
    return text.lower() if text.lower() in GROUP_KINDS else None


def parse_scope(scope: str | None) -> tuple[str, str] | None:
    """A pause's scope as (kind, value), the kind as `group_kind` makes it; None for the whole
    fleet (no scope, or `fleet`). ValueError, saying what is allowed, when it names no group.
    `tag:NAME:VALUE`: NAME has no colon, VALUE may (`tag:env:prod:eu` is tag env, prod:eu)."""
    text = scope.strip() if scope is not None else ""
    if not text or text.lower() == "fleet":
        return None
    # KIND ends at the first colon, a tag's NAME at the next: a tag's VALUE may hold colons.
    if text.lower().startswith("tag:"):
        name, colon, value = text[4:].partition(":")
        kind = group_kind(f"tag:{name}") if colon else None
    else:  # no scale set, resource group, zone, domain or node pool name holds a colon
        named, colon, value = text.partition(":")
        kind = group_kind(named) if colon and ":" not in value else None
    if kind is None or kind == "fleet" or not value.strip():
        kinds = ", ".join(k for k in GROUP_KINDS if k != "fleet")
        raise ValueError(
            f"scope {scope!r} is not KIND:VALUE with KIND one of {kinds} or tag:NAME "
            "(for example scale_set:web or tag:tier:db), or fleet"
        )
    return kind, value.strip()


def scope_value_matches(value: str, key: str | None) -> bool:
    """Whether a pause's VALUE names the group `key` (`group_key`): the whole key, or its last
    part a person reads (the scale set, resource group or zone name, a tag's value), case-blind.
    A name shared by two subscriptions pauses both: a pause errs on the side of stopping."""
    if key is None:
        return False
    wanted = value.strip().lower()
    key = key.lower()
    last = key.rsplit("/", 1)[-1]
    return wanted in (key, last, last.rsplit(" ", 1)[-1], key.split("=", 1)[-1])


@dataclass(frozen=True)
class Blocker:
    """A pod that holds a drain up: `reason` as the agent gives it, and the
    PodDisruptionBudget that refused its eviction (None: no PDB did)."""

    namespace: str
    pod: str
    reason: str
    pdb: str | None = None


@dataclass(frozen=True)
class DrainView:
    """The latest drain record of one VM for an event: its DrainStatus, when it was written,
    since when the drain has been blocked (None: it is not), what blocks it, and whether it
    ended without the node being ready (GaveUp with hold, Failed)."""

    status: str
    at: datetime
    blocked_since: datetime | None = None
    blockers: tuple[Blocker, ...] = ()
    failed: bool = False


@dataclass(frozen=True)
class EventView:
    event_id: str
    event_type: str
    event_source: str | None
    duration: int | None
    status: str
    not_before: datetime | None
    first_seen: datetime
    affected: tuple[str, ...]  # VmIds resolved from Resources
    unresolved: tuple[str, ...] = ()  # names in Resources not resolved to one VM
    possible: tuple[str, ...] = ()  # VmIds an ambiguous name of `unresolved` may be
    unknown: tuple[str, ...] = ()  # the names of `unresolved` no known VM has, still counted
    # The names of `unresolved` no known VM has that no longer count: past
    # consumer.unknown_names_for since the event was first seen.
    lapsed: tuple[str, ...] = ()
    # Where a name of `unknown` may be: the scopes of the VMs that can see the event (see
    # bridge.consumer.documents.Names.witnesses); empty: anywhere.
    scopes: tuple[Scope, ...] = ()
    reporters: tuple[str, ...] = ()  # VmIds that can see it whose current document holds it
    resources: tuple[str, ...] = ()  # Resources as the VMs that can see it give them
    ready: frozenset[str] = frozenset()  # VmIds whose prepare hook succeeded for it
    tried: tuple[str, ...] = ()  # VmIds already asked to approve it
    # When the consumer first asked a person about it (an `ask` rule); None: not asked yet.
    asked_at: datetime | None = None
    # The last decision a person made about it, signed and verified (bridge.consumer.operators).
    person: PersonDecision | None = None
    drains: Mapping[str, DrainView] = field(default_factory=dict)  # VmId -> its drain
    granted: frozenset[str] = frozenset()  # VmIds the consumer sent a Prepare (a drain grant)
    no_drain: frozenset[str] = frozenset()  # VmIds whose agents refused the Prepare
    # Where the agents and Event Grid tell the event differently, a sentence each.
    disagreements: tuple[str, ...] = ()
    azure: str | None = None  # its status as Event Grid tells it; None: Event Grid has not

    @property
    def counted(self) -> list[str]:
        """What budgets count while the event impacts VMs: its VmIds, the names not resolved
        to one (but those lapsed), and the VMs an ambiguous name may be; sorted."""
        lapsed = set(self.lapsed)
        names = (n for n in self.unresolved if n not in lapsed)
        return sorted({*self.affected, *names, *self.possible})


@dataclass(frozen=True)
class FleetView:
    vms: Mapping[str, VmView]
    impacted: Mapping[str, frozenset[str]]  # EventId -> VmIds counted until it completes
    alive_within: timedelta = timedelta(minutes=11)
    # `group_index(kinds, vms)`, made once for many events by a caller that decides a batch:
    # without it each budget check sorts the whole fleet into groups again.
    groups: Mapping[str, Mapping[str, frozenset[str]]] | None = None
    # EventId (as in `impacted`) -> where the names it counts that no VM of `vms` has may be
    # (EventView.scopes when it was counted); an event missing here: anywhere.
    reach: Mapping[str, frozenset[Scope]] = field(default_factory=dict)
    # The pauses people set that have not been lifted (each may have lifted by its `until`).
    pauses: tuple[Pause, ...] = ()
    # Of the VMs resource health reports Unavailable or Degraded (counted as impacted by the
    # pseudo events HEALTH + VmId, or + the name of a VM no agent reports): the state and
    # since when, by that VmId or name.
    unhealthy: Mapping[str, tuple[str, datetime]] = field(default_factory=dict)
    # ARM's acknowledge may carry an approval no live agent can (eventgrid.acknowledge).
    last_resort: bool = False

    def alive(self, vm_id: str, now: datetime) -> bool:
        vm = self.vms.get(vm_id)
        return (
            vm is not None and vm.last_seen is not None and now - vm.last_seen <= self.alive_within
        )


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    rule: str
    reason: str
    target: str | None = None
    recheck_at: datetime | None = None
    # Why, a line a step: each rule tried in order, then the gate and each budget (`explain`).
    explanation: tuple[str, ...] = ()
    # An ask: the target asked and until when it waits (also on the verdict its deadline
    # gave: AskedTarget set on a Hold or Approve means nobody answered in time).
    asked: str | None = None
    ask_deadline: datetime | None = None
    person: PersonDecision | None = None  # the person who decided, when one did
    override: bool = False  # a person approved it over a full budget
    pause: Pause | None = None  # the pause that stops its approval
    # A Defer that grants the drains of these VMs (a Prepare command to each): the budgets
    # let the event through, and its approval waits for their nodes to be drained.
    grant: tuple[str, ...] = ()


NO_RULE = "(no rule)"
# What a person's approval is checked as where a rule's would be (the drain gate).
PERSON = Rule(PERSON_RULE, Match(), Action("approve"))

# The seeds' sample: approve what a user asked for and freezes too short to notice.
DEFAULT_POLICY = Policy(
    rules=(
        Rule("user-initiated", Match(event_sources=frozenset({"user"})), Action("approve")),
        Rule(
            "short-freeze",
            Match(event_types=frozenset({"freeze"}), duration=Range(at_least=0, below=9)),
            Action("approve"),
        ),
        Rule("everything-else", Match(), Action("hold")),
    )
)


def evaluate(policy: Policy, fleet: FleetView, event: EventView, now: datetime) -> Verdict:  # noqa: PLR0911
    """The decision for `event` now, with its explanation; pure."""
    if event.status.lower() != "scheduled":
        why = f"the event is {event.status}: nothing to approve"
        return Verdict("Ignore", NO_RULE, why, explanation=(why,))
    notes: list[str] = [f"agents and Event Grid disagree: {line}" for line in event.disagreements]
    rule = None
    for candidate in policy.rules:
        miss = mismatch(candidate.match, fleet, event)
        if miss is None:
            rule = candidate
            notes.append(f"rule {candidate.name}: matches; its action is {_action(candidate)}")
            break
        notes.append(f"rule {candidate.name}: does not match: {miss}")
    if event.person is not None:
        return _person(policy, fleet, event, event.person, now, notes)
    if rule is None:
        return _with(Verdict("Hold", NO_RULE, "no rule matches: the event starts at NotBefore"),
                     notes)  # fmt: skip
    gate = _gate(rule, fleet, event, now, notes)
    if gate is not None and not gate.grant:
        notes.append(f"{rule.action.kind.replace('_', ' ')}: {gate.reason}")
        return _with(gate, notes)
    # An ask its deadline let through (nobody answered, on_deadline approve) says so.
    asked = rule.action.target if rule.action.kind == "ask" else None
    # A pause stops a drain's grant as it stops an approval: both start taking VMs down early.
    paused = _paused(fleet, event, now, rule.name, notes)
    if paused is not None:
        return replace(paused, asked=asked, ask_deadline=_ask_deadline(rule.action, event, now))
    if gate is not None:
        notes.append(f"{rule.action.kind.replace('_', ' ')}: {gate.reason}")
        return replace(_granting(policy, rule, fleet, event, now, gate, notes), asked=asked)
    blocked = check_budgets(policy.budgets, fleet, event, now, notes=notes)
    if blocked is not None:
        kind, why = blocked
        return _with(Verdict(kind, rule.name, why, asked=asked), notes)
    target = choose_target(fleet, event, now)
    if target is None:
        why = "no live VM reports the event to carry the approval"
        return _with(Verdict("Defer", rule.name, why, asked=asked), [*notes, why])
    verdict = Verdict("Approve", rule.name, _approve_reason(rule, fleet, target), target,
                      asked=asked)  # fmt: skip
    through = f"approval sent through {carrier_name(fleet, target)}"
    if target not in event.reporters and target != ARM_CARRIER:
        through += (
            f" ({fleet.vms[target].name} has not reported the event yet: the event names it and "
            "it is alive, so it sees the event at its next poll and reads its queue at once)"
        )
    return _with(verdict, [*notes, through])


def _person(  # noqa: PLR0917 - evaluate's arguments and the decision
    policy: Policy,
    fleet: FleetView,
    event: EventView,
    person: PersonDecision,
    now: datetime,
    notes: list[str],
) -> Verdict:
    """What a person decided, whatever the rules say: a hold holds; an approval goes through
    the pauses and the budgets like the policy's, unless it overrides the budgets."""
    said = f"{person.reason}" if person.reason else "no reason given"
    notes.append(f"{person.kind} by {person.by.who} at {person.at:%Y-%m-%d %H:%M:%S}Z: {said}; "
                 "a person's decision comes before the rules")  # fmt: skip
    if person.kind == "hold":
        why = f"held by {person.by.name}: the event starts at NotBefore ({said})"
        return _with(Verdict("Hold", PERSON_RULE, why, person=person), notes)
    paused = _paused(fleet, event, now, PERSON_RULE, notes)
    if paused is not None:
        return replace(paused, person=person)
    override = False
    blocked = check_budgets(policy.budgets, fleet, event, now, notes=notes)
    if blocked is not None and not person.override_budget:
        kind, why = blocked
        why = f"approved by {person.by.name}, and the budgets still apply: {why}"
        return _with(Verdict(kind, PERSON_RULE, why, person=person), notes)
    if blocked is not None:
        override = True
        notes.append(f"budget overridden by {person.by.who} (break-glass): {said}")
    # A node is drained before it is approved, whoever approves (the budgets were checked:
    # a grant takes the slot as an approval does).
    gate = _drain_gate(PERSON, fleet, event, now, notes)
    if gate is not None:
        if gate.grant:
            granted = _listed("drain granted on {names}; waiting for it",
                              _nodes(fleet, gate.grant))[0]  # fmt: skip
            notes.append(granted)
            gate = replace(gate, reason=granted)
        return _with(replace(gate, person=person, override=override), notes)
    target = choose_target(fleet, event, now)
    if target is None:
        why = "no live VM reports the event to carry the approval"
        return _with(Verdict("Defer", PERSON_RULE, why, person=person), [*notes, why])
    over = " over the budget" if override else ""
    name = carrier_name(fleet, target)
    why = f"approved by {person.by.name}{over} ({said}); approval sent through {name}"
    notes.append(f"approval sent through {name}")
    return _with(Verdict("Approve", PERSON_RULE, why, target, person=person, override=override),
                 notes)  # fmt: skip


def active_pause(fleet: FleetView, event: EventView, now: datetime) -> Pause | None:
    """The pause that stops approving `event` now, if any (a fleet-wide one first, then the
    one that lasts longest)."""
    vms = [fleet.vms[v] for v in (*event.affected, *event.possible) if v in fleet.vms]
    covering = [p for p in fleet.pauses if p.active(now) and p.covers(vms)]
    if not covering:
        return None
    return min(covering, key=lambda p: (p.scope is not None, p.until is not None,
                                        p.until or now))  # fmt: skip


def _paused(
    fleet: FleetView, event: EventView, now: datetime, rule: str, notes: list[str]
) -> Verdict | None:
    pause = active_pause(fleet, event, now)
    if pause is None:
        return None
    until = f"until {pause.until:%Y-%m-%d %H:%M:%S}Z" if pause.until else "until resumed"
    why = (f"paused ({pause.where}) by {pause.by.name} {until}: {pause.reason}; no early "
           "approval, by the policy or a person, while it lasts")  # fmt: skip
    return _with(Verdict("Defer", rule, why, recheck_at=pause.until, pause=pause), [*notes, why])


def _ask_deadline(action: Action, event: EventView, now: datetime) -> datetime | None:
    """Until when an ask waits: its deadline from when it was first asked (`now` when it has
    not been yet), never past NotBefore, when the platform starts the event anyway."""
    if action.kind != "ask":
        return None
    ends = [event.not_before] if event.not_before is not None else []
    if action.deadline is not None:
        ends.append((event.asked_at or now) + action.deadline)
    return min(ends, default=None)


def _ask_gate(rule: Rule, event: EventView, now: datetime, notes: list[str]) -> Verdict | None:
    action = rule.action
    deadline = _ask_deadline(action, event, now)
    until = f"{deadline:%Y-%m-%d %H:%M:%S}Z" if deadline else "NotBefore"
    if deadline is None or now < deadline:
        why = f"asked {action.target}; waiting for a person's answer until {until}, then " + (
            action.on_deadline if deadline != event.not_before else "the event starts"
        )
        return Verdict("Ask", rule.name, why, recheck_at=deadline, asked=action.target,
                       ask_deadline=deadline)  # fmt: skip
    if action.on_deadline == "approve" and deadline != event.not_before:
        notes.append(f"nobody answered {action.target} by {until}: approved (on_deadline approve)")
        return None
    why = f"nobody answered {action.target} by {until}: the event starts at NotBefore"
    return Verdict("Hold", rule.name, why, asked=action.target, ask_deadline=deadline)


def _granting(  # noqa: PLR0917 - the evaluation's state, handed on
    policy: Policy,
    rule: Rule,
    fleet: FleetView,
    event: EventView,
    now: datetime,
    gate: Verdict,
    notes: list[str],
) -> Verdict:
    """`gate` waits for drains not granted yet (`gate.grant`): granted now if the budgets let
    the event through, as an approval would be (the drain takes the capacity away)."""
    blocked = check_budgets(policy.budgets, fleet, event, now, notes=notes)
    if blocked is not None:
        kind, why = blocked
        return _with(Verdict(kind, rule.name, why, recheck_at=gate.recheck_at), notes)
    nodes = _listed("drain granted on {names}; waiting for it", _nodes(fleet, gate.grant))[0]
    notes.append(nodes)
    return _with(replace(gate, reason=nodes), notes)


def _with(verdict: Verdict, notes: list[str]) -> Verdict:
    return replace(verdict, explanation=tuple(notes))


def _action(rule: Rule) -> str:
    action = rule.action
    if action.kind == "approve_when_ready" and action.deadline is not None:
        return f"approve when ready (deadline {action.deadline}, then {action.on_deadline})"
    if action.kind == "ask":
        deadline = (
            f"deadline {action.deadline}, then {action.on_deadline}"
            if action.deadline
            else "until NotBefore"
        )
        return f"ask {action.target} ({deadline})"
    return action.kind.replace("_", " ")


def mismatch(match: Match, fleet: FleetView, event: EventView) -> str | None:  # noqa: PLR0911
    """Why `match` does not hold for `event`, in words; None when it does."""
    if not _in(match.event_types, event.event_type):
        return f"EventType {event.event_type} is not {_one_of(match.event_types)}"
    if not _in(match.event_sources, event.event_source):
        return f"EventSource {event.event_source} is not {_one_of(match.event_sources)}"
    if not _in(match.statuses, event.status):
        return f"EventStatus {event.status} is not {_one_of(match.statuses)}"
    if match.duration is not None and not match.duration.contains(event.duration):
        return f"DurationInSeconds {event.duration} is outside {_range(match.duration)}"
    if not match.about_vms:
        return None
    # VM conditions must hold for every affected VM, so a rule meant for one tier never
    # approves an event that also takes down a VM of another.
    if event.unresolved:
        return f"Resources name {', '.join(event.unresolved)}, not resolved to one known VM"
    vms = [fleet.vms[v] for v in event.affected if v in fleet.vms]
    if not vms:
        return "no VM of the event is known, and the rule has VM conditions"
    failing = next((vm for vm in vms if not vm_matches(match, vm)), None)
    if failing is not None:
        return f"VM {failing.name} does not meet its VM conditions"
    return None


def _one_of(values: frozenset[str]) -> str:
    return " or ".join(sorted(values))


def _range(bounds: Range) -> str:
    low = "" if bounds.at_least is None else f"{bounds.at_least} <= "
    high = "" if bounds.below is None else f" < {bounds.below}"
    return f"{low}d{high}"


def vm_matches(match: Match, vm: VmView) -> bool:
    tags = {k.lower(): v for k, v in vm.tags.items()}
    return (
        all(tags.get(k.lower()) == v for k, v in match.tags)
        and _in(match.scale_sets, vm.scale_set)
        and _in(match.resource_groups, vm.resource_group)
        and _in(match.locations, vm.location)
        and _in(match.zones, vm.zone)
        and (
            not match.names
            or any(fnmatch.fnmatchcase(vm.name.lower(), p.lower()) for p in match.names)
        )
    )


def _in(allowed: frozenset[str], value: str | None) -> bool:
    return not allowed or (value is not None and value.lower() in allowed)


def _gate(
    rule: Rule, fleet: FleetView, event: EventView, now: datetime, notes: list[str]
) -> Verdict | None:
    """Hold or Defer when the rule's action does not allow approval yet; None when it does
    (a gate that lets the event through with something to say adds it to `notes`)."""
    action = rule.action
    if action.kind == "hold":
        return Verdict("Hold", rule.name, f"rule {rule.name} holds: the event starts at NotBefore")
    if action.kind == "approve_when_ready":
        return _ready_gate(rule, fleet, event, now, notes)
    if action.kind == "approve_in_window":
        closed = _window_gate(rule, event, now)
        if closed is not None:
            return closed
    if action.kind == "ask":
        unanswered = _ask_gate(rule, event, now, notes)
        if unanswered is not None:
            return unanswered
    return _drain_gate(rule, fleet, event, now, notes)


def drains(fleet: FleetView, event: EventView, vm_id: str, now: datetime) -> bool:
    """Whether `vm_id`'s node is drained for `event` before the event is approved: its live
    agent drains on a grant and did not refuse this event's (`EventView.no_drain`). Not
    for a Spot eviction: its agent drains at once (30 s notice), with no grant to wait for."""
    vm = fleet.vms.get(vm_id)
    return (
        vm is not None
        and vm.drains_on_grant
        and vm_id not in event.no_drain
        and event.event_type.lower() != "preempt"
        and fleet.alive(vm_id, now)
    )


def _drain_gate(
    rule: Rule, fleet: FleetView, event: EventView, now: datetime, notes: list[str]
) -> Verdict | None:
    """An approving action waits for the drains of the event's nodes, with no deadline of its
    own: the agent's (kubernetes.give_up_before) decides, and says so in its records."""
    waiting = [v for v in event.affected if v not in event.ready and drains(fleet, event, v, now)]
    if not waiting:
        return None
    notes.extend(_drain_lines(fleet, event, waiting, now))
    failed = _failed_drains(fleet, event, waiting)
    if failed is not None:
        return Verdict("Hold", rule.name, failed)
    why = f"waiting for drains: {'; '.join(_drain_parts(fleet, event, waiting))}"
    return Verdict("Defer", rule.name, why, grant=_ungranted(event, waiting))


def _ungranted(event: EventView, waiting: Iterable[str]) -> tuple[str, ...]:
    return tuple(v for v in waiting if v not in event.granted)


def _failed_drains(fleet: FleetView, event: EventView, waiting: Iterable[str]) -> str | None:
    """Why the event is held when a drain of `waiting` ended without its node ready (it gave
    up with on_deadline hold, or failed); None when none did."""
    failed = [v for v in waiting if (d := event.drains.get(v)) is not None and d.failed]
    said = _listed("the drain on {names} ended without the node ready", _nodes(fleet, failed))
    return f"{said[0]} (see its Hook record): the event starts at NotBefore" if said else None


_DRAIN_READY = frozenset({"Drained", "GaveUp"})  # a drain that ended (GaveUp: failed, or not)


def _drain_parts(fleet: FleetView, event: EventView, waiting: Iterable[str]) -> list[str]:
    # Drained and not ready: its agent's prepare hook runs after the drain (issue 38).
    hooking = [
        v
        for v in waiting
        if (d := event.drains.get(v)) and d.status in _DRAIN_READY and not d.failed
    ]
    blocked = [v for v in waiting if (d := event.drains.get(v)) and d.status == "Blocked"]
    rest = [v for v in waiting if v not in blocked and v not in hooking and v in event.granted]
    ungranted = [
        v for v in waiting if v not in blocked and v not in hooking and v not in event.granted
    ]
    return [
        *_listed(
            "prepare hook not yet succeeded after the drain on {names}", _nodes(fleet, hooking)
        ),
        *_listed("drain blocked on {names}", _nodes(fleet, blocked)),
        *_listed("drain not finished on {names}", _nodes(fleet, rest)),
        *_listed("drain not granted yet on {names}", _nodes(fleet, ungranted)),
    ]


def _nodes(fleet: FleetView, vm_ids: Iterable[str]) -> list[str]:
    """The node names of VMs (their VM names where their agents name no node)."""
    found = (fleet.vms.get(v) for v in vm_ids)
    return [vm.node_name or vm.name for vm in found if vm is not None]


def _drain_lines(
    fleet: FleetView, event: EventView, waiting: Iterable[str], now: datetime
) -> list[str]:
    """A line for each blocked drain of `waiting`: its node, for how long, and each pod that
    holds it up with the PodDisruptionBudget that refused its eviction."""
    lines = []
    for vm_id in waiting:
        drain = event.drains.get(vm_id)
        if drain is None or drain.status != "Blocked":
            continue
        node = _nodes(fleet, [vm_id])[0]
        since = f" {_took(now - drain.blocked_since)}" if drain.blocked_since else ""
        pods = [_pod(b) for b in drain.blockers]
        if len(pods) > LISTED_NAMES:
            pods[LISTED_NAMES:] = [f"and {len(pods) - LISTED_NAMES} more"]
        lines.append(f"drain on {node} blocked{since}: {', '.join(pods) or 'no pod named'}")
    return lines


def _took(span: timedelta) -> str:
    seconds = max(0, int(span.total_seconds()))
    return f"{seconds // 60} min" if seconds >= 60 else f"{seconds} s"


def _pod(blocker: Blocker) -> str:
    why = f"PDB {blocker.pdb} refused eviction" if blocker.pdb else blocker.reason or "no reason"
    return f"pod {blocker.namespace}/{blocker.pod} ({why})"


def _ready_gate(
    rule: Rule, fleet: FleetView, event: EventView, now: datetime, notes: list[str]
) -> Verdict | None:
    """Every affected VM's prepare hook succeeded, or the deadline decides.

    A VM whose agent says it has no prepare hook never gets ready: with on_deadline hold
    the event is held at once rather than at the deadline, with on_deadline approve it is
    not waited for (docs/policy.md#approve_when_ready-and-vms-without-a-prepare-hook). An
    agent that does not say (older than HasPrepareHook) may have one: waited for.
    """
    waiting = [v for v in event.affected if v not in event.ready]
    if not waiting and not event.unresolved:
        return None
    hooks = {v: fleet.vms[v].prepare_hook if v in fleet.vms else None for v in waiting}
    # An agent that refused the drain's grant (Prepare) drains nothing for the event: as if it
    # had no prepare hook, so the event is not waited on for ever.
    refused = [v for v in waiting if v in event.no_drain and hooks[v] is not False]
    none = [v for v in waiting if hooks[v] is False or v in refused]
    blocking = [v for v in waiting if v not in none]
    draining = [v for v in blocking if drains(fleet, event, v, now)]
    notes.extend(_drain_lines(fleet, event, draining, now))
    failed = _failed_drains(fleet, event, draining)
    if failed is not None:
        return Verdict("Hold", rule.name, failed)
    parts = [
        *_drain_parts(fleet, event, draining),
        *_listed("prepare hook not yet succeeded on {names}",
                 [v for v in blocking if hooks[v] and v not in draining], fleet),
        *_listed("{VM} {names} {has} not said whether {it} {has} a prepare hook",
                 [v for v in blocking if hooks[v] is None], fleet),
        *_listed("{names} not resolved to one known VM", event.unresolved),
    ]  # fmt: skip
    no_hook = [
        *_listed("no prepare hook on {VM} {names}", [v for v in none if v not in refused], fleet),
        *_listed("{names} refused the drain (Prepare)", refused, fleet),
    ]
    total = len(event.affected) + len(event.unresolved)
    if none and rule.action.on_deadline == "hold":
        why = f"{'; '.join(no_hook)}: never ready, so the event starts at NotBefore"
        if parts:
            why += f" ({'; '.join(parts)})"
        return Verdict("Hold", rule.name, why)
    if none:
        notes.append(f"{'; '.join(no_hook)}: not waited for (on_deadline approve)")
    if not parts:
        return None
    count = len(blocking) + len(event.unresolved)
    state = f"{count} of {total} VMs not ready: {'; '.join([*parts, *no_hook])}"
    grant = _ungranted(event, draining)
    # Without a deadline the rule waits for the hooks until NotBefore makes it moot.
    deadline = event.first_seen + rule.action.deadline if rule.action.deadline else None
    if deadline is None or now < deadline:
        return Verdict("Defer", rule.name, f"waiting for prepare hooks: {state}",
                       recheck_at=deadline, grant=grant)  # fmt: skip
    return _past_deadline(rule, state, grant if draining else None, notes)


def _past_deadline(
    rule: Rule, state: str, grant: tuple[str, ...] | None, notes: list[str]
) -> Verdict | None:
    """approve_when_ready past its deadline with VMs not ready (`state`); `grant`: the drains
    not granted yet when some VM drains (None: none does)."""
    if rule.action.on_deadline == "approve" and grant is not None:
        # A node is not approved with its pods on it: the drain's own deadline decides.
        why = (f"prepare deadline passed with {state}: the drains are waited for (their own "
               "deadline, kubernetes.give_up_before, decides)")  # fmt: skip
        return Verdict("Defer", rule.name, why, grant=grant)
    if rule.action.on_deadline == "approve":
        notes.append(f"prepare deadline passed with {state}: approved anyway (on_deadline approve)")
        return None
    why = f"prepare deadline passed with {state}: the event starts at NotBefore"
    return Verdict("Hold", rule.name, why)


LISTED_NAMES = 5  # a placement group's 100 names would bury the reason


def _listed(template: str, items: Iterable[str], fleet: FleetView | None = None) -> list[str]:
    """`template` said of the VMs `items` (VmIds named as their VMs, or names), a few of them
    by name; nothing when there are none."""
    names = [fleet.vms[v].name if fleet and v in fleet.vms else v for v in items]
    if not names:
        return []
    shown = ", ".join(names[:LISTED_NAMES])
    if len(names) > LISTED_NAMES:
        shown += f" and {len(names) - LISTED_NAMES} more"
    one = len(names) == 1
    return [template.format(names=shown, VM="VM" if one else "VMs", has="has" if one else "have",
                            it="it" if one else "they")]  # fmt: skip


def _window_gate(rule: Rule, event: EventView, now: datetime) -> Verdict | None:
    zone = ZoneInfo(rule.action.timezone)
    if in_window(rule.action.windows, now, zone):
        return None
    opens = next_window_start(rule.action.windows, now, zone)
    if opens is None or (event.not_before is not None and opens >= event.not_before):
        why = "no maintenance window opens before NotBefore: the event starts at NotBefore"
        return Verdict("Hold", rule.name, why)
    return Verdict(
        "Defer",
        rule.name,
        f"outside the maintenance window until {opens:%a %H:%M}Z",
        recheck_at=opens,
    )


def in_window(windows: tuple[Window, ...], now: datetime, zone: ZoneInfo) -> bool:
    local = now.astimezone(zone)
    today, yesterday, clock = local.weekday(), (local.weekday() - 1) % 7, local.time()
    for w in windows:
        if w.start < w.end and today in w.days and w.start <= clock < w.end:
            return True
        # A window that wraps past midnight belongs to the day it opened.
        if w.start >= w.end and (
            (today in w.days and clock >= w.start) or (yesterday in w.days and clock < w.end)
        ):
            return True
    return False


def next_window_start(
    windows: tuple[Window, ...], now: datetime, zone: ZoneInfo
) -> datetime | None:
    local = now.astimezone(zone)
    starts = []
    for offset in range(8):
        day = local.date() + timedelta(days=offset)
        for w in windows:
            if day.weekday() in w.days:
                begin = datetime.combine(day, w.start, tzinfo=zone)
                starts += [s for s in _instants(begin) if s > now]
    return min(starts).astimezone(now.tzinfo) if starts else None


def _instants(begin: datetime) -> list[datetime]:
    """When a local wall time happens, in UTC: once, or twice in the hour a DST change repeats.

    Compared as instants: Python compares datetimes sharing a tzinfo by wall time alone, which
    put a window start in the first pass of the repeated hour "after" a now in the second pass.
    """
    first = begin.astimezone(timezone.utc)
    second = begin.replace(fold=1).astimezone(timezone.utc)
    return [first, second] if second > first else [first]


def group_key(group: str, vm: VmView) -> str | None:
    """The group `vm` belongs to for a budget over `group`; None when it belongs to none."""
    if group.startswith("tag:"):
        wanted = group[4:].lower()
        value = next((v for k, v in vm.tags.items() if k.lower() == wanted), None)
        return None if value is None else f"{group[4:]}={value}"
    # Resource group names repeat across subscriptions (rg-prod in each), and a zone number
    # is each subscription's own mapping of the region's zones: every key starts with the
    # subscription, or two groups of the same name share one budget.
    sub = vm.subscription_id or "-"
    if group in ("fault_domain", "update_domain"):
        number = vm.fault_domain if group == "fault_domain" else vm.update_domain
        # IMDS does not name the availability set, so a domain is scoped by group and scale set.
        scope = f"{sub}/{vm.resource_group}/{vm.scale_set or 'availability set'}"
        return None if number is None else f"{scope}/{group.replace('_', ' ')} {number}"
    scale_set = f"{sub}/{vm.resource_group}/{vm.scale_set}" if vm.scale_set else None
    if group == "node_pool":
        # A heartbeat's pool is the node's own word (a label): it never reaches past the VM's
        # scale set, or a node could fill or enlarge another pool's group (issue 37), and two
        # clusters' pools of one name in one resource group would merge. AKS's tag, which
        # Azure keeps, names the pool where the VM has one. A VM that names no pool is in its
        # scale set's group.
        pool = pool_of(vm)
        if pool is None:
            return scale_set
        return f"{scale_set or f'{sub}/{vm.resource_group}'}/pool {pool}"
    keys = {
        "fleet": "fleet",
        "scale_set": scale_set,
        "zone": f"{sub}/{vm.location}/zone {vm.zone}" if vm.zone else None,
        "resource_group": f"{sub}/{vm.resource_group}" if vm.resource_group else None,
    }
    return keys.get(group)


# AKS tags each node pool's scale set (and a virtual-machines pool's VMs) with the pool's name;
# a VM sees its tags in IMDS and cannot change them.
AKS_POOL_TAG = "aks-managed-poolName"


def _aks_pool(vm: VmView) -> str | None:
    return next((v for k, v in vm.tags.items() if k.lower() == AKS_POOL_TAG.lower() and v), None)


def pool_of(vm: VmView) -> str | None:
    """The node pool `vm` counts in: AKS's tag where the VM has it, else its heartbeat's."""
    return _aks_pool(vm) or vm.node_pool


def pool_disputes(vms: Iterable[VmView]) -> list[str]:
    """What the node pools the heartbeats name and what the VMs' scale sets and AKS tags prove
    disagree on, a sentence each (the consumer logs them at WARNING): a pool named by the nodes
    of more than one scale set (or of one and of none) of a resource group, and a VM whose
    heartbeat names a pool its AKS tag does not. Sorted, so the same fleet says the same."""
    said: list[str] = []
    named: dict[tuple[str | None, str, str], dict[str | None, list[VmView]]] = {}
    for vm in vms:
        tag = _aks_pool(vm)
        if tag and vm.node_pool and vm.node_pool.lower() != tag.lower():
            said.append(f"VM {vm.name} names node pool {vm.node_pool}, but its AKS tag "
                        f"{AKS_POOL_TAG} says {tag}: it counts in pool {tag}")  # fmt: skip
        pool = pool_of(vm)
        if pool is not None:
            where = (vm.subscription_id, (vm.resource_group or "").lower(), pool.lower())
            named.setdefault(where, {}).setdefault(
                vm.scale_set.lower() if vm.scale_set else None, []
            ).append(vm)
    for (sub, _, _), by_set in named.items():
        if len(by_set) < 2:
            continue
        first = next(iter(by_set.values()))[0]
        sets = ", ".join(
            sorted(
                f"{members[0].scale_set or 'no scale set'} "
                f"({_listed('{names}', sorted(v.name for v in members))[0]})"
                for members in by_set.values()
            )
        )
        said.append(f"node pool {pool_of(first)} of {sub or '-'}/{first.resource_group} is "
                    f"named by the nodes of more than one scale set: {sets}; a pool is one "
                    "scale set's, so each counts in a node_pool budget as a pool of its "
                    "own")  # fmt: skip
    return sorted(said)


def _left_out(
    budget: Budget,
    fleet: FleetView,
    index: Mapping[str, frozenset[str]],
    key: str,
    now: datetime,
) -> list[str]:
    """A line naming the live VMs whose heartbeats name the pool of node_pool group `key` and
    that do not count in it, each with why: of another scale set (or none), or AKS's tag says
    otherwise; none when there are none. Found among the groups (a few per resource group),
    not among the fleet's VMs."""
    sample = next((fleet.vms[v] for v in index.get(key, ()) if v in fleet.vms), None)
    pool = None if sample is None else pool_of(sample)
    if sample is None or pool is None:
        return []
    home = (sample.subscription_id, (sample.resource_group or "").lower())
    mine = (sample.scale_set or "").lower()
    out: list[tuple[str, str]] = []
    for other, ids in index.items():
        them = next((fleet.vms[v] for v in ids if v in fleet.vms), None)
        if other == key or them is None:
            continue
        if (them.subscription_id, (them.resource_group or "").lower()) != home:
            continue
        for vm_id in sorted(ids):
            vm = fleet.vms.get(vm_id)
            if vm is None or not fleet.alive(vm_id, now):
                continue
            if (vm.node_pool or "").lower() != pool.lower():
                continue
            if (vm.scale_set or "").lower() != mine:
                out.append((vm.name, f"in scale set {vm.scale_set}" if vm.scale_set
                            else "in no scale set"))  # fmt: skip
            else:
                out.append((vm.name, f"its AKS tag says {_aks_pool(vm)}"))
    if not out:
        return []
    shown = ", ".join(f"{name} (names pool {pool}, {why})"
                      for name, why in sorted(out)[:LISTED_NAMES])  # fmt: skip
    if len(out) > LISTED_NAMES:
        shown += f" and {len(out) - LISTED_NAMES} more"
    return [f"budget {budget.name}: {key} does not count what only a heartbeat says; left "
            f"out: {shown}"]  # fmt: skip


def check_budgets(
    budgets: tuple[Budget, ...],
    fleet: FleetView,
    event: EventView,
    now: datetime,
    *,
    notes: list[str] | None = None,
) -> tuple[VerdictKind, str] | None:
    """("Defer"|"Hold", why) when approving `event` would break a budget; None when it fits.

    A group's size counts its live members (heard from within `fleet.alive_within`) and
    the members some event impacts: a VM deleted yesterday does not make the group larger.
    An ambiguous name counts as every VM it may be (`event.possible`); a name no VM is known
    by, in each group that can hold a VM of the scopes it may be in (`can_hold`).
    """
    others, strays = _others(fleet, event, now)
    counted = others | set(event.affected) | set(event.possible)
    unknown = set(event.unknown)
    for budget in budgets:
        index = (fleet.groups or {}).get(budget.group)
        if index is None:
            index = group_index((budget.group,), fleet.vms)[budget.group]
        members = _members(budget.group, fleet, event, index, counted, now)
        if unknown and not any(holds for _, _, holds in members.values()):
            verdict = _unheld(budget, event, unknown, strays, notes)
            if verdict is not None:
                return verdict
        for key, (group, everyone, holds) in members.items():
            # A name no VM is known by may be a VM of any group its scopes can hold: counted
            # in each (worst case).
            mine = {v for v in (*event.affected, *event.possible) if v in group}
            if holds:
                mine |= unknown
            if not mine:
                continue
            limit = budget.limit(len(group) + (len(unknown) if budget.group == "fleet" else 0))
            if len(mine) > limit:
                why = (
                    f"budget {budget.name}: the event alone impacts {len(mine)} VMs of {key}, "
                    f"more than the {limit} allowed: it starts at NotBefore"
                )
                _note(notes, why)
                return "Hold", why
            # Other events' VMs that no agent has reported are named, not in any group: in
            # the worst case in this one if it can hold them, as for this event.
            elsewhere = {
                name
                for names, scopes in strays
                if _holds(budget.group, fleet, everyone, scopes)
                for name in names
            }
            busy = (others if budget.group == "fleet" else others & (group | elsewhere)) - mine
            cordoned = _cordoned(fleet, busy)
            if budget.group == "node_pool" and notes is not None:
                notes += _left_out(budget, fleet, index, key, now)
            if len(busy | mine) > limit:
                why = (
                    f"budget {budget.name}: {key} has {len(busy)} of {len(group)} VMs impacted"
                    f"{cordoned}; {len(mine)} more would exceed {limit}"
                )
                _note(notes, why)
                return "Defer", why
            _note(notes, f"budget {budget.name}: {key} has {len(busy)} of {len(group)} VMs "
                         f"impacted{cordoned}; {len(mine)} more fit the limit of "
                         f"{limit}")  # fmt: skip
    if not budgets:
        _note(notes, "no budget applies")
    return None


def _members(  # noqa: PLR0917 - check_budgets' parts
    kind: str,
    fleet: FleetView,
    event: EventView,
    index: Mapping[str, frozenset[str]],
    counted: set[str],
    now: datetime,
) -> dict[str, tuple[set[str], frozenset[str], bool]]:
    """The groups of kind `kind` `event` can break: key -> (its live and impacted members,
    all its members, whether it can hold the event's names no VM is known by).

    Only the event's own groups can be broken by it, and those that can hold a name of it no
    VM is known by; a group counts its live members and those some event impacts. A group
    whose known members are all silent still holds such names (agent-less VMs Event Grid told
    of, issue 36): it is checked."""
    wanted = _keys(kind, fleet, event)
    members: dict[str, tuple[set[str], frozenset[str], bool]] = {}
    for key, everyone in index.items():
        holds = bool(event.unknown) and _holds(kind, fleet, everyone, event.scopes)
        if key in wanted or holds:
            group = {v for v in everyone if v in counted or fleet.alive(v, now)}
            if group or holds:
                members[key] = (group, everyone, holds)
    return members


def _unheld(
    budget: Budget,
    event: EventView,
    unknown: set[str],
    strays: list[tuple[frozenset[str], frozenset[Scope]]],
    notes: list[str] | None,
) -> tuple[VerdictKind, str] | None:
    """`budget` for the names no VM is known by that no known group can hold: VMs of a set no
    agent ever reported (issue 36: Event Grid tells their events, ARM can approve them). In
    the worst case they are one group with the other events' such names that may share one
    of their scopes (any scope where either has none)."""
    where = set(event.scopes)
    busy = {name for names, scopes in strays if not where or not scopes or where & scopes
            for name in names} - unknown  # fmt: skip
    limit = budget.limit(len(busy | unknown))
    names = ", ".join(sorted(unknown))
    if len(unknown) > limit:
        why = (f"budget {budget.name}: the event alone impacts {len(unknown)} VMs no agent "
               f"reports ({names}), more than the {limit} allowed: it starts at "
               "NotBefore")  # fmt: skip
        _note(notes, why)
        return "Hold", why
    if len(busy | unknown) > limit:
        why = (f"budget {budget.name}: {len(busy)} VMs no agent reports are impacted where "
               f"{names} may be; {len(unknown)} more would exceed {limit}")  # fmt: skip
        _note(notes, why)
        return "Defer", why
    _note(notes, f"budget {budget.name}: {len(busy)} VMs no agent reports are impacted where "
                 f"{names} may be; {len(unknown)} more fit the limit of {limit}")  # fmt: skip
    return None


def _cordoned(fleet: FleetView, busy: Iterable[str]) -> str:
    """Which of the impacted VMs `busy` count because their nodes were cordoned by someone
    else (`cordoned_impact`), said in a budget's explanation; "" when none."""
    nodes = [v for v in busy if v in fleet.impacted.get(CORDONED + v, ())]
    held = [v for v in busy if v in fleet.impacted.get(HELD + v, ()) and v not in nodes]
    sick = sorted(v for v in busy if v in fleet.unhealthy and v not in nodes and v not in held)
    said = [
        *(f"{fleet.vms[v].name if v in fleet.vms else v} {fleet.unhealthy[v][0].lower()} since "
          f"{fleet.unhealthy[v][1]:%H:%M} (resource health)" for v in sick),
        *_listed("{names} cordoned by someone else", sorted(nodes), fleet),
        *_listed("{names} still cordoned by se-bridge's drain until {it} {has} been "
                 "uncordoned", sorted(held), fleet),
    ]  # fmt: skip
    return f" ({'; '.join(said)})" if said else ""


def cordoned_impact(vms: Iterable[VmView]) -> dict[str, frozenset[str]]:
    """What cordoned nodes impact, as pseudo events of FleetView.impacted: a node nobody may
    schedule on is capacity gone, in every budget. Cordoned by someone else
    (`cordoned:<VmId>`), or still held by se-bridge's own drain (`held:<VmId>`, see HELD)."""
    impact: dict[str, frozenset[str]] = {}
    for vm in vms:
        if vm.cordoned:
            impact[CORDONED + vm.vm_id] = frozenset((vm.vm_id,))
        if vm.held:
            impact[HELD + vm.vm_id] = frozenset((vm.vm_id,))
    return impact


def _others(
    fleet: FleetView, event: EventView, now: datetime
) -> tuple[set[str], list[tuple[frozenset[str], frozenset[Scope]]]]:
    """What the other events impact, and per other event the names it counts that no VM is
    known by, with where they may be."""
    others: set[str] = set()
    strays: list[tuple[frozenset[str], frozenset[Scope]]] = []
    for event_id, vms in fleet.impacted.items():
        if event_id.startswith(HELD) and not fleet.alive(event_id[len(HELD) :], now):
            continue
        if event_id != event.event_id:
            others |= vms
            names = frozenset(v for v in vms if v not in fleet.vms)
            if names:
                strays.append((names, fleet.reach.get(event_id, frozenset())))
    return others, strays


def can_hold(kind: str, vm: VmView, scopes: Iterable[Scope]) -> bool:
    """Whether the group of kind `kind` that `vm` is in can hold a VM of one of `scopes`,
    whose zone, domains and tags are not known (no scope given: a VM of any scope).

    Every VM of a group but a `fleet` or `tag:NAME` one shares its subscription (the key
    starts with it, `group_key`); a resource group's and a node pool's also its resource
    group; a scale set's and a domain's the whole scope (a domain outside scale sets is the
    resource group's availability-set VMs). Of a zone only the subscription is known. A scope
    missing its subscription or resource group (a VM whose identity is not known yet) may be
    anywhere.
    """
    given = tuple(scopes)
    if not given or kind == "fleet" or kind.startswith("tag:"):
        return True
    # A node pool of VMs outside scale sets may hold any of its resource group's.
    pooled_apart = kind == "node_pool" and not vm.scale_set
    width = 2 if pooled_apart else {"zone": 1, "resource_group": 2}.get(kind, 3)
    mine = scope_of(vm)[:width]
    return any(None in scope[:2] or scope[:width] == mine for scope in given)


def _holds(kind: str, fleet: FleetView, group: Iterable[str], scopes: Iterable[Scope]) -> bool:
    """`can_hold` for a group of VmIds of `fleet.vms` (all of one group: any one tells)."""
    sample = next((fleet.vms[v] for v in group if v in fleet.vms), None)
    return sample is None or can_hold(kind, sample, scopes)


def budget_use(budgets: tuple[Budget, ...], fleet: FleetView, now: datetime) -> dict[str, float]:
    """Per budget: impacted VMs over the limit in its fullest group (the metrics' gauge)."""
    impacted = {vm for vms in fleet.impacted.values() for vm in vms}
    members = [v for v in fleet.vms.values() if v.vm_id in impacted or fleet.alive(v.vm_id, now)]
    use: dict[str, float] = {}
    for budget in budgets:
        groups = _groups(budget.group, members).values()
        ratios = [len(group & impacted) / budget.limit(len(group)) for group in groups]
        use[budget.name] = max(ratios, default=0.0)
    return use


def _note(notes: list[str] | None, line: str) -> None:
    if notes is not None:
        notes.append(line)


def group_index(
    kinds: Iterable[str], vms: Mapping[str, VmView]
) -> dict[str, dict[str, frozenset[str]]]:
    """Per budget group kind: each group's key and every known VM in it, live or not, in the
    order of `vms` (so explanations list groups in the same order every time)."""
    index: dict[str, dict[str, frozenset[str]]] = {}
    for kind in set(kinds):
        index[kind] = {key: frozenset(ids) for key, ids in _groups(kind, vms.values()).items()}
    return index


def _keys(kind: str, fleet: FleetView, event: EventView) -> set[str]:
    keys = set()
    for vm_id in (*event.affected, *event.possible):
        vm = fleet.vms.get(vm_id)
        key = None if vm is None else group_key(kind, vm)
        if key is not None:
            keys.add(key)
    return keys


def _groups(group: str, vms: Iterable[VmView]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for vm in vms:
        key = group_key(group, vm)
        if key is not None:
            out.setdefault(key, set()).add(vm.vm_id)
    return out


def choose_target(fleet: FleetView, event: EventView, now: datetime) -> str | None:
    """The VM to carry the approval, one not yet asked: a live VM the event names, then a
    live neighbour that reports it; only when none can, ARM's acknowledge (`ARM_CARRIER`,
    when `fleet.last_resort`): a live agent is always preferred.

    A VM the event names carries it even before its own report is folded in, as long as it
    is alive and the event is young (`UNREPORTED_CARRIER_WITHIN`): Azure shows an event to
    every VM of the availability set or placement group at once, and the named VM's agent
    reads its queue at the fast interval (commands.poll_interval) from its next IMDS poll on,
    while a neighbour reads every commands.others_interval (10 s). Which VM's record happens
    to be read first must not decide how late the approval lands (issue 27). A VM that was
    asked without having reported is given a shorter time to answer
    (bridge.consumer.ledger.UNREPORTED_TARGET_TIMEOUT) before a reporter is asked.
    """
    affected = set(event.affected)
    reporters = set(event.reporters)
    young = now - event.first_seen <= UNREPORTED_CARRIER_WITHIN
    named = [v for v in event.affected if v not in reporters and young]
    candidates = [
        v for v in (*event.reporters, *named) if v not in event.tried and fleet.alive(v, now)
    ]
    if not candidates:
        # No agent can: ARM's acknowledge, once, for an event Azure told of (Event Grid gives
        # the resource its acknowledge is addressed to).
        arm = fleet.last_resort and event.azure is not None and ARM_CARRIER not in event.tried
        return ARM_CARRIER if arm else None

    def preference(vm_id: str) -> tuple[bool, bool, str]:
        vm = fleet.vms[vm_id]
        return (vm_id not in affected, vm_id not in reporters, vm.name.lower())

    return min(candidates, key=preference)


def carrier_name(fleet: FleetView, target: str) -> str:
    """How a verdict's carrier is said: the VM's name, or ARM's acknowledge."""
    if target == ARM_CARRIER:
        return "ARM's acknowledge (no live agent can carry it)"
    return fleet.vms[target].name


def _approve_reason(rule: Rule, fleet: FleetView, target: str) -> str:
    name = carrier_name(fleet, target)
    return f"rule {rule.name} ({rule.action.kind.replace('_', ' ')}); approval sent through {name}"
