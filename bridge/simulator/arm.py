"""ARM's acknowledge of scheduled events (Microsoft.Maintenance, preview) for the simulator and
the demo (issue 36): the consumer's real client (bridge.cloud.armack) approves a simulated event
from outside its VMs, over HTTPS on loopback, with a real bearer token that the simulator's own
managed-identity endpoint issued for ARM. No emulator exists, so this checks each request as ARM
does and answers as ARM answers:

    POST {scope}/providers/Microsoft.Maintenance/scheduledevents/{eventId}/acknowledge
         ?api-version=2025-10-01-preview                         (no body)
    POST {scope}/providers/Microsoft.Maintenance/scheduledevents
         ?api-version=2025-10-01-preview                         {"value": ["<id>", ...]}

where {scope} is /subscriptions/S/resourcegroups/G/providers/Microsoft.Compute/{type}/{name}
(virtualMachines, virtualMachineScaleSets or availabilitySets). Answers, as the REST spec's
examples and the SDK's tests give them (azure-rest-api-specs, specification/maintenance,
ScheduledEvents_Acknowledge.json and ScheduledEvents_AcknowledgeList.json):

    200 {"value": "Successfully Approved"}
    207 {"error": {"code": "MultiStatusResponse", "message": "...", "details":
         [{"target": "<id>", "code": "NotFound", "message": "..."}]}}    (list: some refused)
    404 {"error": {"code": "NotFound", ...}}                             (single: no such event)

Checks, in order: path shape -> 404; POST only -> 405; api-version -> 400
(InvalidApiVersionParameter); a bearer token `accept_token` takes -> 401
(InvalidAuthenticationToken); a list body of 1 to 100 GUIDs -> 400. Then each event id goes to
`acknowledge(scope, event_id)`: False is NotFound (a 404 alone, a 207 detail in a list). For the
simulator that is Simulator.acknowledge, which approves the event as an IMDS StartRequests POST
of its VMs does (it then starts); acknowledging an approved event again answers the same.

    sim = Simulator(Fleet(demo_vms()))
    with SimulatorServer(sim) as imds, ArmServer.for_simulator(sim) as arm:
        # the consumer: eventgrid.arm_endpoint = arm.endpoint, REQUESTS_CA_BUNDLE = arm.ca_bundle,
        # its managed identity from AZURE_POD_IDENTITY_AUTHORITY_HOST = imds.vm_url("web_0")

It also answers the maintenance RP's cancel of a patch run (issue 40), as the REST spec's
example gives it (ApplyUpdates_CreateOrUpdate_CancelMaintenance.json, 2023-10-01-preview):

    PUT {configuration}/providers/Microsoft.Maintenance/applyUpdates/{yyyyMMddHHmmss}
        ?api-version=2023-10-01-preview                {"properties": {"status": "Cancel"}}
    200 {"id": "...", "name": "...", "type": "Microsoft.Maintenance/applyUpdates",
         "properties": {"status": "Cancelled", "resourceId": "{configuration}"}}

where {configuration} is /subscriptions/S/resourcegroups/G/providers/Microsoft.Maintenance/
maintenanceConfigurations/{name}. `cancel_run(configuration, run)` says "Cancelled" (also
again: ARM's PUT is idempotent), "NotFound" (404) or "TooLate" (409 Conflict: Microsoft does
not document the answer to a cancel after the cut-off; this double's guess, which the client
reads as a refusal). Without `cancel_run` every run is NotFound.

`script(429, retry_after="2")` answers the next requests before any check, as ARM throttles
(`Retry-After` in seconds, `x-ms-failure-cause: gateway`). Tokens are kept in `tokens_seen` for
tests' assertions only, never in `requests` nor in a log.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import urlencode

from bridge.simulator.bearer import Bearer, BearerTokens
from bridge.simulator.core import Simulator
from bridge.simulator.imds import Reply, Request
from bridge.simulator.server import RoutingHTTPServer
from bridge.simulator.tls import ThrowawayCertificate

API_VERSION = "2025-10-01-preview"
ARM_RESOURCE = "https://management.azure.com"  # the resource a token for ARM is issued for
_SCOPE = (
    r"(?P<scope>/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.compute/"
    r"(?:virtualmachines|virtualmachinescalesets|availabilitysets)/[^/]+)"
)
_SINGLE = re.compile(
    _SCOPE + r"/providers/microsoft\.maintenance/scheduledevents/(?P<id>[^/]+)"
    r"/acknowledge",
    re.IGNORECASE,
)
_LIST = re.compile(_SCOPE + r"/providers/microsoft\.maintenance/scheduledevents", re.IGNORECASE)
_GUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
MAX_LIST = 100
JSON = "application/json; charset=utf-8"

Acknowledge = Callable[[str, str], bool]  # (scope, event id) -> the event exists there
CANCEL_API_VERSION = "2023-10-01-preview"
_RUN = re.compile(
    r"(?P<config>/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.maintenance/"
    r"maintenanceconfigurations/[^/]+)/providers/microsoft\.maintenance/applyupdates/"
    r"(?P<run>\d{14})",
    re.IGNORECASE,
)
# (configuration id lower case, run name) -> "Cancelled", "NotFound" or "TooLate"
CancelRun = Callable[[str, str], str]


@dataclass(frozen=True)
class AckRequest:
    """One request as ARM's service saw it (never the token); `at`: time.monotonic() on arrival."""

    method: str
    path: str
    status: int
    scope: str | None
    event_ids: tuple[str, ...]
    at: float


