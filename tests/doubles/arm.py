"""A strict HTTPS double of ARM's scheduled-events acknowledge (Microsoft.Maintenance, preview).

No emulator exists, so this double checks each request as ARM does and answers as ARM answers,
over TLS on loopback, to the consumer's real client (bridge.cloud.armack) with a real token:

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
(InvalidApiVersionParameter); bearer token accepted by `accept_token` -> 401
(InvalidAuthenticationToken); a list body of 1 to 100 GUIDs -> 400. An event not `offer`ed on
that scope is NotFound (a 404 alone, a 207 detail in a list); an event offered is marked
acknowledged (again: the same answer, as ARM's acknowledge of an approved event).

`script(429, retry_after=2)` answers the next requests before any check, as ARM throttles
(`Retry-After` in seconds, `x-ms-failure-cause: gateway`). Tokens are kept in `tokens_seen` for
assertions only, never in `requests`.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.doubles.httpdouble import Asked, Reply, listener
from tests.doubles.tls import ThrowawayCertificate

API_VERSION = "2025-10-01-preview"
_SCOPE = (
    r"(?P<scope>/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.compute/"
    r"(?:virtualmachines|virtualmachinescalesets|availabilitysets)/[^/]+)"
)
_SINGLE = re.compile(_SCOPE + r"/providers/microsoft\.maintenance/scheduledevents/(?P<id>[^/]+)"
                     r"/acknowledge", re.IGNORECASE)  # fmt: skip
_LIST = re.compile(_SCOPE + r"/providers/microsoft\.maintenance/scheduledevents", re.IGNORECASE)
_GUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
MAX_LIST = 100


@dataclass(frozen=True)
class AckRequest:
    """One request as the double saw it (never the token); `at`: time.monotonic() on arrival."""

    method: str
    path: str
    status: int
    scope: str | None
    event_ids: tuple[str, ...]
    at: float


@dataclass(frozen=True)
class _Reply:
    status: int
    body: dict[str, Any] | None
    headers: tuple[tuple[str, str], ...] = ()


def _error(status: int, code: str, message: str, *headers: tuple[str, str]) -> _Reply:
    return _Reply(status, {"error": {"code": code, "message": message}}, headers)


class ArmDouble:
    """ARM's acknowledge on https://127.0.0.1:<port>; trust `ca_bundle` (REQUESTS_CA_BUNDLE)."""

    def __init__(self, *, accept_token: Callable[[str], bool] | None = None) -> None:
        self.accept_token: Callable[[str], bool] = accept_token or bool
        self._lock = threading.Lock()
        self._offered: dict[tuple[str, str], bool] = {}  # (scope, event id) -> acknowledged
        self._requests: list[AckRequest] = []
        self._tokens: list[str] = []
        self._script: deque[tuple[int, str | None]] = deque()
        self._certificate = ThrowawayCertificate("arm-double-")
        self._listener = listener(self._serve, "arm-double", tls=self._certificate.context)

    # --- set-up ----------------------------------------------------------------------------

    def offer(self, scope: str, *event_ids: str) -> None:
        """Events that exist on `scope` (a compute resource id) and may be acknowledged."""
        with self._lock:
            for event_id in event_ids:
                self._offered.setdefault((scope.lower(), event_id.lower()), False)

    def script(self, status: int, *, retry_after: str | None = None, count: int = 1) -> None:
        """Answer the next `count` requests with `status` (429 or 5xx), before any check."""
        with self._lock:
            self._script.extend([(status, retry_after)] * count)

    # --- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> ArmDouble:
        self._listener.up()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._listener.down()
        self._certificate.cleanup()

    @property
    def endpoint(self) -> str:
        return f"https://127.0.0.1:{self._listener.port}"

    @property
    def ca_bundle(self) -> str:
        return str(self._certificate.ca_bundle)

    # --- what tests look at ----------------------------------------------------------------

    def acknowledged(self) -> list[str]:
        """The event ids acknowledged so far (each once, whatever the retries)."""
        with self._lock:
            return sorted(e for (_, e), done in self._offered.items() if done)

    @property
    def requests(self) -> list[AckRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def tokens_seen(self) -> list[str]:
        with self._lock:
            return list(self._tokens)

    # --- the service -----------------------------------------------------------------------

    def _serve(self, asked: Asked) -> Reply:
        reply = self._handle(asked.method, asked.target, asked.headers, asked.body)
        payload = json.dumps(reply.body).encode() if reply.body is not None else b""
        headers = [*reply.headers, ("Content-Type", "application/json; charset=utf-8")]
        if reply.body is not None and reply.status >= 400:
            headers.append(("x-ms-error-code", str(reply.body["error"]["code"])))
        return Reply(reply.status, payload, tuple(headers))

    def _handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> _Reply:
        arrived = time.monotonic()
        parts = urlsplit(target)
        single, many = _SINGLE.fullmatch(parts.path), _LIST.fullmatch(parts.path)
        match = single or many
        scope = match.group("scope").lower() if match else None
        ids: tuple[str, ...] = ()
        reply = self._answer(method, parts.query, headers, body, single, many)
        if isinstance(reply, tuple):
            reply, ids = reply
        with self._lock:
            self._requests.append(AckRequest(method, target, reply.status, scope, ids, arrived))
        return reply

    def _answer(  # noqa: PLR0911, PLR0917 - one answer per check, in ARM's order
        self,
        method: str,
        query: str,
        headers: Mapping[str, str],
        body: bytes,
        single: re.Match[str] | None,
        many: re.Match[str] | None,
    ) -> _Reply | tuple[_Reply, tuple[str, ...]]:
        with self._lock:
            scripted = self._script.popleft() if self._script else None
        if scripted is not None:
            status, after = scripted
            extra = (("Retry-After", after),) if after is not None else ()
            if status == 429:
                return _error(429, "TooManyRequests", "The request is being throttled.",
                              ("x-ms-failure-cause", "gateway"), *extra)  # fmt: skip
            return _error(status, "InternalServerError", "An internal error occurred.", *extra)
        if single is None and many is None:
            return _error(404, "NotFound", "The requested resource was not found.")
        if method != "POST":
            return _error(405, "MethodNotAllowed", f"The method {method} is not allowed.")
        versions = parse_qs(query).get("api-version", [])
        if versions != [API_VERSION]:
            return _error(400, "InvalidApiVersionParameter",
                          f"The api-version '{','.join(versions)}' is invalid.")  # fmt: skip
        scheme, _, token = (headers.get("authorization") or "").partition(" ")
        with self._lock:
            if token and token not in self._tokens:
                self._tokens.append(token)
        if scheme.lower() != "bearer" or not token.strip() or not self.accept_token(token.strip()):
            return _error(401, "InvalidAuthenticationToken",
                          "The access token is invalid.")  # fmt: skip
        match = single or many
        assert match is not None
        scope = match.group("scope").lower()
        if single is not None:
            event_id = single.group("id")
            if not self._acknowledge(scope, event_id):
                return _error(404, "NotFound", "Scheduled event not found."), (event_id,)
            return _Reply(200, {"value": "Successfully Approved"}), (event_id,)
        ids = self._ids(body)
        if ids is None:
            why = f'expected {{"value": [1 to {MAX_LIST} scheduled event ids]}}'
            return _error(400, "InvalidRequestContent", f"The request content was invalid: {why}.")
        missing = [e for e in ids if not self._acknowledge(scope, e)]
        if not missing:
            return _Reply(200, {"value": "Successfully Approved"}), tuple(ids)
        details = [{"target": e, "code": "NotFound", "message": "Scheduled event not found."}
                   for e in missing]  # fmt: skip
        message = ("The operation returned different statuses for the Scheduled Events. Review "
                   "each event's result for details.")  # fmt: skip
        error = {"code": "MultiStatusResponse", "message": message, "details": details}
        return _Reply(207, {"error": error}), tuple(ids)

    @staticmethod
    def _ids(body: bytes) -> list[str] | None:
        try:
            value = json.loads(body).get("value")
        except (ValueError, AttributeError):
            return None
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_LIST:
            return None
        if not all(isinstance(e, str) and _GUID.fullmatch(e) for e in value):
            return None
        return value

    def _acknowledge(self, scope: str, event_id: str) -> bool:
        key = (scope, event_id.lower())
        with self._lock:
            if key not in self._offered:
                return False
            self._offered[key] = True
            return True


def issued_for_arm(issued: Mapping[str, str]) -> Callable[[str], bool]:
    """`accept_token` taking only a token the IMDS simulator issued (Simulator.issued) for ARM."""
    return lambda token: issued.get(token) == "https://management.azure.com"


def client_environment(double: ArmDouble, identity_url: str) -> dict[str, str]:
    """What the consumer's process needs to reach the double as it reaches ARM: trust in its
    certificate, no proxy for loopback, and the managed identity's endpoint (the simulator's)."""
    return {
        "REQUESTS_CA_BUNDLE": double.ca_bundle,
        "CURL_CA_BUNDLE": double.ca_bundle,
        "NO_PROXY": "127.0.0.1,localhost",
        "AZURE_POD_IDENTITY_AUTHORITY_HOST": identity_url,
    }
