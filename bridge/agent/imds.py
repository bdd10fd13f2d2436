"""The IMDS edge: HTTP to the Instance Metadata Service, mapped onto the three failure kinds.

One keep-alive connection (plain http.client: the agent polls every second, and requests'
machinery cost more CPU than the rest of a poll); `Metadata: true` on every call; never
through a proxy and never following a redirect (IMDS answers only on the link-local address,
and a redirect means something other than IMDS answered); never more than `max_rps`
requests a second. Nothing IMDS sends can exhaust the agent: a body larger than its
endpoint's cap (MAX_BODY) is refused after reading one byte past the cap, and every request
has a total deadline (the read timeout), enforced by a watchdog that shuts the socket, so a
server that drips its answer a byte at a time cannot hold the poll, the heartbeats or an
approval behind it.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import json
import logging
import math
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol, cast

from bridge.records import VmIdentity
from bridge.retry import PermanentError, RetryableError, ThrottledError, parse_retry_after

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "http://169.254.169.254"
EVENTS_PATH = "/metadata/scheduledevents"
INSTANCE_PATH = "/metadata/instance"
INSTANCE_API_VERSION = "2021-02-01"
# Documented transient answers; everything else but 200 is permanent for that request.
TRANSIENT = frozenset({410, 500, 502, 503, 504})
EXCERPT = 200
CONNECT_TIMEOUT = 5.0  # IMDS is link-local: a connection takes milliseconds or never comes
# Real answers are far smaller: a document lists a few events, each naming at most the VMs of
# one scale-set placement group; instance metadata is a few KB, an approval's answer empty.
MAX_BODY = {"scheduledevents": 4 * 1024 * 1024, "instance": 1024 * 1024}
MAX_OTHER_BODY = 64 * 1024


class Refused(PermanentError):
    """IMDS refused the request (a 4xx but 429): `status` says how, for a caller that tells
    an api-version it does not serve (400 or 404) from other refusals."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class AnswerTooLarge(http.client.HTTPException):
    """IMDS sent more than the endpoint's cap: refused, never read to its end."""


class _Watchdog:
    """Ends an exchange that outlives its deadline by shutting its socket, from a thread of
    its own: a socket timeout bounds each read, not a whole answer sent a byte at a time."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._sock: socket.socket | None = None
        self._due: float | None = None
        self._fired = False
        self._thread: threading.Thread | None = None
        # When the thread wakes of itself (inf: it waits to be told): an arm due no sooner
        # needs no wake-up, since the thread looks again then. An agent polling every second
        # with a 10 s deadline wakes it once in ten polls, not at every one.
        self._waking = math.inf

    def arm(self, sock: socket.socket, seconds: float) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="se-bridge imds deadline", daemon=True
                )
                self._thread.start()
            due = time.monotonic() + seconds
            self._sock, self._due, self._fired = sock, due, False
            if due < self._waking:
                self._waking = due  # told now; the thread sets it again as it waits
                self._cond.notify()

    def disarm(self) -> bool:
        """Stop watching; whether the deadline had passed and the socket was shut."""
        with self._cond:
            fired, self._sock, self._due = self._fired, None, None
            return fired

    def _run(self) -> None:
        with self._cond:
            while True:
                if self._due is None:
                    self._waking = math.inf
                    self._cond.wait()
                    continue
                left = self._due - time.monotonic()
                if left > 0:
                    self._waking = self._due
                    self._cond.wait(left)
                    continue
                if self._sock is not None:
                    with contextlib.suppress(OSError):  # closed already: nothing to end
                        # The plain socket's shutdown, also under TLS: SSLSocket.shutdown
                        # would unwrap TLS under the feet of the thread reading it.
                        socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
                    self._fired = True
                self._due = None


def excerpt(body: bytes | str, limit: int = EXCERPT) -> str:
    """A short, single-line view of a body for a log line."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "…"