def _reply(status: int, body: Any, *headers: tuple[str, str]) -> Reply:
    return Reply(status, json.dumps(body).encode(), JSON, headers)


def _error(status: int, code: str, message: str, *headers: tuple[str, str]) -> Reply:
    body = {"error": {"code": code, "message": message}}
    return _reply(status, body, *headers, ("x-ms-error-code", code))


def issued_for_arm(issued: Mapping[str, str]) -> Callable[[str], bool]:
    """`accept_token` taking only a token the simulator's identity endpoint issued for ARM
    (Simulator.issued)."""
    return lambda token: issued.get(token) == ARM_RESOURCE


class ArmServer:
    """ARM's acknowledge on https://127.0.0.1:<port>; clients trust `ca_bundle`."""

    def __init__(
        self,
        acknowledge: Acknowledge,
        accept_token: Callable[[str], bool],
        host: str = "127.0.0.1",
        *,
        cancel_run: CancelRun | None = None,
    ) -> None:
        self.acknowledge, self.accept_token = acknowledge, accept_token
        self.cancel_run: CancelRun = cancel_run or (lambda _config, _run: "NotFound")
        self._lock = threading.Lock()
        self._requests: list[AckRequest] = []
        self._tokens = BearerTokens()
        self._script: deque[tuple[int, str | None]] = deque()
        self._certificate = ThrowawayCertificate("se-bridge-arm-")
        self._stopping = threading.Event()
        self._server = _ArmHTTPServer(
            (host, 0), self._stopping, self._certificate.context, self.route
        )
        self._thread: threading.Thread | None = None

    @classmethod
    def for_simulator(cls, sim: Simulator) -> ArmServer:
        """ARM for `sim`'s fleet: its events, the tokens its identity endpoint issued for ARM."""
        return cls(sim.acknowledge, issued_for_arm(sim.issued))

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> ArmServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="arm-acknowledge", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.close_connections()
        self._server.server_close()
        self._certificate.cleanup()

    def __enter__(self) -> ArmServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """What eventgrid.arm_endpoint names: https://127.0.0.1:PORT."""
        return self._server.url

    @property
    def ca_bundle(self) -> str:
        """The CA certificate (PEM) a client trusts (REQUESTS_CA_BUNDLE)."""
        return str(self._certificate.ca_bundle)

    def client_environment(self, identity_url: str) -> dict[str, str]:
        """What the consumer's process needs to reach this as it reaches ARM: trust in its
        certificate, no proxy for loopback, and its managed identity's endpoint (a simulated
        VM's, `identity_url`)."""
        return {
            "REQUESTS_CA_BUNDLE": self.ca_bundle,
            "CURL_CA_BUNDLE": self.ca_bundle,
            "NO_PROXY": "127.0.0.1,localhost",
            "AZURE_POD_IDENTITY_AUTHORITY_HOST": identity_url,
        }

    # --- faults and what tests look at -----------------------------------------------------

    def script(self, status: int, *, retry_after: str | None = None, count: int = 1) -> None:
        """Answer the next `count` requests with `status` (429 or 5xx), before any check."""
        with self._lock:
            self._script.extend([(status, retry_after)] * count)

    @property
    def requests(self) -> list[AckRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def tokens_seen(self) -> list[str]:
        return self._tokens.seen

    # --- the service -----------------------------------------------------------------------

    def route(self, request: Request) -> Reply:
        arrived = time.monotonic()
        run = _RUN.fullmatch(request.path)
        single, many = _SINGLE.fullmatch(request.path), _LIST.fullmatch(request.path)
        match = single or many
        scope = match.group("scope").lower() if match else None
        if run is not None:
            scope = run.group("config").lower()
            reply, ids = self._cancel(request, run)
        else:
            reply, ids = self._answer(request, single, many)
        query = urlencode(request.query, doseq=True)
        target = f"{request.path}?{query}" if query else request.path
        with self._lock:
            self._requests.append(
                AckRequest(request.method, target, reply.status, scope, ids, arrived)
            )
        return reply

    def _answer(  # noqa: PLR0911 - one answer per check, in ARM's order
        self, request: Request, single: re.Match[str] | None, many: re.Match[str] | None
    ) -> tuple[Reply, tuple[str, ...]]:
        with self._lock:
            scripted = self._script.popleft() if self._script else None
        if scripted is not None:
            status, after = scripted
            extra = (("Retry-After", after),) if after is not None else ()
            if status == 429:
                return _error(
                    429,
                    "TooManyRequests",
                    "The request is being throttled.",
                    ("x-ms-failure-cause", "gateway"),
                    *extra,
                ), ()
            return _error(status, "InternalServerError", "An internal error occurred.", *extra), ()
        match = single or many
        if match is None:
            return _error(404, "NotFound", "The requested resource was not found."), ()
        refused = self._refused(request, "POST", API_VERSION)
        if refused is not None:
            return refused, ()
        scope = match.group("scope").lower()
        if single is not None:
            event_id = single.group("id")
            if not self.acknowledge(scope, event_id):
                return _error(404, "NotFound", "Scheduled event not found."), (event_id,)
            return _reply(200, {"value": "Successfully Approved"}), (event_id,)
        ids = _ids(request.body)
        if ids is None:
            why = f'expected {{"value": [1 to {MAX_LIST} scheduled event ids]}}'
            return _error(
                400, "InvalidRequestContent", f"The request content was invalid: {why}."
            ), ()
        missing = [e for e in ids if not self.acknowledge(scope, e)]
        if not missing:
            return _reply(200, {"value": "Successfully Approved"}), tuple(ids)
        details = [
            {"target": e, "code": "NotFound", "message": "Scheduled event not found."}
            for e in missing
        ]
        message = (
            "The operation returned different statuses for the Scheduled Events. Review "
            "each event's result for details."
        )
        error = {"code": "MultiStatusResponse", "message": message, "details": details}
        return _reply(207, {"error": error}), tuple(ids)

    def _refused(self, request: Request, method: str, api_version: str) -> Reply | None:
        """ARM's answer to a call with the wrong method, api-version or token; None when right."""
        if request.method != method:
            return _error(405, "MethodNotAllowed", f"The method {request.method} is not allowed.")
        versions = list(request.query.get("api-version", []))
        if versions != [api_version]:
            return _error(
                400,
                "InvalidApiVersionParameter",
                f"The api-version '{','.join(versions)}' is invalid.",
            )
        if self._tokens.check(request.headers, self.accept_token) is not Bearer.ACCEPTED:
            return _error(401, "InvalidAuthenticationToken", "The access token is invalid.")
        return None

    def _cancel(self, request: Request, run: re.Match[str]) -> tuple[Reply, tuple[str, ...]]:
        """A patch run's applyUpdates PUT (its checks in ARM's order, as `_answer`'s)."""
        with self._lock:
            scripted = self._script.popleft() if self._script else None
        if scripted is not None:
            status, after = scripted
            extra = (("Retry-After", after),) if after is not None else ()
            code = "TooManyRequests" if status == 429 else "InternalServerError"
            return _error(status, code, "The request is being throttled.", *extra), ()
        name = run.group("run")
        refused = self._refused(request, "PUT", CANCEL_API_VERSION)
        if refused is not None:
            return refused, ()
        try:
            wanted: object = json.loads(request.body)["properties"]["status"]
        except (ValueError, KeyError, TypeError):
            wanted = None
        if wanted != "Cancel":
            return _error(
                400, "InvalidRequestContent", 'expected {"properties": {"status": "Cancel"}}'
            ), (name,)
        config = run.group("config")
        said = self.cancel_run(config.lower(), name)
        if said == "NotFound":
            return _error(404, "NotFound", "The maintenance run was not found."), (name,)
        if said == "TooLate":
            return _error(
                409, "Conflict", "The cancellation cut-off of the maintenance run has passed."
            ), (name,)
        body = {
            "id": f"{config}/providers/microsoft.maintenance/applyupdates/{name}".lower(),
            "name": name,
            "type": "Microsoft.Maintenance/applyUpdates",
            "properties": {"status": "Cancelled", "resourceId": config.lower()},
        }
        return _reply(200, body), (name,)


def _ids(body: bytes) -> Sequence[str] | None:
    """The list acknowledge's event ids, or None when the body is not 1 to 100 GUIDs."""
    try:
        value = json.loads(body).get("value")
    except (ValueError, AttributeError):
        return None
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_LIST:
        return None
    if not all(isinstance(e, str) and _GUID.fullmatch(e) for e in value):
        return None
    return value


class _ArmHTTPServer(RoutingHTTPServer):
    def __init__(
        self,
        address: tuple[str, int],
        stopping: threading.Event,
        tls: ssl.SSLContext,
        route: Callable[[Request], Reply],
    ) -> None:
        super().__init__(address, stopping, tls)
        self._route = route

    def route(self, request: Request) -> Reply:
        return self._route(request)
