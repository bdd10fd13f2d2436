"""The few calls of the Kubernetes API a drain makes, as plain data: `KubeApi`. The lightkube
client (bridge.kubernetes.client) is the one the agent uses; tests may give another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from bridge.kubernetes.plan import Budget, Pod


class KubeError(Exception):
    """A call to the API server failed."""


class Unreachable(KubeError):
    """The API server did not answer, or answered with a server error: try again later."""


class NodeMissing(KubeError):
    """The node is not in the cluster (a wrong kubernetes.node_name, or it left)."""


class Conflict(KubeError):
    """The node changed since it was read (409): read it again and retry."""


FIELD_MANAGER = "se-bridge"  # the name the API server keeps se-bridge's writes under


class Forbidden(KubeError):
    """The service account may not do this (RBAC): no retry helps."""


@dataclass(frozen=True)
class Taint:
    key: str
    value: str | None
    effect: str
    # When the taint was added (the node controller sets it on NoExecute taints and counts
    # tolerationSeconds from it): written back as it was read, or the count starts again.
    time_added: str | None = None

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "effect": self.effect}
        if self.value is not None:
            out["value"] = self.value
        if self.time_added is not None:
            out["timeAdded"] = self.time_added
        return out


@dataclass(frozen=True)
class Node:
    name: str
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    resource_version: str | None = None
    # The field managers that set spec.unschedulable (its managedFields): who cordoned it.
    cordoned_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refusal:
    """An eviction the API server refused (429): a PodDisruptionBudget forbids it now."""

    message: str
    budget: str | None  # the budget's name when the answer names it


class KubeApi(Protocol):
    def node(self, name: str) -> Node: ...

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> Node:
        """A JSON merge patch of the node (metadata.resourceVersion in it: Conflict if stale)."""
        ...

    def pods(self, node: str) -> Sequence[Pod]:
        """The pods bound to `node` (fieldSelector spec.nodeName)."""
        ...

    def budgets(self, namespace: str) -> Sequence[Budget]: ...

    def evict(self, pod: Pod) -> Refusal | None:
        """Ask the Eviction API to evict `pod`; None when accepted (or the pod is gone)."""
        ...

    def delete(self, pod: Pod, grace_seconds: int) -> None:
        """Delete `pod` (no PodDisruptionBudget asked); a pod already gone is no error."""
        ...

    def close(self) -> None: ...
