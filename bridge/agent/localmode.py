"""Local mode (`se-bridge agent --policy FILE`): the approval policy inside one agent.

For a VM with no central parts. At each change of the document, and every few seconds
while an event is deferred, the agent evaluates each Scheduled event that affects it
with the same pure `bridge.policy.model.evaluate` the consumer uses, over a fleet of one: this
VM. What this agent cannot know stays unknown to the policy: other VMs named in
`Resources` are `unresolved`, so rules about VMs do not match them and readiness waits
for them, as the consumer would with VMs it has never heard of.

An Approve is POSTed at once (no channel) through the shared Approver, which remembers
it: each event is approved at most once, whether by this policy or a central command.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime

from bridge.agent.approver import Approver, Request
from bridge.agent.document import is_started
from bridge.agent.normalise import NormaliserState, SavedEvent
from bridge.commands.message import command_id
from bridge.config import Config
from bridge.imdstime import parse_time
from bridge.policy import file as policyfile
from bridge.policy.evaluation import evaluate
from bridge.policy.model import EventView, FleetView, Policy, Verdict, VmView
from bridge.records import Origin, VmIdentity, vm_key

log = logging.getLogger(__name__)
RECHECK_SECONDS = 5.0


class LocalApprover:
    def __init__(
        self,
        policy: Policy,
        approver: Approver,
        now: Callable[[], datetime],
        recheck: float = RECHECK_SECONDS,
        *,
        prepare_hook: bool | None = None,
        drained: frozenset[str] = frozenset(),
        prepared: Callable[[], frozenset[str]] = frozenset,
    ) -> None:
        self.policy, self._approver, self._now, self._recheck = policy, approver, now, recheck
        self._prepare_hook = prepare_hook  # a prepare step runs: approve_when_ready waits
        # [kubernetes] on: the event types whose prepare step every approval waits for,
        # whatever the rule (the node is ready once drained, or once the drain gave up with
        # approve, and the hook after it succeeded).
        self._drained = drained
        # The events this VM's prepare step succeeded for (bridge.agent.prepare).
        self._prepared = prepared
        self._ready: frozenset[str] = frozenset()  # as the last look found them
        self._given_up: set[str] = set()  # IMDS refused the approval (400): not asked again
        self._said: set[tuple[str, str]] = set()
        self._recheck_at: float | None = None  # time.monotonic() of the next look, if any

    def observe(self, state: NormaliserState | None, origin: Origin) -> None:
        """Decide about every Scheduled event of this VM's current document."""
        self._recheck_at = None
        if state is None:
            return
        identity = origin.identity
        # Without instance metadata the host name stands in, as the consumer keys such an
        # agent: the approval needs a name to be made under, and no VmId is ever guessed.
        vm_id = identity.vm_id or f"host:{origin.host_name}"
        name = identity.vm_name or origin.host_name
        now = self._now()
        self._ready = self._prepared()
        fleet, events = local_views(
            state,
            identity,
            self._ready,
            self._done(),
            now,
            vm_id=vm_id,
            name=name,
            prepare_hook=self._prepare_hook,
        )
        again = False
        for event in events:
            again |= self._act(event, evaluate(self.policy, fleet, event, now), vm_id)
        if again:
            self._recheck_at = time.monotonic() + self._recheck
        self._forget(state)

    def tick(self, state: NormaliserState | None, origin: Origin) -> None:
        """From the poll loop: look again when a deferred event is due for it, or when the
        prepare step succeeded for another event (a prepared event may now be approved)."""
        due = self._recheck_at is not None and time.monotonic() >= self._recheck_at
        if due or self._prepared() - self._ready:
            self.observe(state, origin)

    def _act(self, event: EventView, verdict: Verdict, vm_id: str) -> bool:
        """Carry out one verdict; True when the event should be looked at again soon."""
        if verdict.kind == "Approve":
            return self._approve(event, verdict, vm_id)
        if verdict.kind in ("Defer", "Hold"):
            self._say(event, f"{verdict.kind.lower()}: {verdict.reason}")
        return verdict.kind == "Defer"

    def _approve(self, event: EventView, verdict: Verdict, vm_id: str) -> bool:
        if event.event_type in self._drained and vm_id not in event.ready:
            self._say(event, f"approve by rule {verdict.rule} once the node is drained")
            return True
        request = Request(
            event_id=event.event_id,
            command_id=command_id(event.event_id, vm_id),
            source="Local",
            rule=verdict.rule,
            reason=f"local policy {self.policy.source}: {verdict.reason}",
            issued_at=self._now(),
        )
        attempt = self._approver.attempt(request)
        outcome = attempt.outcome
        if attempt.kind == "Approved" and outcome is not None:
            log.info(
                "approved event %s (%s) by the local policy: rule %s, IMDS answered %s ms "
                "after the decision",
                event.event_id,
                event.event_type,
                verdict.rule,
                outcome.latency_ms,
            )
        elif attempt.kind == "Failed":
            self._given_up.add(event.event_id.lower())
            log.error(
                "could not approve event %s by the local policy: %s; the event starts at "
                "its NotBefore",
                event.event_id,
                attempt.detail,
            )
        elif attempt.kind in ("Retry", "Busy"):
            self._say(event, f"approval postponed: {attempt.detail}", logging.WARNING)
            return True
        elif attempt.kind == "Refused":
            self._say(event, f"not approved after all: {attempt.detail}")
        return False

    def _say(self, event: EventView, what: str, level: int = logging.INFO) -> None:
        # Once per event and reason: a deferred event is looked at every few seconds.
        key = (event.event_id.lower(), what)
        if key not in self._said:
            self._said.add(key)
            log.log(
                level, "local policy, event %s (%s): %s", event.event_id, event.event_type, what
            )

    def _done(self) -> frozenset[str]:
        return self._approver.approved_events() | self._given_up

    def _forget(self, state: NormaliserState) -> None:
        """Drop what is remembered about events that left the document."""
        present = {key for key, _ in _events(state)}
        self._given_up &= present
        self._said = {s for s in self._said if s[0] in present}


