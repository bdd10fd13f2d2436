"""The IMDS endpoints of one simulated VM, answering exactly as the real service does.

Behaviours copied from the real IMDS:
- every request needs `Metadata: true`, else 400 `{"error": "Bad request: . Required
  metadata header not specified"}`;
- a missing or unsupported api-version is a 400 whose body has `error` and `newest-versions`;
- JSON is sent compact with `Content-Type: application/json; charset=utf-8`;
- POST StartRequests: malformed body -> 400; an EventId the VM can see (any state, even
  already approved) -> 200; an EventId it cannot see -> 400 with an error body;
- /metadata/instance subpaths walk the document, and leaves need `format=text`.
Fault injection (bridge.simulator.faults) sits between validation and the answer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from bridge.simulator.faults import Decision
from bridge.simulator.fleet import PREVIEW_VERSIONS, SCHEDULED_EVENTS_VERSIONS, UnknownEventError

if TYPE_CHECKING:
    from bridge.simulator.core import Simulator

JSON_CONTENT_TYPE = "application/json; charset=utf-8"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"

INSTANCE_VERSIONS = (
    "2017-03-01",
    "2017-04-02",
    "2017-08-01",
    "2017-10-01",
    "2017-12-01",
    "2018-02-01",
    "2018-04-02",
    "2018-10-01",
    "2019-02-01",
    "2019-03-11",
    "2019-04-30",
    "2019-06-01",
    "2019-06-04",
    "2019-08-01",
    "2019-08-15",
    "2019-11-01",
    "2020-06-01",
    "2020-07-15",
    "2020-09-01",
    "2020-10-01",
    "2020-12-01",
    "2021-01-01",
    "2021-02-01",
    "2021-03-01",
    "2021-05-01",
    "2021-10-01",
    "2021-11-01",
    "2021-11-15",
    "2021-12-13",
    "2023-07-01",
)
IDENTITY_VERSIONS = ("2018-02-01", "2019-08-01")

METADATA_HEADER_ERROR = "Bad request: . Required metadata header not specified"
MISSING_VERSION_ERROR = (
    "Bad request. api-version was not specified in the request. "
    "For more information refer to aka.ms/azureimds"
)
# The docs quote only the missing-version message; this one follows its pattern.
INVALID_VERSION_ERROR = (
    "Bad request. api-version is invalid or was not specified in the request. "
    "For more information refer to aka.ms/azureimds"
)


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # below any /vm/<name> prefix, e.g. /metadata/scheduledevents
    query: Mapping[str, Sequence[str]]
    headers: Mapping[str, str]  # names in lower case
    body: bytes = b""

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes = b""
    content_type: str | None = JSON_CONTENT_TYPE
    headers: tuple[tuple[str, str], ...] = ()
    drip: float = 0.0  # send the body a byte at a time, this many seconds apart
    endless: bool = False  # send the body again and again, chunked, never ending it


def json_reply(status: int, payload: Any, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(
        status, json.dumps(payload, separators=(",", ":")).encode("utf-8"), headers=headers
    )


@dataclass(frozen=True)
class _Endpoint:
    versions: tuple[str, ...]
    methods: tuple[str, ...]
    answer: Callable[[Simulator, str, Request], Reply]


def serve(sim: Simulator, vm: str, request: Request, wait: Callable[[float], object]) -> Reply:
    """Answer one IMDS request from `vm`; `wait` sleeps (and returns early on shutdown)."""
    name = endpoint_of(request.path)
    if name is None:
        sim.record_request(vm, request.method, "other", 404)
        return json_reply(404, {"error": "Not found"})
    first_call = name == "scheduledevents" and sim.first_call(vm)
    decision = sim.faults.decide(vm, first_call)
    if decision.delay > 0:
        wait(decision.delay)
    if name == "instance" and decision.no_instance:
        sim.record_request(vm, request.method, name, 404)
        return json_reply(404, {"error": "Not found"})
    reply = _answer(sim, vm, ENDPOINTS[name], request, decision)
    sim.record_request(vm, request.method, name, reply.status, request.param("api-version") or "")
    if name == "scheduledevents" and request.method == "POST":
        sim.record_approvals(vm, parse_start_requests(request.body)[0], reply.status)
    return reply


def endpoint_of(path: str) -> str | None:
    path = path.rstrip("/")
    if path == "/metadata/scheduledevents":
        return "scheduledevents"
    if path == "/metadata/instance" or path.startswith("/metadata/instance/"):
        return "instance"
    if path == "/metadata/identity/oauth2/token":
        return "token"
    return None


def _answer(
    sim: Simulator, vm: str, endpoint: _Endpoint, request: Request, decision: Decision
) -> Reply:
    problem = _validate(endpoint, request, sim.unserved_versions)
    if problem is not None:
        return problem
    if decision.status is not None:
        return _fault_reply(decision)
    reply = endpoint.answer(sim, vm, request)
    if decision.corrupt_body is not None and request.method == "GET" and reply.status == 200:
        return Reply(200, decision.corrupt_body)
    if reply.status == 200 and (decision.drip or decision.endless):
        return replace(reply, drip=decision.drip, endless=decision.endless)
    return reply


def _validate(
    endpoint: _Endpoint, request: Request, unserved: Collection[str] = ()
) -> Reply | None:
    if request.headers.get("metadata", "").lower() != "true":
        return json_reply(400, {"error": METADATA_HEADER_ERROR})
    if request.method not in endpoint.methods:
        allow = (("Allow", ", ".join(endpoint.methods)),)
        return json_reply(405, {"error": "Method not allowed"}, allow)
    version = request.param("api-version")
    served = [v for v in endpoint.versions if v not in unserved]
    if version in served:
        return None
    newest = sorted((v for v in served if v not in PREVIEW_VERSIONS), reverse=True)[:3]
    error = INVALID_VERSION_ERROR if version else MISSING_VERSION_ERROR
    return json_reply(400, {"error": error, "newest-versions": newest})


_FAULT_ERRORS = {
    410: "Gone. Retry after some time, for at most 70 seconds.",
    429: "Too many requests. IMDS allows about 5 requests per second.",
    500: "Internal server error. Retry after some time.",
    503: "Service unavailable. Retry after some time.",
}


def _fault_reply(decision: Decision) -> Reply:
    assert decision.status is not None
    headers: tuple[tuple[str, str], ...] = ()
    if decision.status == 429:
        headers = (("Retry-After", str(math.ceil(decision.retry_after))),)
    return json_reply(decision.status, {"error": _FAULT_ERRORS[decision.status]}, headers)


def parse_start_requests(body: bytes) -> tuple[list[str] | None, str]:
    """The EventIds of a StartRequests body, or (None, why it is malformed)."""
    try:
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None, "the body is not JSON"
    requests = payload.get("StartRequests") if isinstance(payload, dict) else None
    if not isinstance(requests, list):
        return None, "StartRequests is missing or is not a list"
    ids = [r.get("EventId") if isinstance(r, dict) else None for r in requests]
    if not all(isinstance(i, str) and i for i in ids):
        return None, "every StartRequest needs an EventId string"
    return [str(i) for i in ids], ""


def _scheduled_events(sim: Simulator, vm: str, request: Request) -> Reply:
    version = request.param("api-version") or ""
    if request.method == "GET":
        return json_reply(200, sim.document(vm, version))
    ids, problem = parse_start_requests(request.body)
    if ids is None:
        return json_reply(400, {"error": f"Bad request: {problem}"})
    try:
        sim.apply_approval(vm, ids)
    except UnknownEventError as exc:
        return json_reply(400, {"error": f"Bad request: {exc}"})
    return Reply(200, content_type=None)


def _instance(sim: Simulator, vm: str, request: Request) -> Reply:
    node: Any = sim.instance_metadata(vm)
    for part in request.path.rstrip("/").split("/")[3:]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return json_reply(404, {"error": "Not found"})
    if isinstance(node, dict | list):
        return json_reply(200, node)
    if request.param("format") != "text":
        return json_reply(400, {"error": "Bad request. Leaf nodes need format=text"})
    return Reply(200, str(node).encode("utf-8"), TEXT_CONTENT_TYPE)


def _token(sim: Simulator, vm: str, request: Request) -> Reply:
    resource = request.param("resource")
    if not resource:
        problem = "Required query variable 'resource' is missing"
        return json_reply(400, {"error": "invalid_request", "error_description": problem})
    return json_reply(200, sim.token(vm, resource, request.param("client_id")))


ENDPOINTS = {
    "scheduledevents": _Endpoint(SCHEDULED_EVENTS_VERSIONS, ("GET", "POST"), _scheduled_events),
    "instance": _Endpoint(INSTANCE_VERSIONS, ("GET",), _instance),
    "token": _Endpoint(IDENTITY_VERSIONS, ("GET",), _token),
}
