"""Draining this agent's node for one event, and undoing it after.

A drain cordons the node (unschedulable, with the annotation `se-bridge.io/cordoned-for`
only when this drain made it unschedulable) and taints it `se-bridge.io/maintenance=<EventId>
:NoSchedule` so people see why; then it evicts the plan's pods wave by wave through the
Eviction API, so PodDisruptionBudgets are honoured (a refusal, 429, is asked again every
`eviction_retry` seconds), and waits until they are gone. It stops at its deadline. Spot
Preempt takes the fast path: the pods are deleted at once, no budget asked, as the platform
takes the node anyway. The uncordon removes only what a drain set: its taint, and the cordon
when the annotation says a drain made it and no one else cordoned the node since (the node's
managedFields name who last set spec.unschedulable). Other writers' taints are written back
exactly as they were read. A pod no controller owns is not evicted (evicted, it is gone for
good): it blocks the drain unless the rules allow it.

The Drainer blocks (it runs on a drain thread of the agent) and reports its progress through
callbacks; it keeps no state of its own between calls but what the node carries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bridge.kubernetes.api import (
    FIELD_MANAGER,
    Conflict,
    KubeApi,
    KubeError,
    Node,
    NodeMissing,
    Taint,
)
from bridge.kubernetes.plan import Plan, Rules, Skipped, budget_for, plan

log = logging.getLogger(__name__)

TAINT_KEY = "se-bridge.io/maintenance"
TAINT_EFFECT = "NoSchedule"
CORDONED_FOR = "se-bridge.io/cordoned-for"
PREEMPT_GRACE_CAP = 25  # seconds: a Spot Preempt gives 30 s of notice
NO_CONTROLLER = (
    "no controller: evicted, it would not come back (kubernetes.evict_without_controller)"
)
MAX_BLOCKERS = 20  # DrainBlockers holds at most this many (the record's limit)

Status = Literal["Draining", "Blocked", "Drained", "GaveUp", "Failed", "Uncordoned", "LeftCordoned"]


@dataclass(frozen=True)
class Blocker:
    namespace: str
    pod: str
    reason: str
    budget: str | None = None

    def to_record(self) -> dict[str, Any]:
        return {
            "Namespace": self.namespace,
            "Pod": self.pod,
            "Reason": self.reason,
            "PodDisruptionBudget": self.budget,
        }

    def describe(self) -> str:
        budget = f" (PodDisruptionBudget {self.budget})" if self.budget else ""
        return f"{self.namespace}/{self.pod}: {self.reason}{budget}"


@dataclass(frozen=True)
class Report:
    """A drain's news: progress (Draining, Blocked) or its end (the other statuses)."""

    status: Status
    detail: str
    blockers: tuple[Blocker, ...] = ()
    exit_code: int | None = None  # None: progress, not an outcome
    timed_out: bool = False
    error: str | None = None
    others_cordon: bool = False  # the node was unschedulable before the drain, not by us

    @property
    def ready(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class DrainSettings:
    rules: Rules
    on_deadline: Literal["hold", "approve"] = "hold"
    eviction_retry: float = 5.0
    blocked_report_interval: float = 60.0
    poll: float = 1.0  # seconds between looks at the pods left


class Drainer:
    """Drains and uncordons the node `node_name` through `api`.

    `wait(seconds)` waits and returns True when the agent is stopping: the drain then ends
    with no outcome (None) and is taken up again after the restart.
    """

    def __init__(
        self,
        api: KubeApi,
        node_name: str,
        settings: DrainSettings,
        *,
        wait: Callable[[float], bool],
        clock: Callable[[], float] = time.monotonic,
        on_refused: Callable[[], None] = lambda: None,
    ) -> None:
        self.api, self.node_name, self.settings = api, node_name, settings
        self._wait, self._clock, self._on_refused = wait, clock, on_refused

    # --- draining -------------------------------------------------------------------------

    def drain(
        self,
        event_id: str,
        remaining: float,
        *,
        preempt: bool,
        report: Callable[[Report], None],
        ended: Callable[[], bool] = lambda: False,
    ) -> Report | None:
        """Drain for `event_id` for at most `remaining` seconds; the outcome, or None when
        the agent is stopping. Progress (Draining, Blocked) goes to `report` as it comes."""
        run = _Run(self, event_id, self._clock() + remaining, preempt, report)
        while True:
            if ended():
                return Report(
                    "Failed",
                    f"event {event_id} ended before the drain finished",
                    exit_code=1,
                    error="the event ended during the drain",
                )
            outcome = run.step()
            if outcome is not None:
                return outcome
            if self._wait(self.settings.poll):
                return None

    def mark(self, event_id: str) -> bool:
        """Cordon and taint the node for `event_id`; True when someone else had cordoned it."""
        for _ in range(5):
            node = self.api.node(self.node_name)
            patch: dict[str, Any] = {}
            spec: dict[str, Any] = {}
            others = cordoned_by_others(node)
            if not node.unschedulable:
                spec["unschedulable"] = True
                patch["metadata"] = {"annotations": {CORDONED_FOR: event_id}}
            if not any(t.key == TAINT_KEY for t in node.taints):
                spec["taints"] = [
                    *(t.to_api() for t in node.taints),
                    Taint(TAINT_KEY, event_id, TAINT_EFFECT).to_api(),
                ]
            if not spec:
                return others
            patch["spec"] = spec
            patch.setdefault("metadata", {})["resourceVersion"] = node.resource_version
            try:
                self.api.patch_node(self.node_name, patch)
            except Conflict:
                continue  # someone changed the node meanwhile: read it again
            return others
        raise Conflict(f"node {self.node_name} kept changing while it was being cordoned")

    # --- undoing --------------------------------------------------------------------------

    def uncordon(self, event_id: str, successor: str | None = None) -> Report | None:
        """Remove what a drain for `event_id` set; None when nothing of it is on the node.

        With a `successor` (another open event whose drain holds the node too) the node stays
        cordoned and the marks name the successor instead: a node has one taint per key and
        effect, so the successor's drain found the node marked already and set none of its own.
        """
        for _ in range(5):
            node = self.api.node(self.node_name)
            patch = (
                _undo(node, event_id)
                if successor is None
                else _hand_over(node, event_id, successor)
            )
            if patch is None:
                return None
            try:
                self.api.patch_node(self.node_name, patch)
            except Conflict:
                continue
            if successor is not None:
                return Report(
                    "LeftCordoned",
                    f"node {self.node_name} stays cordoned for event {successor}, whose drain "
                    f"holds it too; the se-bridge marks of event {event_id} now name {successor}",
                    exit_code=0,
                )
            if node.annotations.get(CORDONED_FOR) == event_id and _recordoned(node):
                return Report(
                    "LeftCordoned",
                    f"node {self.node_name} stays cordoned: {', '.join(node.cordoned_by)} "
                    f"cordoned it again while the drain for event {event_id} held it; only "
                    "se-bridge's taint and annotation were removed",
                    exit_code=0,
                    others_cordon=True,
                )
            if node.annotations.get(CORDONED_FOR) == event_id or not node.unschedulable:
                return Report(
                    "Uncordoned",
                    f"node {self.node_name} uncordoned and its "
                    f"se-bridge taint for event {event_id} removed",
                    exit_code=0,
                )
            return Report(
                "LeftCordoned",
                f"node {self.node_name} stays cordoned: someone else "
                f"cordoned it; only the se-bridge taint for event {event_id} was "
                "removed",
                exit_code=0,
                others_cordon=True,
            )
        raise Conflict(f"node {self.node_name} kept changing while it was being uncordoned")

    def strays(self, open_events: Callable[[str], bool], node: Node | None = None) -> list[str]:
        """EventIds whose marks (taint or annotation) are on the node (as read, or `node`
        when the caller has just read it) with no open event."""
        node = node or self.api.node(self.node_name)
        named = [t.value for t in node.taints if t.key == TAINT_KEY and t.value]
        if CORDONED_FOR in node.annotations:
            named.append(node.annotations[CORDONED_FOR])
        return sorted({e for e in named if not open_events(e)})


def cordoned_by_others(node: Node) -> bool:
    """The node is unschedulable and se-bridge did not make it so."""
    return node.unschedulable and (CORDONED_FOR not in node.annotations or _recordoned(node))


def _recordoned(node: Node) -> bool:
    """Someone other than se-bridge set spec.unschedulable last, though se-bridge's annotation
    says it cordoned the node: an administrator's cordon made while a drain held it. (A
    `kubectl cordon` of a node already cordoned writes nothing, so only a cordon that changed
    the field is seen.) Unknown (no managedFields): se-bridge's, as the annotation says."""
    return node.unschedulable and bool(node.cordoned_by) and FIELD_MANAGER not in node.cordoned_by


def _undo(node: Node, event_id: str) -> dict[str, Any] | None:
    spec: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    kept = [t for t in node.taints if not (t.key == TAINT_KEY and t.value == event_id)]
    if len(kept) != len(node.taints):
        spec["taints"] = [t.to_api() for t in kept]
    if node.annotations.get(CORDONED_FOR) == event_id:
        metadata["annotations"] = {CORDONED_FOR: None}
        if not _recordoned(node):
            spec["unschedulable"] = False
    if not spec and not metadata:
        return None
    metadata["resourceVersion"] = node.resource_version
    return {"metadata": metadata, "spec": spec} if spec else {"metadata": metadata}


def _hand_over(node: Node, event_id: str, successor: str) -> dict[str, Any] | None:
    """The patch that makes the marks of `event_id` name `successor`; None when none is on it."""
    spec: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    ours = [t for t in node.taints if t.key == TAINT_KEY and t.value == event_id]
    if ours:
        spec["taints"] = [
            Taint(t.key, successor, t.effect).to_api() if t in ours else t.to_api()
            for t in node.taints
        ]
    if node.annotations.get(CORDONED_FOR) == event_id:
        metadata["annotations"] = {CORDONED_FOR: successor}
    if not spec and not metadata:
        return None
    metadata["resourceVersion"] = node.resource_version
    return {"metadata": metadata, "spec": spec} if spec else {"metadata": metadata}


class _Run:
    """One drain's progress between looks at the node."""

    def __init__(
        self,
        drainer: Drainer,
        event_id: str,
        deadline: float,
        preempt: bool,
        report: Callable[[Report], None],
    ) -> None:
        self.d, self.event_id, self.deadline, self.preempt = drainer, event_id, deadline, preempt
        self.report = report
        self.marked = False
        self.others = False
        self.sent: set[str] = set()  # pods evicted (accepted) or deleted
        self.refused: dict[str, tuple[float, Blocker]] = {}  # pod -> last refusal
        self.reported_at: float | None = None
        self.trouble: str | None = None  # the API's last failure

    def step(self) -> Report | None:
        clock = self.d._clock
        try:
            if not self.marked:
                self.others = self.d.mark(self.event_id)
                self.marked = True
                how = (
                    "was cordoned by someone else; tainted"
                    if self.others
                    else "cordoned and tainted"
                )
                self.report(
                    Report(
                        "Draining",
                        f"node {self.d.node_name} {how} for event "
                        f"{self.event_id}; evicting its pods",
                        others_cordon=self.others,
                    )
                )
            current = plan(self.d.api.pods(self.d.node_name), self.d.settings.rules)
            # Spot Preempt waits for nothing: the platform takes the node anyway (a pod no
            # controller owns is not deleted: it goes down with the VM).
            if current.done or (self.preempt and not current.waves):
                return self._drained(current)
            if clock() >= self.deadline:
                return self._gave_up(current)
            if self.preempt:
                # The platform takes the node in seconds: deleted (terminating) is enough.
                self._delete(current)
                return self._drained(current)
            self._evict(current)
            self._blocked(current)
            self.trouble = None
        except NodeMissing as err:
            return Report(
                "Failed",
                f"node {self.d.node_name} is not in the cluster",
                exit_code=1,
                error=str(err),
            )
        except KubeError as err:
            if self.trouble is None:
                log.warning(
                    "drain for event %s: the Kubernetes API failed (%s); trying again "
                    "until the deadline",
                    self.event_id,
                    err,
                )
            self.trouble = str(err)
            if clock() >= self.deadline:
                return Report(
                    "Failed",
                    f"the Kubernetes API did not answer until the drain's deadline: {err}",
                    exit_code=1,
                    timed_out=True,
                    error=f"Kubernetes API: {err}",
                )
        return None

    def _evict(self, current: Plan) -> None:
        now = self.d._clock()
        for pod in current.due:
            if pod.terminating or pod.key in self.sent:
                continue
            last = self.refused.get(pod.key)
            if last is not None and now - last[0] < self.d.settings.eviction_retry:
                continue
            refusal = self.d.api.evict(pod)
            if refusal is None:
                self.sent.add(pod.key)
                self.refused.pop(pod.key, None)
                continue
            self.d._on_refused()
            budget = refusal.budget or budget_for(pod, self.d.api.budgets(pod.namespace))
            self.refused[pod.key] = (
                now,
                Blocker(pod.namespace, pod.name, "eviction refused", budget),
            )

    def _delete(self, current: Plan) -> None:
        for wave in current.waves:
            for pod in wave:
                if pod.terminating or pod.key in self.sent:
                    continue
                grace = min(
                    pod.grace_seconds if pod.grace_seconds is not None else PREEMPT_GRACE_CAP,
                    PREEMPT_GRACE_CAP,
                )
                self.d.api.delete(pod, grace)
                self.sent.add(pod.key)

    def blockers(self, current: Plan) -> tuple[Blocker, ...]:
        present = {p.key for wave in current.waves for p in wave}
        out = [b for key, (_, b) in sorted(self.refused.items()) if key in present]
        if not self.preempt:
            out += [Blocker(p.namespace, p.name, "waiting for completion") for p in current.wait]
            out += [Blocker(p.namespace, p.name, NO_CONTROLLER) for p in current.uncontrolled]
        return tuple(out[:MAX_BLOCKERS])

    def _blocked(self, current: Plan) -> None:
        blockers = self.blockers(current)
        now = self.d._clock()
        if not blockers:
            self.reported_at = None
            return
        interval = self.d.settings.blocked_report_interval
        if self.reported_at is not None and now - self.reported_at < interval:
            return
        self.reported_at = now
        self.report(
            Report(
                "Blocked",
                f"drain of node {self.d.node_name} for event "
                f"{self.event_id} is blocked: {_names(blockers)}",
                blockers,
            )
        )

    def _drained(self, current: Plan) -> Report:
        stays = [*current.skipped, *(Skipped(p, "no controller") for p in current.uncontrolled)]
        left = ", ".join(f"{s.pod.key} ({s.why})" for s in stays[:MAX_BLOCKERS])
        output = f"node {self.d.node_name} drained for event {self.event_id}" + (
            f"; left on it: {left}" if left else ""
        )
        return Report("Drained", output, exit_code=0, others_cordon=self.others)

    def _gave_up(self, current: Plan) -> Report:
        blockers = (
            self.blockers(current)
            or tuple(
                Blocker(p.namespace, p.name, "still on the node")
                for wave in current.waves
                for p in wave
            )[:MAX_BLOCKERS]
        )
        approve = self.d.settings.on_deadline == "approve"
        then = (
            "ready anyway (kubernetes.on_deadline = approve)"
            if approve
            else "held: the platform starts the event at NotBefore (kubernetes.on_deadline = hold)"
        )
        return Report(
            "GaveUp",
            f"the drain's deadline came with pods still on node "
            f"{self.d.node_name}: {_names(blockers)}; {then}",
            blockers,
            exit_code=0 if approve else 1,
            timed_out=True,
            others_cordon=self.others,
        )


def _names(blockers: Sequence[Blocker]) -> str:
    return "; ".join(b.describe() for b in blockers) or "none"
