"""`KubeApi` over lightkube: the only module that imports it, loaded only when `[kubernetes]`
is on (an agent without it imports nothing of Kubernetes).

Errors become the few kinds a drain acts on (bridge.kubernetes.api): an API server that does
not answer or answers 5xx is Unreachable (try again), 409 a Conflict (read again), 403 is
Forbidden (the RBAC of docs/kubernetes.md is missing), 404 of the node NodeMissing.

One call at a time per process: lightkube decodes with msgspec, which builds a type's decoding
plan on the type's first use, and two threads doing that at once (a drain's thread and the node
watch, right after a restart) crashed the agent with a segmentation fault, before it wrote or
logged anything (issue 37; reproduced with msgspec 0.22 alone). The calls are short and
bounded by the client's timeout, so waiting for another thread's costs little.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx2
from lightkube import ApiError, Client, KubeConfig
from lightkube.core.exceptions import ConfigError as KubeConfigError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node as NodeResource
from lightkube.resources.core_v1 import Pod as PodResource
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType

from bridge.kubernetes.api import (
    FIELD_MANAGER,
    Conflict,
    Forbidden,
    KubeError,
    Node,
    NodeMissing,
    Refusal,
    Taint,
    Unreachable,
)
from bridge.kubernetes.plan import Budget, Pod

# The API server's words for a PodDisruptionBudget's refusal (pkg/registry/core/pod/storage).
BUDGET_NAME = re.compile(r"disruption budget (\S+?) needs")
_ONE_CALL = threading.Lock()  # the module docstring says why calls take turns


class LightkubeApi:
    def __init__(self, kubeconfig: Path | None, *, timeout: float = 10.0) -> None:
        """`kubeconfig`: a kubeconfig file; None: the pod's service account (in-cluster).
        KubeError when neither can be read."""
        try:
            config = (
                KubeConfig.from_file(kubeconfig)
                if kubeconfig is not None
                else KubeConfig.from_service_account()
            )
        except (KubeConfigError, OSError, KeyError, ValueError) as err:
            where = kubeconfig or "the pod's service account"
            raise KubeError(
                f"cannot read the Kubernetes client configuration {where}: {err}"
            ) from err
        self._client = Client(
            config, timeout=httpx2.Timeout(timeout), field_manager=FIELD_MANAGER, trust_env=False
        )

    def node(self, name: str) -> Node:
        with _errors(f"node {name}", missing=NodeMissing):
            return _node(self._client.get(NodeResource, name))

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> Node:
        with _errors(f"node {name}", missing=NodeMissing):
            return _node(
                self._client.patch(NodeResource, name, dict(patch), patch_type=PatchType.MERGE)
            )

    def pods(self, node: str) -> Sequence[Pod]:
        with _errors(f"the pods of node {node}"):
            found = self._client.list(PodResource, namespace="*", fields={"spec.nodeName": node})
            return [_pod(p) for p in found]

    def budgets(self, namespace: str) -> Sequence[Budget]:
        with _errors(f"the PodDisruptionBudgets of namespace {namespace}"):
            return [_budget(b) for b in self._client.list(PodDisruptionBudget, namespace=namespace)]

    def evict(self, pod: Pod) -> Refusal | None:
        eviction = PodResource.Eviction(metadata=ObjectMeta(name=pod.name, namespace=pod.namespace))
        try:
            with _errors(f"the eviction of pod {pod.key}"):
                self._client.create(eviction, name=pod.name, namespace=pod.namespace)
        except _Gone:
            return None
        except _TooMany as refused:
            return refused.refusal
        return None

    def delete(self, pod: Pod, grace_seconds: int) -> None:
        try:
            with _errors(f"pod {pod.key}"):
                self._client.delete(
                    PodResource, pod.name, namespace=pod.namespace, grace_period=grace_seconds
                )
        except _Gone:
            return

    def close(self) -> None:
        self._client.close()


class _Gone(KubeError):
    """404 of a pod: it left already."""


class _TooMany(KubeError):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


@contextmanager
def _errors(what: str, missing: type[KubeError] = _Gone) -> Iterator[None]:
    """One call to the API server, taking its turn, its failures made the kinds a drain knows."""
    try:
        with _ONE_CALL:
            yield
    except ApiError as err:
        code = err.status.code or err.response.status_code
        message = err.status.message or str(err)
        if code == 404:
            raise missing(f"{what}: not found") from err
        if code == 409:
            raise Conflict(f"{what}: {message}") from err
        if code == 429:
            raise _TooMany(Refusal(message, _budget_named(err))) from err
        if code in (401, 403):
            raise Forbidden(f"{what}: forbidden ({message}): check the agent's RBAC") from err
        if code >= 500:
            raise Unreachable(f"{what}: the API server answered {code}: {message}") from err
        raise KubeError(f"{what}: the API server answered {code}: {message}") from err
    except httpx2.HTTPError as err:
        raise Unreachable(f"{what}: the API server did not answer ({err})") from err


def _budget_named(err: ApiError) -> str | None:
    details = err.status.details
    for cause in (details.causes or []) if details is not None else []:
        found = BUDGET_NAME.search(cause.message or "")
        if found:
            return found.group(1)
    found = BUDGET_NAME.search(err.status.message or "")
    return found.group(1) if found else None


def _node(node: NodeResource) -> Node:
    meta, spec = node.metadata or ObjectMeta(), node.spec
    taints = tuple(
        Taint(t.key, t.value, t.effect, _timestamp(t.timeAdded))
        for t in (spec.taints or [] if spec else [])
    )
    return Node(
        name=meta.name or "",
        unschedulable=bool(spec and spec.unschedulable),
        taints=taints,
        annotations=dict(meta.annotations or {}),
        labels=dict(meta.labels or {}),
        resource_version=meta.resourceVersion,
        cordoned_by=tuple(
            m.manager or ""
            for m in meta.managedFields or []
            if "f:unschedulable" in ((m.fieldsV1 or {}).get("f:spec") or {})
        ),
    )


def _timestamp(value: datetime | str | None) -> str | None:
    """A timestamp as the API server writes it (RFC 3339, seconds, Z)."""
    if value is None or isinstance(value, str):
        return value
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(pod: PodResource) -> Pod:
    meta, spec, status = pod.metadata or ObjectMeta(), pod.spec, pod.status
    controller = next((o.kind for o in meta.ownerReferences or [] if o.controller), None)
    return Pod(
        namespace=meta.namespace or "",
        name=meta.name or "",
        labels=dict(meta.labels or {}),
        annotations=dict(meta.annotations or {}),
        controller=controller,
        priority=(spec.priority or 0) if spec else 0,
        phase=(status.phase or "Running") if status else "Running",
        terminating=meta.deletionTimestamp is not None,
        grace_seconds=spec.terminationGracePeriodSeconds if spec else None,
    )


def _budget(pdb: PodDisruptionBudget) -> Budget:
    meta = pdb.metadata or ObjectMeta()
    selector = pdb.spec.selector if pdb.spec else None
    expressions = tuple(
        (e.key, e.operator, tuple(e.values or ()))
        for e in (selector.matchExpressions or [] if selector else [])
    )
    return Budget(
        namespace=meta.namespace or "",
        name=meta.name or "",
        match_labels=dict(selector.matchLabels or {}) if selector else {},
        match_expressions=expressions,
    )