class RateLimiter:
    """At most `rate` calls in any window of one second (for a rate below one, one call per
    1/rate seconds), across threads.

    IMDS allows about 5 requests a second per VM. A window rather than even spacing, because
    an approval is a burst: the poll that sees the event, the fresh read that checks it and
    the StartRequests POST. Spaced 200 ms apart they cost 400 ms of every approval; in a
    window they go at once, and the window still never holds more than `rate` calls.
    """

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._burst = max(1, int(rate))
        self._window = self._burst / rate
        self._clock, self._sleep = clock, sleep
        self._times: collections.deque[float] = collections.deque(maxlen=self._burst)
        self._lock = threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            now = self._clock()
            start = now
            if len(self._times) == self._burst:
                start = max(now, self._times[0] + self._window)
            self._times.append(start)  # taken now, so a concurrent caller queues behind it
        if start > now:
            self._sleep(start - now)


class Answer(NamedTuple):
    """What IMDS answered: the status, its Retry-After header if any, and the whole body."""

    status: int
    retry_after: str | None
    content: bytes


class Transport(Protocol):
    def request(
        self,
        method: str,
        path: str,
        *,
        version: str,
        body: bytes | None,
        read_timeout: float,
        limit: int = MAX_OTHER_BODY,
    ) -> Answer: ...

    def close(self) -> None: ...


class DirectTransport:
    """One keep-alive http.client connection to IMDS: no proxy, no redirects, no cookies.

    requests costs about a millisecond of Python per call (hooks, adapters, the cookie jar,
    pool checks), as much as the whole of the rest of an idle poll; this is a fraction.
    """

    def __init__(self, base_url: str) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"IMDS URL must be http://HOST[:PORT][/PREFIX]: {base_url!r}")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/")
        self._headers = {"Metadata": "true", "User-Agent": "se-bridge"}
        self._post_headers = {**self._headers, "Content-Type": "application/json"}
        self._targets: dict[tuple[str, str], str] = {}
        self._conn: http.client.HTTPConnection | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._watchdog = _Watchdog()

    def request(
        self,
        method: str,
        path: str,
        *,
        version: str,
        body: bytes | None,
        read_timeout: float,
        limit: int = MAX_OTHER_BODY,
    ) -> Answer:
        target = self._targets.get((path, version))
        if target is None:  # a handful of (path, version) pairs: made once each
            target = f"{self._prefix}{path}?{urllib.parse.urlencode({'api-version': version})}"
            self._targets[(path, version)] = target
        headers = self._headers if body is None else self._post_headers
        with self._lock:
            reused = self._conn is not None and not _dropped(self._conn)
            exchange = (method, target, body, headers, read_timeout, limit)
            try:
                return self._exchange(*exchange)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if not reused:
                    raise
            # IMDS closed the idle keep-alive connection as we reused it: once more, afresh.
            # Safe for the POST too: IMDS answers 200 to an approval it already has.
            return self._exchange(*exchange)

    def _exchange(  # noqa: PLR0917 - one request in full
        self,
        method: str,
        target: str,
        body: bytes | None,
        headers: dict[str, str],
        read_timeout: float,
        limit: int,
    ) -> Answer:
        conn = self._connection(read_timeout)
        self._watchdog.arm(cast(socket.socket, conn.sock), read_timeout)
        try:
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            content = _read_body(response, limit)
        except BaseException:
            late = self._watchdog.disarm()
            self._drop()  # a half-read exchange leaves the connection unusable
            if late:
                raise _late(read_timeout) from None
            raise
        if self._watchdog.disarm():  # shut mid-body: what was read is not the whole answer
            self._drop()
            raise _late(read_timeout)
        # On "Connection: close" http.client has let the socket go; the next call reconnects.
        return Answer(response.status, response.getheader("Retry-After"), content)

    def _connection(self, read_timeout: float) -> http.client.HTTPConnection:
        conn = self._conn
        if conn is None or conn.sock is None:
            self._drop()
            if self._closed:
                # A call that waited on a worker while the agent stopped: nobody would
                # close a connection made now.
                raise ConnectionAbortedError("the IMDS client is closed")
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = kind(self._host, self._port, timeout=min(CONNECT_TIMEOUT, read_timeout))
            conn.connect()
            self._conn = conn
            if self._closed:  # closed from another thread meanwhile
                self._drop()
                raise ConnectionAbortedError("the IMDS client is closed")
        cast(socket.socket, conn.sock).settimeout(read_timeout)
        return conn

    def close(self) -> None:
        self._closed = True
        self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _read_body(response: http.client.HTTPResponse, limit: int) -> bytes:
    """The whole body, or AnswerTooLarge once it passes `limit`; never more in memory."""
    content = response.read(limit + 1)
    if len(content) > limit:
        raise AnswerTooLarge(f"IMDS sent more than {limit} bytes: refused unread")
    if response.length:  # Content-Length promised more than came before the socket closed
        raise http.client.IncompleteRead(content, response.length)
    return content


