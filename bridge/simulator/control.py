"""The simulator's control API: JSON over HTTP on the main port, under /control.

Faults never apply here. Errors come back as `{"error": "..."}` with 400 (bad request),
404 (unknown VM, event or path), 405 (wrong method) or 409 (event in the wrong state).

A web page in a browser on the same machine must not be able to drive it: every request must
name a loopback host (or the address the simulator is bound to) in its Host header, else 403,
which stops DNS rebinding; and every request that changes something (POST, PUT, DELETE) must
say `Content-Type: application/json`, else 415, a type no page can send without the
browser's CORS preflight, which this API never answers.
Times in requests (`notice`, `runTime`, `cancelAfter`, `approvalDelay`) are *simulated*
seconds: the simulator divides them by its time scale.

| Method and path | Body | Answer |
|---|---|---|
| `GET /control/health` | | `{"status": "ok"}` |
| `GET /control/fleet` | | time scale and every VM with its URL and document (1) |
| `GET /control/vms/{vm}/document[?api-version=V]` | | the VM's current document |
| `POST /control/vms/{vm}/reset` | `{"restartAt": 1}`? | 24-hour reset (2) |
| `GET /control/scenarios` | | `{"scenarios": [{"name", "summary"}]}` |
| `POST /control/scenarios` | `{"name", "vms"?, "notice"?, "runTime"?, "cancelAfter"?}` | (3) |
| `GET /control/events` | | `{"events": [...]}`: current and finished events |
| `POST /control/events` | custom event (4) | `{"eventId": "..."}` |
| `POST /control/events/{id}/start` | | Scheduled -> Started now |
| `POST /control/events/{id}/cancel` | | Scheduled -> removed (canceled) |
| `POST /control/events/{id}/complete` | | Started -> removed (completed) |
| `GET /control/faults` | | `{"global": {...}, "perVm": {vm: {...}}}` |
| `POST /control/faults` | `{"vm"?: name, "rate503": 0.2, ...}` | merged faults, as GET |
| `DELETE /control/faults[?vm=name]` | | clears one VM's overrides, or every fault |
| `GET /control/approvals` | | every StartRequests POST received (5) |
| `GET /control/counters` | | requests received per VM (6) |
| `DELETE /control/counters` | | sets every counter back to zero |

(1) `{"timeScale": 60.0, "vms": [{"name", "vmId", "resourceId", "group", "priority",
    "zone", "documentIncarnation", "url", "document"}]}`
(2) `{"documentIncarnation": 1}`: the VM's counter starts over, so it goes backwards.
(3) `{"eventIds": ["..."]}`; reset-24h creates no event and answers `{"eventIds": []}`.
(5) `{"approvals": [{"vm", "eventId", "time", "timestamp", "status", "eventStatus"}]}`,
    one entry per EventId; `status` is the HTTP status IMDS answered.
(6) `{"counters": {"web_0": {"GET": 12, "POST": 1, "GET scheduledevents": 11,
    "POST scheduledevents": 1, "GET instance": 1, "status 200": 13}}}` (absent = 0).

(4) Custom event body: the IMDS fields `EventType` (required, any string), `Resources` (list of
VM names, may be empty), `EventStatus` (Scheduled or Started), `Description`, `EventSource`,
`DurationInSeconds`, `ResourceType`, `EventId`, `NotBefore` (a raw string to show instead
of the computed one, e.g. with a wrong weekday); and the simulator's own `audience` (VMs
that see it; default: the sets of Resources), `notice` (default 900), `runTime`,
`cancelAfter`, `approvalDelay`, `omitFields` (keys to leave out of the document).
Fault keys are listed in bridge.simulator.faults.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from bridge.simulator import scenarios
from bridge.simulator.core import vm_path
from bridge.simulator.faults import FaultError
from bridge.simulator.fleet import (
    LATEST_VERSION,
    SCHEDULED_EVENTS_VERSIONS,
    EventSpec,
    EventStateError,
    SimulationError,
    UnknownEventError,
    UnknownVmError,
)
from bridge.simulator.imds import Reply, Request, json_reply

if TYPE_CHECKING:
    from bridge.simulator.core import Simulator


class BadRequest(ValueError):
    pass


Payload = dict[str, Any]
Action = Callable[["Simulator", str, "re.Match[str]", Request, Payload], Any]


@dataclass(frozen=True)
class _Route:
    method: str
    pattern: re.Pattern[str]
    action: Action


def handle(sim: Simulator, base_url: str, request: Request) -> Reply:
    """Answer one control request; `base_url` is the main port's URL, for VM links."""
    refused = _refusal(request, urlsplit(base_url).hostname or "")
    if refused is not None:
        return refused
    matches = [(r, r.pattern.fullmatch(request.path)) for r in ROUTES]
    matching = [(r, m) for r, m in matches if m is not None]
    if not matching:
        return json_reply(
            404, {"error": f"no control endpoint {request.path}; see GET /control/fleet"}
        )
    for route, match in matching:
        if route.method == request.method:
            return _run(route, sim, base_url, match, request)
    allowed = ", ".join(r.method for r, _ in matching)
    return json_reply(405, {"error": f"use {allowed} on {request.path}"}, (("Allow", allowed),))


