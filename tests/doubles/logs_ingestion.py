"""A strict HTTPS double of the Azure Monitor Logs Ingestion API.

No emulator exists, so this double checks each request the way the service does and answers
the way the service answers, and the real SDK (`azure.monitor.ingestion.LogsIngestionClient`)
talks to it over TLS:

    POST /dataCollectionRules/{ruleId}/streams/{stream}?api-version=2023-01-01
    Authorization: Bearer <token>
    Content-Encoding: gzip          (optional: the service takes plain JSON too; the SDK gzips)
    Content-Type: application/json
    <a JSON array of objects, at most 1 MiB uncompressed>

Checks, in order, and the answers (the error body is always `{"error": {"code", "message"}}`):
path shape -> 404; POST only -> 405; api-version exactly 2023-01-01 -> 400; bearer token present
and accepted by `accept_token` -> 401; known rule id -> 404; stream declared in the rule -> 404;
Content-Type JSON -> 415; Content-Encoding gzip or none -> 415; body (raw and uncompressed)
at most `max_body_bytes` -> 413; valid gzip, UTF-8 JSON array of objects -> 400; every key a
declared column and every value of the column's type or null -> 400 naming record, column and
problem. Success: 204, no body; the records are stored in order per (rule, stream).

The 403 and 413 texts (and the 413's code) are the service's own, as seen in the wild; the
other codes and messages are this double's (the service documents none of them). Errors also
carry the code in an `x-ms-error-code` header, as the service does. Two places where the double
is deliberately STRICTER than the service: the service answers 204 to a body that is an object
instead of an array and to records whose columns or types do not match the declaration, and
then drops them silently (at best visible in the DCR's error logs); here those are 400s, so our
shape mistakes fail tests instead of vanishing.

Scripted faults (`script(...)`) are answered before any of the checks, one per request, in
order; `down()` closes the listener and every open connection (clients get "connection
refused"), `up()` listens again on the same port.

Tokens are kept in `tokens_seen` for assertions only: they never appear in `requests`, in
error messages or in logs.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import threading
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from bridge.simulator.bearer import Bearer, BearerTokens
from tests.doubles.httpdouble import Asked, Reply, listener
from tests.doubles.tls import ThrowawayCertificate

logger = logging.getLogger("tests.doubles.logs_ingestion")
JSON_UTF8 = "application/json; charset=utf-8"

API_VERSION = "2023-01-01"  # what azure-monitor-ingestion 1.1.0 sends, and the only one accepted
MAX_BODY_BYTES = 1024 * 1024  # the service's "1 MB" per call; also the SDK's chunk budget
_READ_CAP = 16 * MAX_BODY_BYTES  # a larger Content-Length is refused without reading the body
COLUMN_TYPES = frozenset({"string", "int", "long", "real", "boolean", "datetime", "dynamic"})
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_PATH = re.compile(r"/dataCollectionRules/(?P<rule>[^/]+)/streams/(?P<stream>[^/]+)")
# ISO 8601 as Log Analytics takes it: a date, optionally a time (seconds and up to 7 fraction
# digits optional) with an optional Z or +hh:mm offset (none means UTC).
_DATETIME = re.compile(
    r"(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})"
    r"(?:T(?P<h>\d{2}):(?P<mi>\d{2})(?::(?P<s>\d{2})(?:\.(?P<f>\d{1,7}))?)?"
    r"(?P<tz>Z|[+-](?P<oh>\d{2}):(?P<om>\d{2}))?)?"
)
_MAX_PROBLEMS = 10  # listed in one 400 message; the rest are counted


@dataclass(frozen=True)
class IngestionRequest:
    """One request as the double saw it. Never the token."""

    method: str
    path: str  # path and query, as sent
    status: int
    size: int  # body bytes as received (compressed, when gzip)
    content_encoding: str | None
    uncompressed_size: int | None = None  # when the body was read and decoded
    record_count: int | None = None  # when the body was a JSON array


@dataclass(frozen=True)
class _Scripted:
    status: int
    retry_after: str | None
    message: str | None


@dataclass
class _Seen:
    uncompressed: int | None = None
    count: int | None = None


@dataclass(frozen=True)
class _Reply:
    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


def _sent(reply: _Reply) -> Reply:
    """As the service sends it: a body is JSON."""
    if not reply.body or reply.status == 204:
        return Reply(reply.status, b"" if reply.status == 204 else reply.body, reply.headers)
    return Reply(reply.status, reply.body, (*reply.headers, ("Content-Type", JSON_UTF8)))


def _error(status: int, code: str, message: str, *headers: tuple[str, str]) -> _Reply:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    return _Reply(status, body, (("x-ms-error-code", code), *headers))


def _describe(value: Any) -> str:
    kind = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }.get(type(value), type(value).__name__)
    text = json.dumps(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"


def _datetime_problem(value: str) -> str | None:
    match = _DATETIME.fullmatch(value)
    if match is None:
        return "not an ISO 8601 date-time"
    parts = match.groupdict()
    try:
        datetime(int(parts["y"]), int(parts["mo"]), int(parts["d"]))
        if parts["h"] is not None:
            datetime(2000, 1, 1, int(parts["h"]), int(parts["mi"]), int(parts["s"] or 0))
        if parts["oh"] is not None:
            timezone(timedelta(hours=int(parts["oh"]), minutes=int(parts["om"])))
    except ValueError as err:
        return f"not a valid date-time ({err})"
    return None


def _text(kind: str, value: Any) -> str | None:
    if not isinstance(value, str):
        return f"expected {kind} (a JSON string), got {_describe(value)}"
    problem = _datetime_problem(value) if kind == "datetime" else None
    return None if problem is None else f"expected datetime, got {json.dumps(value)}: {problem}"


def _boolean(kind: str, value: Any) -> str | None:
    return None if isinstance(value, bool) else f"expected {kind}, got {_describe(value)}"


def _integer(kind: str, value: Any) -> str | None:
    if not isinstance(value, int) or isinstance(value, bool):
        return f"expected {kind} (a JSON integer), got {_describe(value)}"
    low, high = _INT32 if kind == "int" else _INT64
    return None if low <= value <= high else f"{value} is out of range for {kind}"


def _real(kind: str, value: Any) -> str | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None
    return f"expected {kind} (a JSON number), got {_describe(value)}"


_CHECKS: dict[str, Callable[[str, Any], str | None]] = {
    "string": _text,
    "datetime": _text,
    "boolean": _boolean,
    "int": _integer,
    "long": _integer,
    "real": _real,
    "dynamic": lambda kind, value: None,
}
assert set(_CHECKS) == COLUMN_TYPES


def value_problem(kind: str, value: Any) -> str | None:
    """Why `value` cannot go into a column of type `kind`, or None when it can (null always can)."""
    return None if value is None else _CHECKS[kind](kind, value)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _Stream:
    def __init__(self, name: str, declaration: Mapping[str, Any]) -> None:
        self.name = name
        self.columns: dict[str, str] = {}
        for column in declaration["columns"]:
            kind = column["type"]
            if kind not in COLUMN_TYPES:
                raise ValueError(f"stream {name}: column {column['name']} has type {kind!r}")
            self.columns[column["name"]] = kind

    def problems(self, records: list[Any]) -> list[str]:
        found: list[str] = []
        for index, record in enumerate(records):
            if not isinstance(record, dict):
                found.append(f"record {index}: expected a JSON object, got {_describe(record)}")
                continue
            for column, value in record.items():
                kind = self.columns.get(column)
                if kind is None:
                    found.append(
                        f"record {index}: column {column!r} is not declared in stream {self.name}"
                    )
                    continue
                problem = value_problem(kind, value)
                if problem is not None:
                    found.append(f"record {index}: column {column!r}: {problem}")
        return found


class LogsIngestionDouble:
    """The Logs Ingestion API on https://127.0.0.1:<free port>, with a throwaway CA in `ca_bundle`.

    with LogsIngestionDouble(rule_id="dcr-...", stream=DCR_STREAM,
                             declaration=schema.dcr_stream_declaration()) as double:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(double.ca_bundle))
        LogsIngestionClient(double.endpoint, credential).upload(...)
        double.records()
    """

    def __init__(
        self,
        rule_id: str,
        stream: str,
        declaration: Mapping[str, Any],
        *,
        accept_token: Callable[[str], bool] | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        host: str = "127.0.0.1",
    ) -> None:
        self.default_rule = rule_id
        self.default_stream = stream
        self._rules: dict[str, dict[str, _Stream]] = {
            rule_id: {stream: _Stream(stream, declaration)}
        }
        self.accept_token: Callable[[str], bool] = accept_token or bool
        self.max_body_bytes = max_body_bytes
        self._host = host
        self._lock = threading.Lock()
        self._records: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._requests: list[IngestionRequest] = []
        self._tokens = BearerTokens()
        self._tls_errors: list[str] = []
        self._script: deque[tuple[_Scripted, int | None]] = deque()
        self._certificate = ThrowawayCertificate("logs-ingestion-double-")
        self._tls_context = self._certificate.context
        self._listener = listener(self._serve, "logs-ingestion-double", host,
                                  tls=self._tls_context, tls_failed=self._note_tls_error,
                                  max_body=_READ_CAP, refuse=self._refuse)  # fmt: skip
        self._started = False

    # --- configuration -------------------------------------------------------------------

    def add_stream(self, rule_id: str, stream: str, declaration: Mapping[str, Any]) -> None:
        """Declare another stream (in the same or another rule)."""
        with self._lock:
            self._rules.setdefault(rule_id, {})[stream] = _Stream(stream, declaration)

    def script(
        self,
        status: int,
        *,
        retry_after: float | str | None = None,
        count: int | None = 1,
        message: str | None = None,
    ) -> None:
        """Answer the next `count` requests (None: every request until `clear_script()`) with
        `status`, before any check. Queued after what is already scripted."""
        if not 400 <= status <= 599:
            raise ValueError("scripted answers are errors (4xx or 5xx)")
        if count is not None and count < 1:
            raise ValueError("count must be at least 1 (or None for every request)")
        if isinstance(retry_after, float) and retry_after.is_integer():
            retry_after = int(retry_after)
        after = None if retry_after is None else str(retry_after)
        with self._lock:
            self._script.append((_Scripted(status, after, message), count))

    def clear_script(self) -> None:
        with self._lock:
            self._script.clear()

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> LogsIngestionDouble:
        if self._started:
            return self
        self._started = True
        try:
            self.up()
        except BaseException:
            self.stop()
            raise
        return self

    def up(self) -> None:
        """Listen (again, on the same port once one was chosen)."""
        self._listener.up()

    def down(self) -> None:
        """Close the listener and every open connection: clients get "connection refused"."""
        self._listener.down()

    def stop(self) -> None:
        self.down()
        self._certificate.cleanup()

    def __enter__(self) -> LogsIngestionDouble:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # --- what tests look at --------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        if not self._listener.port:
            raise RuntimeError("the double is not started")
        return f"https://{self._host}:{self._listener.port}"

    @property
    def ca_bundle(self) -> Path:
        """The PEM file holding the CA that signed the server certificate."""
        return self._certificate.ca_bundle

    def records(
        self, rule_id: str | None = None, stream: str | None = None
    ) -> list[dict[str, Any]]:
        """Accepted records of (rule_id, stream) in order; the constructor's rule and stream
        by default."""
        key = (rule_id or self.default_rule, stream or self.default_stream)
        with self._lock:
            return copy.deepcopy(self._records.get(key, []))

    @property
    def requests(self) -> list[IngestionRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def tokens_seen(self) -> list[str]:
        """Distinct bearer tokens, in the order first seen."""
        return self._tokens.seen

    @property
    def tls_errors(self) -> list[str]:
        """Failed TLS handshakes (e.g. a client that does not trust the certificate)."""
        with self._lock:
            return list(self._tls_errors)

    # --- request handling (handler threads) ----------------------------------------------

    def _note_tls_error(self, err: BaseException) -> None:
        with self._lock:
            self._tls_errors.append(f"{type(err).__name__}: {err}")

    def _next_scripted(self) -> _Scripted | None:
        with self._lock:
            if not self._script:
                return None
            scripted, count = self._script[0]
            if count is not None:
                if count <= 1:
                    self._script.popleft()
                else:
                    self._script[0] = (scripted, count - 1)
            return scripted

    def _scripted_reply(self, scripted: _Scripted, rule_id: str) -> _Reply:
        headers = () if scripted.retry_after is None else (("Retry-After", scripted.retry_after),)
        status = scripted.status
        if status == 403:
            code, message = (
                "OperationFailed",
                "The authentication token provided does not have access to ingest data for the "
                f"data collection rule with immutable Id '{rule_id}'.",
            )
        elif status == 429:
            code, message = "TooManyRequests", "Too many requests; retry after the Retry-After."
        else:
            try:
                code = HTTPStatus(status).phrase.replace(" ", "")
            except ValueError:
                code = "Error"
            message = f"Scripted {status} from the Logs Ingestion double."
        return _error(status, code, scripted.message or message, *headers)

    def _serve(self, asked: Asked) -> Reply:
        return _sent(self._handle(asked.method, asked.target, asked.headers, asked.body))

    def _refuse(self, asked: Asked, length: int) -> Reply:
        """A request whose body is not read: without a Content-Length (the SDK always sends
        one; refuse what we do not parse) or past the read cap."""
        reply = (
            _error(411, "LengthRequired", "A Content-Length header is required.")
            if length < 0
            else self._too_large(str(length))
        )
        encoding = asked.headers.get("content-encoding")
        self._log(IngestionRequest(asked.method, asked.target, reply.status, max(length, 0),
                                   encoding))  # fmt: skip
        return _sent(reply)

    def _handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> _Reply:
        seen = _Seen()
        reply = self._answer(method, target, headers, body, seen)
        self._log(
            IngestionRequest(
                method,
                target,
                reply.status,
                len(body),
                headers.get("content-encoding"),
                seen.uncompressed,
                seen.count,
            )
        )
        return reply

    def _log(self, request: IngestionRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _answer(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes, seen: _Seen
    ) -> _Reply:
        url = urlsplit(target)
        scripted = self._next_scripted()
        if scripted is not None:
            match = _PATH.fullmatch(url.path)
            return self._scripted_reply(scripted, unquote(match["rule"]) if match else "")
        route = self._route(method, url.path, url.query)
        if isinstance(route, _Reply):
            return route
        # Authentication before the rule lookup: a caller without a valid token learns nothing
        # about which rules exist.
        stream = self._check_token(headers) or self._stream(*route)
        if isinstance(stream, _Reply):
            return stream
        refusal = self._check_content_headers(headers)
        if refusal is not None:
            return refusal
        data = self._decode(body, headers.get("content-encoding"))
        if isinstance(data, _Reply):
            return data
        seen.uncompressed = len(data)
        return self._ingest(route[0], stream, data, seen)

    def _route(self, method: str, path: str, query: str) -> _Reply | tuple[str, str]:
        match = _PATH.fullmatch(path)
        if match is None:
            return _error(404, "NotFound", f"No route for {path!r}.")
        if method != "POST":
            return _error(405, "MethodNotAllowed", f"{method} is not supported; use POST.")
        versions = parse_qs(query, keep_blank_values=True).get("api-version", [])
        if versions != [API_VERSION]:
            got = ", ".join(versions) or "none"
            message = f"The api-version query parameter must be '{API_VERSION}' (got: {got})."
            return _error(400, "InvalidApiVersion", message)
        return unquote(match["rule"]), unquote(match["stream"])

    def _stream(self, rule_id: str, stream_name: str) -> _Reply | _Stream:
        with self._lock:
            streams = self._rules.get(rule_id)
            stream = None if streams is None else streams.get(stream_name)
        if streams is None:
            message = f"Data collection rule with immutable Id '{rule_id}' not found."
            return _error(404, "NotFound", message)
        if stream is None:
            message = (
                f"Stream '{stream_name}' is not declared in the data collection rule "
                f"with immutable Id '{rule_id}'."
            )
            return _error(404, "InvalidStream", message)
        return stream

    def _check_token(self, headers: Mapping[str, str]) -> _Reply | None:
        found = self._tokens.check(headers, self.accept_token)
        if found is Bearer.MISSING:
            return self._unauthorized("A bearer token is required.")
        if found is Bearer.REFUSED:
            return self._unauthorized("The provided token is invalid or has expired.")
        return None

    def _check_content_headers(self, headers: Mapping[str, str]) -> _Reply | None:
        content_type = (headers.get("content-type") or "").split(";")[0].strip().lower()
        if content_type != "application/json":
            message = "The Content-Type must be application/json."
            return _error(415, "UnsupportedMediaType", message)
        encoding = headers.get("content-encoding")
        if encoding not in (None, "gzip"):
            message = f"Content-Encoding {encoding!r} is not supported; use gzip or none."
            return _error(415, "UnsupportedContentEncoding", message)
        return None

    def _decode(self, body: bytes, encoding: str | None) -> bytes | _Reply:
        if len(body) > self.max_body_bytes:
            return self._too_large(str(len(body)))
        if encoding != "gzip":
            return body
        decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            data = decoder.decompress(body, _READ_CAP + 1)  # a gzip bomb stops here
        except zlib.error as err:
            return _error(400, "InvalidContentEncoding", f"The body is not gzip: {err}.")
        if len(data) > self.max_body_bytes:
            return self._too_large(str(len(data)) if len(data) <= _READ_CAP else f"> {_READ_CAP}")
        if not decoder.eof or decoder.unused_data:
            message = "The body is not one complete gzip stream."
            return _error(400, "InvalidContentEncoding", message)
        return data

    def _ingest(self, rule_id: str, stream: _Stream, data: bytes, seen: _Seen) -> _Reply:
        try:
            decoded = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError) as err:
            return _error(400, "InvalidJson", f"The body is not UTF-8 JSON: {err}.")
        if not isinstance(decoded, list):
            message = f"The body must be a JSON array, got {_describe(decoded)}."
            return _error(400, "InvalidJson", message)
        seen.count = len(decoded)
        problems = stream.problems(decoded)
        if problems:
            more = len(problems) - _MAX_PROBLEMS
            message = "; ".join(problems[:_MAX_PROBLEMS])
            message += f"; and {more} more problems" if more > 0 else ""
            return _error(400, "InvalidRecords", message)
        with self._lock:
            self._records.setdefault((rule_id, stream.name), []).extend(decoded)
        return _Reply(204)

    def _unauthorized(self, message: str) -> _Reply:
        return _error(401, "InvalidAuthenticationToken", message, ("WWW-Authenticate", "Bearer"))

    def _too_large(self, provided: str) -> _Reply:
        # The service's own words (uncompressed and compressed sizes are both limited).
        limit = self.max_body_bytes
        message = (
            f"Maximum allowed content length: {limit} bytes ({limit / 2**20:g} MB). "
            f"Provided content length: {provided} bytes."
        )
        return _error(413, "ContentLengthLimitExceeded", message)
