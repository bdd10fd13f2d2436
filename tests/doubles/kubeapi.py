"""A strict HTTP double of the few Kubernetes API calls a drain makes, for the real lightkube
client (bridge.kubernetes.client) to talk to.

Why not kmock 0.8 (tried for this, and left out of the lock): its KubernetesEmulator stores
objects by URL but filters no list by fieldSelector (a drain lists
`pods?fieldSelector=spec.nodeName=N`), knows no eviction subresource nor PodDisruptionBudget
arithmetic (the 429 is the point of these tests), applies no merge patch with resourceVersion
checks, and serves from aiohttp, whose event loop would need a thread of its own beside its
pytest plugin (which needs pytest-asyncio). Each of those
would be a handler of ours on top of it; this double is those handlers alone, on the
http.server base the other doubles share, and nothing is emulated that a drain does not use.

Served, as the API server does (answers are JSON; errors a `Status` with `code`):

    GET    /api/v1/nodes/{name}                                     404 unknown node
    PATCH  /api/v1/nodes/{name}   application/merge-patch+json      RFC 7386; a resourceVersion
           (or strategic-merge-patch+json, applied the same way)    in it not current: 409
    GET    /api/v1/pods?fieldSelector=spec.nodeName={node}          any other selector: 400
    GET    /apis/policy/v1/namespaces/{ns}/poddisruptionbudgets
    POST   /api/v1/namespaces/{ns}/pods/{name}/eviction             201; 429 while a budget
                                                                    that guards it allows none
    DELETE /api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=  200; 404 unknown pod

Anything else is a 404 (unknown path) or 405 (method), so a client's mistake fails its test.
Behaviours: an evicted or deleted pod gets a deletionTimestamp and leaves `linger` seconds
later (slow termination; 0: at once); each accepted eviction of a pod a budget guards takes
one of the budget's `allowed` disruptions; `down()` closes the listener (clients get
"connection refused") and `up()` listens again on the same port. Every request is recorded
(`requests`), with its decoded JSON body, for the tests to assert on.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.doubles.httpdouble import Answer, Asked, Reply, json_reply, listener

MERGE_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: Mapping[str, str]
    content_type: str | None
    body: Any  # the decoded JSON, or None

    @property
    def verb(self) -> str:
        """METHOD path, the way a test names a call: "POST /api/v1/.../eviction"."""
        return f"{self.method} {self.path}"


@dataclass
class Budget:
    namespace: str
    name: str
    match_labels: dict[str, str]
    allowed: int  # disruptions allowed now; each accepted eviction of a guarded pod takes one

    def guards(self, pod: Mapping[str, Any]) -> bool:
        labels = pod["metadata"].get("labels") or {}
        return pod["metadata"]["namespace"] == self.namespace and all(
            labels.get(k) == v for k, v in self.match_labels.items()
        )


@dataclass
class _Leaving:
    at: float  # time.monotonic() when the pod is gone


@dataclass
class _State:
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    budgets: list[Budget] = field(default_factory=list)
    leaving: dict[tuple[str, str], _Leaving] = field(default_factory=dict)
    linger: dict[tuple[str, str], float] = field(default_factory=dict)
    # Per node, the fields each field manager set last: managedFields, as the API server keeps
    # them for Update operations (a manager owns what its write added or changed).
    owners: dict[str, dict[str, set[tuple[str, ...]]]] = field(default_factory=dict)
    version: int = 1


class KubeApiDouble:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self._lock = threading.Lock()
        self._state = _State()
        self._requests: list[Request] = []
        self._listener = listener(_answer(self), "kubeapi-double", host)

    # --- the cluster ------------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        *,
        unschedulable: bool = False,
        labels: Mapping[str, str] | None = None,
        taints: list[dict[str, Any]] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        with self._lock:
            spec: dict[str, Any] = {}
            if unschedulable:
                spec["unschedulable"] = True
            if taints:
                spec["taints"] = list(taints)
            self._state.nodes[name] = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": dict(labels or {}),
                    "annotations": dict(annotations or {}),
                    "resourceVersion": self._bump(),
                },
                "spec": spec,
            }
            self._state.owners[name] = {}
            self._own(name, {}, self._state.nodes[name], "kubelet")

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        owner: str | None = "ReplicaSet",
        priority: int | None = None,
        phase: str = "Running",
        linger: float = 0.0,
        grace: int | None = None,
    ) -> None:
        """A pod bound to `node`; `owner` the kind of its controller (ReplicaSet, DaemonSet;
        None: a bare pod no controller owns); `linger` the seconds it takes to terminate once
        evicted or deleted."""
        meta: dict[str, Any] = {
            "namespace": namespace,
            "name": name,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        }
        if owner is not None:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": owner,
                    "name": f"{name}-owner",
                    "uid": f"uid-{name}",
                    "controller": True,
                }
            ]
        spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "main"}]}
        if priority is not None:
            spec["priority"] = priority
        if grace is not None:
            spec["terminationGracePeriodSeconds"] = grace
        with self._lock:
            self._state.pods[(namespace, name)] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": meta,
                "spec": spec,
                "status": {"phase": phase},
            }
            self._state.linger[(namespace, name)] = linger

    def add_budget(
        self, namespace: str, name: str, match_labels: Mapping[str, str], allowed: int = 0
    ) -> None:
        with self._lock:
            self._state.budgets.append(Budget(namespace, name, dict(match_labels), allowed))

    def allow(self, name: str, allowed: int) -> None:
        """Set how many disruptions the budget `name` allows now (its pods became healthy)."""
        with self._lock:
            for budget in self._state.budgets:
                if budget.name == name:
                    budget.allowed = allowed

    def finish_pod(self, namespace: str, name: str) -> None:
        """The pod's work is done: it leaves the node (a Job's pod completing)."""
        with self._lock:
            self._state.pods.pop((namespace, name), None)

    def node(self, name: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._state.nodes[name])

    def set_node(self, name: str, change: Mapping[str, Any], manager: str = "kubectl") -> None:
        """Someone else (an admin, kubectl cordon) changes the node: a merge patch, written
        as the field manager `manager` (kubectl's: kubectl-cordon, kubectl-annotate, ...)."""
        with self._lock:
            self._write_node(name, change, manager)

    def _write_node(self, name: str, change: Mapping[str, Any], manager: str) -> dict[str, Any]:
        node = self._state.nodes[name]
        merged: dict[str, Any] = merge_patch(node, change)
        merged["metadata"]["resourceVersion"] = self._bump()
        self._own(name, node, merged, manager)
        self._state.nodes[name] = merged
        return merged

    def _own(
        self, name: str, before: Mapping[str, Any], after: dict[str, Any], manager: str
    ) -> None:
        """`manager` now owns the fields its write added or changed; removed ones no one does."""
        old, new = _fields(before), _fields(after)
        owners = self._state.owners[name]
        changed = {path for path, value in new.items() if old.get(path, _ABSENT) != value}
        gone = changed | (old.keys() - new.keys())
        for owned in owners.values():
            owned.difference_update(gone)
        owners.setdefault(manager, set()).update(changed)
        after["metadata"]["managedFields"] = [
            {"manager": who, "operation": "Update", "apiVersion": "v1",
             "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
             "fieldsType": "FieldsV1", "fieldsV1": _fields_v1(fields)}
            for who, fields in sorted(owners.items()) if fields
        ]  # fmt: skip

    def pods(self, node: str | None = None) -> list[str]:
        """ "ns/name" of the pods on `node` (every node: None), terminating ones included."""
        with self._lock:
            self._reap()
            return sorted(
                f"{ns}/{n}"
                for (ns, n), p in self._state.pods.items()
                if node is None or p["spec"]["nodeName"] == node
            )

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def calls(self, method: str, suffix: str = "") -> list[Request]:
        """The requests of `method` whose path ends with `suffix`."""
        return [r for r in self.requests if r.method == method and r.path.endswith(suffix)]

    # --- serving ----------------------------------------------------------------------------

    def handle(
        self, method: str, target: str, content_type: str | None, raw: bytes
    ) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                return _status(400, "BadRequest", "the body is not JSON")
        with self._lock:
            self._requests.append(Request(method, parts.path, query, content_type, body))
            self._reap()
            return self._route(method, parts.path.strip("/").split("/"), query, content_type, body)

    def _route(
        self,
        method: str,
        path: list[str],
        query: Mapping[str, str],
        content_type: str | None,
        body: Any,
    ) -> tuple[int, dict[str, Any]]:
        served: dict[str, Callable[[], tuple[int, dict[str, Any]]]] = {}
        match path:
            case ["api", "v1", "nodes", name]:
                served["GET"] = lambda: self._get_node(name)
                served["PATCH"] = lambda: self._patch_node(
                    name, content_type, body, query.get("fieldManager", "unknown")
                )
            case ["api", "v1", "pods"]:
                served["GET"] = lambda: self._list_pods(query)
            case ["apis", "policy", "v1", "namespaces", ns, "poddisruptionbudgets"]:
                served["GET"] = lambda: self._list_budgets(ns)
            case ["api", "v1", "namespaces", ns, "pods", name, "eviction"]:
                served["POST"] = lambda: self._evict(ns, name, body)
            case ["api", "v1", "namespaces", ns, "pods", name]:
                served["DELETE"] = lambda: self._delete(ns, name, query)
            case _:
                return _status(404, "NotFound", f"the server could not find {'/'.join(path)}")
        if method not in served:
            return _status(405, "MethodNotAllowed", f"{method} of {'/'.join(path)}")
        return served[method]()

    def _list_budgets(self, ns: str) -> tuple[int, dict[str, Any]]:
        return 200, {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudgetList",
            "metadata": {"resourceVersion": str(self._state.version)},
            "items": [_budget_object(b) for b in self._state.budgets if b.namespace == ns],
        }

    def _get_node(self, name: str) -> tuple[int, dict[str, Any]]:
        node = self._state.nodes.get(name)
        if node is None:
            return _status(404, "NotFound", f'nodes "{name}" not found')
        return 200, copy.deepcopy(node)

    def _patch_node(
        self, name: str, content_type: str | None, body: Any, manager: str
    ) -> tuple[int, dict[str, Any]]:
        node = self._state.nodes.get(name)
        if node is None:
            return _status(404, "NotFound", f'nodes "{name}" not found')
        if content_type not in MERGE_TYPES:
            return _status(415, "UnsupportedMediaType", f"patch type {content_type}")
        if not isinstance(body, dict):
            return _status(400, "BadRequest", "a merge patch is a JSON object")
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != node["metadata"]["resourceVersion"]:
            return _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on nodes "{name}": '
                "the object has been modified; please apply your changes to the "
                "latest version and try again",
            )
        return 200, copy.deepcopy(self._write_node(name, body, manager))

    def _list_pods(self, query: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        selector = query.get("fieldSelector", "")
        key, _, node = selector.partition("=")
        if key != "spec.nodeName" or not node:
            return _status(
                400, "BadRequest", f"this double lists pods by spec.nodeName only, not {selector!r}"
            )
        items = [
            copy.deepcopy(p)
            for _, p in sorted(self._state.pods.items())
            if p["spec"]["nodeName"] == node
        ]
        return 200, {
            "apiVersion": "v1",
            "kind": "PodList",
            "metadata": {"resourceVersion": str(self._state.version)},
            "items": items,
        }

    def _evict(self, ns: str, name: str, body: Any) -> tuple[int, dict[str, Any]]:
        pod = self._state.pods.get((ns, name))
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        meta = (body or {}).get("metadata") or {}
        if (body or {}).get("kind") != "Eviction" or meta.get("name") != name:
            return _status(400, "BadRequest", "the body is not an Eviction of this pod")
        if pod["metadata"].get("deletionTimestamp") is None:
            for budget in self._state.budgets:
                if not budget.guards(pod):
                    continue
                if budget.allowed <= 0:
                    return 429, {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Failure",
                        "reason": "TooManyRequests",
                        "code": 429,
                        "message": "Cannot evict pod as it would violate the pod's "
                        "disruption budget.",
                        "details": {
                            "causes": [
                                {
                                    "reason": "DisruptionBudget",
                                    "message": f"The disruption budget {budget.name} "
                                    "needs 1 healthy pods and has 1 currently",
                                }
                            ]
                        },
                    }
                budget.allowed -= 1
            self._terminate(ns, name)
        return 201, {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Success",
            "code": 201,
            "metadata": {},
        }

    def _delete(self, ns: str, name: str, query: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        pod = self._state.pods.get((ns, name))
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        grace = query.get("gracePeriodSeconds")
        linger = self._state.linger.get((ns, name), 0.0)
        if grace is not None:
            linger = min(linger, float(grace))
        self._terminate(ns, name, linger)
        return 200, copy.deepcopy(self._state.pods.get((ns, name)) or pod)

    def _terminate(self, ns: str, name: str, linger: float | None = None) -> None:
        key = (ns, name)
        wait = self._state.linger.get(key, 0.0) if linger is None else linger
        if wait <= 0:
            self._state.pods.pop(key, None)
            return
        pod = self._state.pods[key]
        pod["metadata"]["deletionTimestamp"] = datetime.now(timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
        self._state.leaving.setdefault(key, _Leaving(time.monotonic() + wait))

    def _reap(self) -> None:
        now = time.monotonic()
        for key, leaving in list(self._state.leaving.items()):
            if now >= leaving.at:
                self._state.pods.pop(key, None)
                del self._state.leaving[key]

    def _bump(self) -> str:
        self._state.version += 1
        return str(self._state.version)

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self._listener.host}:{self._listener.port}"

    def kubeconfig(self, directory: Path) -> Path:
        """A kubeconfig file for the real client: this server, no credentials."""
        path = directory / "kubeconfig"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "double",
                    "clusters": [{"name": "double", "cluster": {"server": self.url}}],
                    "users": [{"name": "double", "user": {}}],
                    "contexts": [
                        {"name": "double", "context": {"cluster": "double", "user": "double"}}
                    ],
                }
            ),
            encoding="utf-8",
        )
        return path

    def start(self) -> KubeApiDouble:
        self.up()
        return self

    def up(self) -> None:
        """Listen (again, on the same port once one was chosen)."""
        self._listener.up()

    def down(self) -> None:
        """Close the listener and every open connection: clients get "connection refused"."""
        self._listener.down()

    def stop(self) -> None:
        self.down()

    def __enter__(self) -> KubeApiDouble:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null removes, the rest replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


