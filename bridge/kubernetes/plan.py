"""The drain planner: given the pods on a node, the PodDisruptionBudgets and the rules,
which pods to evict and in what order, which to leave, and which to wait for. Pure: no I/O.

Order: pods with a lower `order_label` value go first (no label or a bad value: 0), then
those of a lower priority (PriorityClass value; none: 0); pods of one (order, priority) are a
wave, evicted together, and a wave starts only when the one before it has left the node.
Left alone: DaemonSet pods (their controller puts them back at once, and they tolerate the
cordon), mirror pods (the kubelet's static pods: the API cannot evict them), pods with the
skip label, and pods that have finished (Succeeded or Failed). Waited for: pods with the wait
label, not evicted, until they finish or leave on their own. Not evicted either: a pod no
controller owns (no ownerReference with `controller: true`), which once evicted is gone for
good; it blocks the drain, as `kubectl drain` refuses it without --force, unless
`evict_without_controller` allows it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class Pod:
    """What a drain needs to know of one pod."""

    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    controller: str | None = None  # the kind of the owner that is its controller; None: none
    priority: int = 0
    phase: str = "Running"
    terminating: bool = False  # deletionTimestamp set: on its way out
    grace_seconds: int | None = None  # spec.terminationGracePeriodSeconds

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget: its matchLabels and matchExpressions (In, NotIn, Exists,
    DoesNotExist), enough to say which budget guards a pod."""

    namespace: str
    name: str
    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def guards(self, pod: Pod) -> bool:
        if pod.namespace != self.namespace:
            return False
        if any(pod.labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        return all(_expression(pod.labels, *e) for e in self.match_expressions)


def _expression(
    labels: Mapping[str, str], key: str, operator: str, values: tuple[str, ...]
) -> bool:
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return False  # an operator this planner does not know: claim no match


@dataclass(frozen=True)
class Rules:
    skip_label: str
    wait_label: str
    order_label: str
    evict_without_controller: bool = False


@dataclass(frozen=True)
class Skipped:
    pod: Pod
    why: str  # "DaemonSet", "mirror pod", "skip label", "finished"


@dataclass(frozen=True)
class Plan:
    """`waves`: the pods to evict, wave by wave (the first is due now); `wait`: pods waited
    for; `skipped`: left on the node, with why; `uncontrolled`: pods no controller owns, not
    evicted, which keep the node from being drained while they are on it."""

    waves: tuple[tuple[Pod, ...], ...]
    wait: tuple[Pod, ...]
    skipped: tuple[Skipped, ...]
    uncontrolled: tuple[Pod, ...] = ()

    @property
    def done(self) -> bool:
        """Nothing left to evict or wait for: the node is drained."""
        return not self.waves and not self.wait and not self.uncontrolled

    @property
    def due(self) -> tuple[Pod, ...]:
        """The pods to evict now: the first wave."""
        return self.waves[0] if self.waves else ()


def plan(pods: Iterable[Pod], rules: Rules) -> Plan:
    waves: dict[tuple[int, int], list[Pod]] = {}
    wait: list[Pod] = []
    skipped: list[Skipped] = []
    uncontrolled: list[Pod] = []
    for pod in sorted(pods, key=lambda p: p.key):
        why = skip_reason(pod, rules)
        if why is not None:
            skipped.append(Skipped(pod, why))
        elif _truthy(pod.labels.get(rules.wait_label)):
            wait.append(pod)
        elif pod.controller is None and not rules.evict_without_controller:
            uncontrolled.append(pod)
        else:
            waves.setdefault((order_of(pod, rules), pod.priority), []).append(pod)
    ordered = tuple(tuple(waves[k]) for k in sorted(waves))
    return Plan(ordered, tuple(wait), tuple(skipped), tuple(uncontrolled))


def skip_reason(pod: Pod, rules: Rules) -> str | None:
    """Why a drain leaves `pod` on the node; None when it must go (or be waited for)."""
    if pod.phase in FINISHED_PHASES:
        return "finished"
    if pod.controller == "DaemonSet":
        return "DaemonSet"
    if MIRROR_ANNOTATION in pod.annotations:
        return "mirror pod"
    if _truthy(pod.labels.get(rules.skip_label)):
        return "skip label"
    return None


def order_of(pod: Pod, rules: Rules) -> int:
    raw = pod.labels.get(rules.order_label)
    try:
        return int(raw) if raw is not None else 0
    except ValueError:
        return 0  # a label no one can read must not stop the drain


def _truthy(value: str | None) -> bool:
    # A label's presence is the mark; "false" (or "0", "no") says it is off.
    return value is not None and value.strip().lower() not in ("false", "0", "no")


def budget_for(pod: Pod, budgets: Sequence[Budget]) -> str | None:
    """The name of the PodDisruptionBudget that guards `pod`, if one does."""
    return next((b.name for b in budgets if b.guards(pod)), None)
