"""The approval policy's model: what a policy says (rules, actions, budgets), what it looks at
(an event, the fleet, a person's decision, a pause) and what it decides (a Verdict).

Policy files are read by `bridge.policy.file`; the model here is what they become.
`bridge.policy.evaluation.evaluate` decides, one gate a module (`bridge.policy.gates`), with the
budgets and their groups (`bridge.policy.budgets`, `bridge.policy.groups`) and the carrier
choice (`bridge.policy.carrier`) beside them. These types import nothing of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from typing import Literal

ActionKind = Literal["approve", "approve_when_ready", "approve_in_window", "hold", "ask"]


# Release is the consumer's, never evaluate's: a budget slot freed though no VM said the
# event ended (its VMs are gone). Ask: a person is asked and has not answered yet.
VerdictKind = Literal["Approve", "Defer", "Hold", "Ignore", "Release", "Ask"]


# The DecisionRule of what a person decided (bridge.consumer.people.operatorlog), not a rule.
PERSON_RULE = "(person)"


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
# A guest patch run of Azure Update Manager (issue 40): its VMs count in every budget as
# impacted by this pseudo event + the run's id from its start to its post-event (or its bound).
PATCH = "patch:"
# The carrier of last resort (issue 36): ARM's acknowledge, when no live agent can carry an
# approval (bridge.policy.carrier.choose_target). It stands where a VmId would as the target of
# a verdict, a ledger entry and the command kept for a resend; no channel ever sees it
# (bridge.consumer.armcarrier).
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
class Rebalance:
    """What the policy does on a Spot rebalance recommendation (an Advisory, never approved):
    `drain` the Kubernetes node of each VM it names at once, a drain granted within the
    budgets as any drain is; `notify` the notification target told of it, once (None:
    nobody) (docs/policy.md#spot-rebalance-recommendations)."""

    drain: bool = False
    notify: str | None = None


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...]
    budgets: tuple[Budget, ...] = ()
    source: str = "built-in default"
    # None: a recommendation is recorded and nothing more (the agent's hook may still run).
    rebalance: Rebalance | None = None


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
    """Who decides, as the API or the loopback page proved it
    (bridge.consumer.people.operatorlog)."""

    object_id: str  # Entra oid, or "local:<os user>" on the standalone loopback page
    name: str  # display name / UPN

    @property
    def who(self) -> str:
        return f"{self.name} ({self.object_id})"


@dataclass(frozen=True)
class PersonDecision:
    """A person's decision about one event, as the policy sees it: proven by the consumer's
    signature (bridge.consumer.people.operatorlog), never taken from a record."""

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
    # The last decision a person made about it, signed and verified
    # (bridge.consumer.people.operatorlog).
    person: PersonDecision | None = None
    drains: Mapping[str, DrainView] = field(default_factory=dict)  # VmId -> its drain
    granted: frozenset[str] = frozenset()  # VmIds the consumer sent a Prepare (a drain grant)
    no_drain: frozenset[str] = frozenset()  # VmIds whose agents refused the Prepare
    # Where the agents and Event Grid tell the event differently, a sentence each.
    disagreements: tuple[str, ...] = ()
    azure: str | None = None  # its status as Event Grid tells it; None: Event Grid has not
    # A Spot rebalance recommendation (Advisory records), not an event: never approved.
    advisory: bool = False

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
    # The keys of `impacted` that are patch runs (PATCH + run id), made once per pass: a
    # budget's explanation names the runs that fill a group without a scan of `impacted`.
    patch_runs: tuple[str, ...] = ()

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
    # The notification target told of this decision if it is the event's first (rebalance).
    notify: str | None = None


NO_RULE = "(no rule)"
# The DecisionRule of what the policy's `rebalance` section decided about an advisory.
REBALANCE_RULE = "(rebalance)"


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