def _late(seconds: float) -> TimeoutError:
    return TimeoutError(f"IMDS timed out: it did not finish answering within {seconds:g} s")


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether the far side closed (or spoke on) the idle connection: then it is closed here.

    A peek, not select(): select fails on descriptors past 1024 and is socket-only on Windows.
    """
    sock = conn.sock
    if sock is None:
        return True
    try:
        sock.setblocking(False)  # `_connection` sets the timeout again before any use
        sock.recv(1, socket.MSG_PEEK)  # an idle HTTP connection has nothing to say: EOF or junk
    except BlockingIOError:
        return False
    except ValueError:  # TLS sockets take no flags: the retry in `request` covers them
        return False
    except OSError:
        pass
    conn.close()
    return True


class ImdsClient:
    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        api_version: str = "2020-07-01",
        *,
        timeout: float = 10.0,
        first_call_timeout: float = 120.0,
        max_rps: float = 5.0,
        limiter: RateLimiter | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_version = api_version
        self._timeout = timeout
        self._first_timeout = first_call_timeout
        # Per endpoint: each one's first call after IMDS idled may be the slow one.
        self._answered: set[str] = set()
        # Shared by the clients of one agent (the poll's, the approvals'): IMDS counts per VM.
        self.limiter = limiter or RateLimiter(max_rps)
        # None: one keep-alive connection to `base_url` (tests give a canned one).
        self._transport = transport or DirectTransport(self.base_url)

    @property
    def events_url(self) -> str:
        return self.base_url + EVENTS_PATH

    def scheduled_events(self, version: str | None = None) -> bytes:
        """The raw body of the Scheduled Events document, at `version` (None: the client's
        api-version); raises a bridge.retry failure (Refused for a 4xx but 429)."""
        return self._call("GET", EVENTS_PATH, version or self.api_version).content

    def start_events(self, event_ids: list[str]) -> int:
        """Approve events (POST StartRequests); the HTTP status IMDS answered with."""
        body = {"StartRequests": [{"EventId": event_id} for event_id in event_ids]}
        return self._call("POST", EVENTS_PATH, self.api_version, json.dumps(body).encode()).status

    def instance_metadata(self) -> dict[str, Any]:
        answer = self._call("GET", INSTANCE_PATH, INSTANCE_API_VERSION)
        try:
            data = json.loads(answer.content)
        except (ValueError, RecursionError) as err:  # RecursionError: nested too deeply
            raise RetryableError(
                f"instance metadata is not JSON: {excerpt(answer.content)!r}"
            ) from err
        if not isinstance(data, dict):
            raise RetryableError(f"instance metadata is not an object: {excerpt(answer.content)!r}")
        return data

    def close(self) -> None:
        self._transport.close()

    def _call(self, method: str, path: str, version: str, body: bytes | None = None) -> Answer:
        self.limiter.acquire()
        read_timeout = self._timeout if path in self._answered else self._first_timeout
        url = self.base_url + path
        limit = (
            MAX_BODY.get(path.rsplit("/", 1)[-1], MAX_OTHER_BODY)
            if method == "GET"
            else (MAX_OTHER_BODY)
        )
        try:
            answer = self._transport.request(
                method, path, version=version, body=body, read_timeout=read_timeout, limit=limit
            )
        except (OSError, http.client.HTTPException) as err:
            raise RetryableError(f"{method} {url} failed: {type(err).__name__}: {err}") from err
        self._answered.add(path)
        _raise_for(answer, method, url)
        return answer


def _raise_for(answer: Answer, method: str, url: str) -> None:
    status = answer.status
    if status == 200:
        return
    what = f"IMDS answered {status} to {method} {url}: {excerpt(answer.content)!r}"
    if status == 429:
        raise ThrottledError(what, parse_retry_after(answer.retry_after))
    if status in TRANSIENT:
        raise RetryableError(what)
    if 400 <= status < 500:
        raise Refused(what, status)
    raise PermanentError(what)


# A real answer of /metadata/instance?api-version=2021-02-01 (abridged):
#   {"compute": {"vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6", "name": "web_3",
#     "resourceId": "/subscriptions/8d10da13-.../resourceGroups/rg/providers/
#                    Microsoft.Compute/virtualMachineScaleSets/web/virtualMachines/3",
#     "subscriptionId": "8d10da13-8125-4ba9-a717-bf7490507b3d", "resourceGroupName": "rg",
#     "location": "westeurope", "zone": "1", "vmScaleSetName": "web",
#     "platformFaultDomain": "0", "platformUpdateDomain": "3",
#     "tagsList": [{"name": "role", "value": "frontend"}], ...},
#    "network": {...}}
# IMDS sends the domains as strings and empty strings for absent values.
def parse_instance(raw: Mapping[str, Any]) -> VmIdentity:
    """VmIdentity from an instance metadata document; unknown or empty fields become None."""
    compute = raw.get("compute")
    if not isinstance(compute, Mapping):
        return VmIdentity()
    return VmIdentity(
        vm_id=_guid(compute.get("vmId")),
        vm_name=_text(compute.get("name")),
        resource_id=_text(compute.get("resourceId")),
        subscription_id=_text(compute.get("subscriptionId")),
        resource_group=_text(compute.get("resourceGroupName")),
        location=_text(compute.get("location")),
        zone=_text(compute.get("zone")),
        vm_scale_set_name=_text(compute.get("vmScaleSetName")),
        platform_fault_domain=_number(compute.get("platformFaultDomain")),
        platform_update_domain=_number(compute.get("platformUpdateDomain")),
        tags=_tags(compute.get("tagsList"), compute.get("tags")),
    )


def is_spot(raw: Mapping[str, Any]) -> bool:
    """Whether instance metadata says this VM is a Spot VM: compute.priority "Spot" (the
    other values are "Regular" and the retired "Low"; a Spot VM's evictionPolicy is
    "Deallocate" or "Delete", a regular one's empty, as in the sample above's fuller form)."""
    compute = raw.get("compute")
    priority = compute.get("priority") if isinstance(compute, Mapping) else None
    return isinstance(priority, str) and priority.strip().lower() == "spot"


# Azure's vmId is a GUID; anything else (an emulator's, a hostile answer's "x/../y") cannot
# name a command channel or a record the consumer accepts: taken as no vmId at all.
_GUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _guid(value: object) -> str | None:
    text = _text(value)
    return text if text is not None and _GUID.fullmatch(text) else None


def _text(value: object) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    text = str(value).strip()
    return text or None


# ASCII digits only, and few enough for int(): str.isdigit() also accepts "²", and
# lstrip("-") let "--5" through, which int() refuses with a ValueError.
_WHOLE = re.compile(r"-?[0-9]{1,30}")


def _number(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = _text(value)
    return int(text) if text is not None and _WHOLE.fullmatch(text) else None


def _tags(tags_list: object, tags: object) -> tuple[tuple[str, str], ...]:
    """tagsList when present; the older "k1:v1;k2:v2" string otherwise."""
    if isinstance(tags_list, list):
        pairs = [
            (str(t.get("name", "")), str(t.get("value", "")))
            for t in tags_list
            if isinstance(t, Mapping)
        ]
        return tuple(p for p in pairs if p[0])
    if isinstance(tags, str) and tags:
        pairs = [part.partition(":")[::2] for part in tags.split(";")]
        return tuple((k, v) for k, v in pairs if k)
    return ()