_LOOPBACK_NAMES = frozenset({"localhost", "::1"})
_JSON = "application/json"


def _refusal(request: Request, bound_host: str) -> Reply | None:
    """403 unless the Host header names this machine's loopback (or the bound address); 415
    for a change without a JSON content type."""
    host = urlsplit("//" + request.headers.get("host", "")).hostname or ""
    loopback = host in _LOOPBACK_NAMES or host == bound_host.lower() or _is_loopback_ip(host)
    if not loopback:
        return json_reply(
            403,
            {
                "error": f"the control API answers only requests addressed to "
                f"a loopback host, not Host {host!r}"
            },
        )
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if request.method != "GET" and media != _JSON:
        return json_reply(
            415, {"error": f"send {request.method} requests with Content-Type: {_JSON}"}
        )
    return None


def _is_loopback_ip(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _run(
    route: _Route, sim: Simulator, base_url: str, match: re.Match[str], request: Request
) -> Reply:
    try:
        result = route.action(sim, base_url, match, request, _payload(request.body))
    except (BadRequest, FaultError) as exc:
        return json_reply(400, {"error": str(exc)})
    except (UnknownVmError, UnknownEventError) as exc:
        return json_reply(404, {"error": str(exc)})
    except EventStateError as exc:
        return json_reply(409, {"error": str(exc)})
    except SimulationError as exc:
        return json_reply(400, {"error": str(exc)})
    return json_reply(200, result)


def _payload(body: bytes) -> Payload:
    if not body.strip():
        return {}
    try:
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise BadRequest("the body must be a JSON object")
    return payload


def _number(payload: Payload, key: str) -> float | None:
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{key} must be a number of seconds, not {value!r}")
    return float(value)


def _names(payload: Payload, key: str) -> tuple[str, ...] | None:
    value = payload.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"{key} must be a list of VM names")
    return tuple(value)


def _text(payload: Payload, key: str, default: str) -> str:
    value = payload.get(key, default)
    if not isinstance(value, str):
        raise BadRequest(f"{key} must be a string")
    return value


def event_spec_from_json(payload: Payload) -> EventSpec:
    """A custom event from control-API JSON (fields in this module's docstring)."""
    event_type = payload.get("EventType")
    if not isinstance(event_type, str) or not event_type:
        raise BadRequest(
            "EventType is required (Freeze, Reboot, Redeploy, Preempt, Terminate, ...)"
        )
    duration = payload.get("DurationInSeconds", -1)
    if isinstance(duration, bool) or not isinstance(duration, int):
        raise BadRequest("DurationInSeconds must be an integer")
    not_before = payload.get("NotBefore")
    if not_before is not None and not isinstance(not_before, str):
        raise BadRequest("NotBefore must be a string")
    notice = _number(payload, "notice")
    return EventSpec(
        event_type=event_type,
        resources=_names(payload, "Resources") or (),
        audience=_names(payload, "audience"),
        notice=900.0 if notice is None else notice,
        run_time=_number(payload, "runTime"),
        status=_text(payload, "EventStatus", "Scheduled"),
        description=_text(payload, "Description", ""),
        event_source=_text(payload, "EventSource", "Platform"),
        duration_in_seconds=duration,
        resource_type=_text(payload, "ResourceType", "VirtualMachine"),
        event_id=_text(payload, "EventId", "") or None,
        cancel_after=_number(payload, "cancelAfter"),
        approval_delay=_number(payload, "approvalDelay"),
        not_before_raw=not_before,
        omit_fields=_names(payload, "omitFields") or (),
    )


def _health(sim: Simulator, base: str, m: re.Match[str], r: Request, p: Payload) -> Any:
    return {"status": "ok"}


def _fleet(sim: Simulator, base: str, m: re.Match[str], r: Request, p: Payload) -> Any:
    vms = []
    for vm in sim.fleet.vms:
        document = sim.document(vm.name)
        vms.append(
            {
                "name": vm.name,
                "vmId": vm.vm_id,
                "resourceId": vm.resource_id,
                "group": vm.group,
                "priority": vm.priority,
                "zone": vm.zone,
                "documentIncarnation": document["DocumentIncarnation"],
                "url": base + vm_path(vm.name),
                "document": document,
            }
        )
    return {"timeScale": sim.fleet.time_scale, "vms": vms}