def local_views(
    state: NormaliserState,
    identity: VmIdentity,
    ready: frozenset[str],
    done: frozenset[str],
    now: datetime,
    *,
    vm_id: str | None = None,
    name: str | None = None,
    prepare_hook: bool | None = None,
) -> tuple[FleetView, list[EventView]]:
    """The fleet of one VM and the events to decide about (Scheduled, affecting it, not done).

    `vm_id` and `name` are what this VM goes by: instance metadata's, unless it has none;
    `prepare_hook` whether it runs one.
    """
    vm_id = vm_id or identity.vm_id or ""
    name = name or identity.vm_name or ""
    impacted = {
        event["EventId"]: frozenset({vm_id})
        for key, event in _events(state)
        if event.get("AffectsThisVm") is True
        and (is_started(event.get("EventStatus")) or key in done)
    }
    me = replace(vm_view(identity, now, vm_id, name), prepare_hook=prepare_hook)
    fleet = FleetView(vms={vm_id: me}, impacted=impacted)
    views = [
        event_view(event, vm_id, name, key in ready, now)
        for key, event in _events(state)
        if key not in done and _scheduled(event) and event.get("AffectsThisVm") is True
    ]
    return fleet, views


def vm_view(identity: VmIdentity, now: datetime, vm_id: str, name: str) -> VmView:
    return VmView(
        vm_id=vm_id,
        name=name,
        subscription_id=identity.subscription_id,
        resource_group=identity.resource_group,
        location=identity.location,
        zone=identity.zone,
        scale_set=identity.vm_scale_set_name,
        fault_domain=identity.platform_fault_domain,
        update_domain=identity.platform_update_domain,
        tags=dict(identity.tags),
        last_seen=now,
    )


def event_view(event: SavedEvent, vm_id: str, name: str, ready: bool, now: datetime) -> EventView:
    mine = vm_key(name)
    duration = event.get("DurationInSeconds")
    return EventView(
        event_id=event["EventId"],
        event_type=str(event.get("EventType") or ""),
        event_source=event.get("EventSource"),
        duration=duration if isinstance(duration, int) else None,
        status=str(event.get("EventStatus") or ""),
        not_before=parse_time(event.get("NotBefore")),
        first_seen=parse_time(event.get("FirstSeen")) or now,
        affected=(vm_id,),
        unresolved=tuple(r for r in event["Resources"] if vm_key(str(r)) != mine),
        reporters=(vm_id,),
        ready=frozenset({vm_id}) if ready else frozenset(),
    )


def _events(state: NormaliserState) -> Iterator[tuple[str, SavedEvent]]:
    for event in state["events"].values():
        yield event["EventId"].lower(), event


def _scheduled(event: SavedEvent) -> bool:
    return str(event.get("EventStatus") or "").strip().lower() == "scheduled"


def build(
    config: Config,
    approver: Approver,
    now: Callable[[], datetime],
    policy: Policy | None,
    prepared: Callable[[], frozenset[str]] = frozenset,
) -> LocalApprover | None:
    """Local mode when `agent.policy` (or a given policy) asks for it; None otherwise."""
    if policy is None:
        if config.agent.policy is None:
            return None
        policy = policyfile.load_setting("agent.policy", config.agent.policy)
    log.info("local mode: approving with the policy %s", policy.source)
    # A drain of the node ([kubernetes]) is a prepare step that every approval waits for;
    # `prepared`: the events this VM's prepare step succeeded for.
    kube = config.kubernetes
    prepare = config.hooks.prepare is not None or kube.enabled
    drained = frozenset(kube.event_types) if kube.enabled else frozenset()
    return LocalApprover(
        policy,
        approver,
        now,
        recheck=RECHECK_SECONDS,
        prepare_hook=prepare,
        drained=drained,
        prepared=prepared,
    )
