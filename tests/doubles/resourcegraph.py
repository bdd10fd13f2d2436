"""An HTTPS double of Azure Resource Graph's query API, for the consumer's reconciler (issue 36).

No Resource Graph emulator exists, so this answers what the service answers on the wire:

    POST /providers/Microsoft.ResourceGraph/resources?api-version=2022-10-01
    Authorization: Bearer <token>
    {"subscriptions": [...], "query": "...", "options": {"$top", "$skipToken", "resultFormat"}}

    200 {"totalRecords", "count", "resultTruncated": "false", "facets": [], "data": [...],
         "$skipToken" while rows remain}, with x-ms-user-quota-remaining and
         x-ms-user-quota-resets-after (hh:mm:ss) on every answer
    401 {"error": {"code": "AuthenticationFailed", ...}} without a bearer token
    400 {"error": {"code": "BadRequest", ...}} without api-version, or a body that is not a query
    429 {"error": {"code": "RateLimiting", ...}} with Retry-After, past the quota (`quota`
        queries a `window` of seconds, 15 in 5 s as documented) or while scripted (`throttle`)

over TLS on 127.0.0.1 with a throwaway CA (`ca_bundle`, for REQUESTS_CA_BUNDLE). The query is
not KQL-evaluated: its first word names the table (maintenanceresources, healthresources,
resources, computeresources, servicehealthresources, containerserviceeventresources; `refuse`
answers a table's queries with a status of its own), whose rows are what the test put; the
request's subscriptions narrow them, and so do the clauses the consumer writes: `type =~
'kind'` (a row without a type is kept), `resourceGroup in~ ('a', 'b')`, `availabilityState) !=
'Available' or tolower(tostring(properties.targetResourceId)) in ('id', ...)`, the week ahead's
`TrackingId in ('PYN_-ZL8', ...)` (an impacted resource's event, from its id) and `tolower(id)
in ('id', ...)`. `requests` lists what came (never the token).
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.doubles.httpdouble import Asked, ListeningDouble, Reply
from tests.doubles.tls import ThrowawayCertificate

PATH = "/providers/Microsoft.ResourceGraph/resources"
_GROUPS = re.compile(r"resourceGroup in~ \(([^)]*)\)")
_HELD = re.compile(r"targetResourceId\)\) in \(([^)]*)\)")
_TYPE = re.compile(r"\| where type =~ '([^']*)'")
_TRACKING = re.compile(r"\| where TrackingId in \(([^)]*)\)")
_IDS = re.compile(r"\| where tolower\(id\) in \(([^)]*)\)")
_EVENT = re.compile(r"/events/([^/]+)/", re.IGNORECASE)


@dataclass(frozen=True)
class GraphRequest:
    """One request as the double saw it."""

    table: str
    page: int  # 0 for the first page
    authorized: bool
    status: int
    bytes_in: int
    bytes_out: int


class ResourceGraphDouble(ListeningDouble):
    """Resource Graph on https://127.0.0.1:<port> holding `tables` ({table: rows}).

    with ResourceGraphDouble() as graph:
        graph.tables["maintenanceresources"].append(row)
        ResourceGraph(graph.url, credential, RequestsTransport())  # REQUESTS_CA_BUNDLE set
    """

    def __init__(self, *, quota: int = 15, window: float = 5.0) -> None:
        self.tables: dict[str, list[dict[str, Any]]] = {
            "maintenanceresources": [], "healthresources": [], "resources": [],
            "servicehealthresources": [], "containerserviceeventresources": []}  # fmt: skip
        self.quota, self.window = quota, window
        self.throttle = 0  # the next `throttle` queries get 429, before the quota's count
        self.refuse: dict[str, int] = {}  # table -> the status its queries get (403: no Reader)
        self.retry_after = 1
        self.requests: list[GraphRequest] = []
        self._lock = threading.Lock()
        self._spent: list[float] = []
        self._certificate = ThrowawayCertificate("resource-graph-double-")
        super().__init__(self._serve, "resource-graph-double", tls=self._certificate.context)

    def close(self) -> None:
        super().close()
        self._certificate.cleanup()

    @property
    def url(self) -> str:
        return self._listener.url("https")

    @property
    def ca_bundle(self) -> Path:
        return self._certificate.ca_bundle

    def _note(self, request: GraphRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _serve(self, asked: Asked) -> Reply:
        token = asked.headers.get("authorization", "")
        status, answer, headers, table, page = self._answer(asked.target, token, asked.body)
        data = json.dumps(answer).encode()
        bearer = token.startswith("Bearer ") and len(token) > 7
        self._note(GraphRequest(table, page, bearer, status, len(asked.body), len(data)))
        return Reply(status, data, (*headers, ("Content-Type", "application/json; charset=utf-8")))

    def _answer(
        self, path: str, token: str, body: bytes
    ) -> tuple[int, dict[str, Any], list[tuple[str, str]], str, int]:
        parts = urlsplit(path)
        if parts.path != PATH or "api-version" not in parse_qs(parts.query):
            return 400, _error("BadRequest", "no api-version, or not the query API"), [], "", 0
        if not token.startswith("Bearer ") or len(token) <= 7:
            return 401, _error("AuthenticationFailed", "Authentication failed. The "
                               "'Authorization' header is missing."), [], "", 0  # fmt: skip
        try:
            request = json.loads(body)
            query, subscriptions = str(request["query"]), set(request["subscriptions"])
            options = request.get("options") or {}
        except (ValueError, KeyError, TypeError):
            return 400, _error("BadRequest", "the body is not a query request"), [], "", 0
        table = query.split("|", 1)[0].strip().lower()
        if table in self.refuse:
            code = self.refuse[table]
            refused = _error("AuthorizationFailed", "The client does not have "
                             "authorization to perform action "
                             "'Microsoft.ResourceGraph/resources/read'.")  # fmt: skip
            return code, refused, [], table, 0
        offset = int(base64.b64decode(options["$skipToken"])) if options.get("$skipToken") else 0
        page = offset // max(1, int(options.get("$top", 1000)))
        with self._lock:
            now = time.monotonic()
            self._spent = [t for t in self._spent if now - t < self.window]
            if self.throttle > 0 or len(self._spent) >= self.quota:
                self.throttle = max(0, self.throttle - 1)
                wait = str(self.retry_after)
                busy = _error("RateLimiting", "Please provide below info when asking for "
                              "support: timestamp = ...")  # fmt: skip
                return 429, busy, [("Retry-After", wait)], table, page
            self._spent.append(now)
            remaining = self.quota - len(self._spent)
            resets = max(0.0, self.window - (now - self._spent[0]))
            rows = [r for r in self.tables.get(table, [])
                    if r.get("subscriptionId") in subscriptions]  # fmt: skip
        if "availabilityState) != 'Available'" in query:
            held = _HELD.search(query)
            ids = {i.strip().strip("'") for i in held.group(1).split(",")} if held else set()
            rows = [r for r in rows if r["properties"].get("availabilityState") != "Available"
                    or str(r["properties"].get("targetResourceId", "")).lower() in ids]  # fmt: skip
        kind = _TYPE.search(query)
        if kind:
            rows = [r for r in rows if str(r.get("type", kind.group(1))).lower()
                    == kind.group(1).lower()]  # fmt: skip
        tracking = _TRACKING.search(query)
        if tracking:
            named = _names(tracking.group(1))
            rows = [r for r in rows if _event_of(r) in named]
        listed = _IDS.search(query)
        if listed:
            named = _names(listed.group(1))
            rows = [r for r in rows if str(r.get("id", "")).lower() in named]
        groups = _GROUPS.search(query)
        if groups:
            names = {g.strip().strip("'").lower() for g in groups.group(1).split(",")}
            rows = [r for r in rows if str(r.get("resourceGroup", "")).lower() in names]
        top = min(1000, int(options.get("$top", 1000)))
        chunk = rows[offset : offset + top]
        answer: dict[str, Any] = {"totalRecords": len(rows), "count": len(chunk), "data": chunk,
                                  "facets": [], "resultTruncated": "false"}  # fmt: skip
        if offset + top < len(rows):
            answer["$skipToken"] = base64.b64encode(str(offset + top).encode()).decode()
        resets_after = time.strftime("%H:%M:%S", time.gmtime(resets))
        headers = [("x-ms-user-quota-remaining", str(remaining)),
                   ("x-ms-user-quota-resets-after", resets_after)]  # fmt: skip
        return 200, answer, headers, table, page


def _event_of(row: dict[str, Any]) -> str:
    """The tracking id of the Service Health event an impacted resource's id names."""
    found = _EVENT.search(str(row.get("id", "")))
    return found.group(1).lower() if found else ""


def _names(listed: str) -> set[str]:
    return {n.strip().strip("'").lower() for n in listed.split(",")}


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def row_of(delivery: str) -> dict[str, Any]:
    """The Resource Graph row an Event Grid delivery (tests/support/eventgrid) announces."""
    info = dict(json.loads(delivery)["data"]["resourceInfo"])
    parts = info["id"].split("/")
    info["type"] = info["type"].lower()
    info["subscriptionId"], info["resourceGroup"] = parts[2], parts[4]
    return info