def _document(sim: Simulator, base: str, m: re.Match[str], r: Request, p: Payload) -> Any:
    version = r.param("api-version") or LATEST_VERSION
    if version not in SCHEDULED_EVENTS_VERSIONS:
        raise BadRequest(f"api-version must be one of {', '.join(SCHEDULED_EVENTS_VERSIONS)}")
    return sim.document(sim.fleet.vm(m["vm"]).name, version)


def _reset(sim: Simulator, base: str, m: re.Match[str], r: Request, p: Payload) -> Any:
    restart_at = p.get("restartAt", 1)
    if isinstance(restart_at, bool) or not isinstance(restart_at, int) or restart_at < 0:
        raise BadRequest("restartAt must be a non-negative integer")
    return {"documentIncarnation": sim.reset_vm(m["vm"], restart_at)}


def _list_scenarios(sim: Simulator, base: str, m: re.Match[str], r: Request, p: Payload) -> Any:
    return {
        "scenarios": [{"name": s.name, "summary": s.summary} for s in scenarios.SCENARIOS.values()]
    }


def _run_scenario(sim: Simulator, base: str, m: re.Match[str], r: Request, p: Payload) -> Any:
    name = _text(p, "name", "")
    ids = sim.run_scenario(
        name,
        vms=_names(p, "vms"),
        notice=_number(p, "notice"),
        run_time=_number(p, "runTime"),
        cancel_after=_number(p, "cancelAfter"),
    )
    return {"eventIds": ids}


def _list_events(sim: Simulator, base: str, m: re.Match[str], r: Request, p: Payload) -> Any:
    return {"events": sim.events()}


def _add_event(sim: Simulator, base: str, m: re.Match[str], r: Request, p: Payload) -> Any:
    return {"eventId": sim.add_event(event_spec_from_json(p))}


def _event_action(sim: Simulator, base: str, m: re.Match[str], r: Request, p: Payload) -> Any:
    actions: Mapping[str, Callable[[str], None]] = {
        "start": sim.start_event,
        "cancel": sim.cancel_event,
        "complete": sim.complete_event,
    }
    actions[m["action"]](m["id"])
    return {"eventId": m["id"], "done": m["action"]}


def _get_faults(sim: Simulator, base: str, m: re.Match[str], r: Request, p: Payload) -> Any:
    return sim.faults.snapshot()


def _set_faults(sim: Simulator, base: str, m: re.Match[str], r: Request, p: Payload) -> Any:
    vm = p.pop("vm", None)
    if vm is not None and not isinstance(vm, str):
        raise BadRequest("vm must be a VM name")
    return sim.set_faults(p, vm)


def _clear_faults(sim: Simulator, base: str, m: re.Match[str], r: Request, p: Payload) -> Any:
    sim.clear_faults(r.param("vm"))
    return sim.faults.snapshot()


def _approvals(sim: Simulator, base: str, m: re.Match[str], r: Request, p: Payload) -> Any:
    return {"approvals": [a.to_json() for a in sim.approvals()]}


def _counters(sim: Simulator, base: str, m: re.Match[str], r: Request, p: Payload) -> Any:
    return {"counters": sim.counters()}


def _reset_counters(sim: Simulator, base: str, m: re.Match[str], r: Request, p: Payload) -> Any:
    sim.reset_counters()
    return {"counters": sim.counters()}


_VM = r"(?P<vm>[^/]+)"
ROUTES = tuple(
    _Route(method, re.compile(pattern), action)
    for method, pattern, action in (
        ("GET", r"/control/health", _health),
        ("GET", r"/control/fleet", _fleet),
        ("GET", rf"/control/vms/{_VM}/document", _document),
        ("POST", rf"/control/vms/{_VM}/reset", _reset),
        ("GET", r"/control/scenarios", _list_scenarios),
        ("POST", r"/control/scenarios", _run_scenario),
        ("GET", r"/control/events", _list_events),
        ("POST", r"/control/events", _add_event),
        ("POST", r"/control/events/(?P<id>[^/]+)/(?P<action>start|cancel|complete)", _event_action),
        ("GET", r"/control/faults", _get_faults),
        ("POST", r"/control/faults", _set_faults),
        ("DELETE", r"/control/faults", _clear_faults),
        ("GET", r"/control/approvals", _approvals),
        ("GET", r"/control/counters", _counters),
        ("DELETE", r"/control/counters", _reset_counters),
    )
)