_ABSENT = object()
_UNOWNED = ("apiVersion", "kind", "status")
_BOOKKEEPING = (
    ("metadata", "resourceVersion"),
    ("metadata", "managedFields"),
    ("metadata", "name"),
)


def _fields(obj: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """The leaf fields of `obj` by path; a list is one field (the node's taints are atomic)."""
    out: dict[tuple[str, ...], Any] = {}
    for key, value in obj.items():
        path = (*prefix, key)
        if path[0] in _UNOWNED or path in _BOOKKEEPING:
            continue
        if isinstance(value, dict) and value:
            out.update(_fields(value, path))
        else:
            out[path] = value
    return out


def _fields_v1(paths: set[tuple[str, ...]]) -> dict[str, Any]:
    """FieldsV1, as managedFields spell a set of fields: {"f:spec": {"f:unschedulable": {}}}."""
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        node = tree
        for part in path:
            node = node.setdefault(f"f:{part}", {})
    return tree


def _status(code: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
    return code, {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }


def _budget_object(budget: Budget) -> dict[str, Any]:
    return {
        "metadata": {"namespace": budget.namespace, "name": budget.name},
        "spec": {"selector": {"matchLabels": dict(budget.match_labels)}},
        "status": {
            "disruptionsAllowed": max(0, budget.allowed),
            "currentHealthy": 1,
            "desiredHealthy": 1,
            "expectedPods": 1,
        },
    }


def _answer(double: KubeApiDouble) -> Answer:
    def answer(asked: Asked) -> Reply:
        content_type = asked.headers.get("content-type")
        kind = content_type.split(";")[0].strip() if content_type else None
        code, body = double.handle(asked.method, asked.target, kind, asked.body)
        return json_reply(code, body)

    return answer
