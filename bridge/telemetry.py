"""The agent's and the consumer's window for the tools SREs already run: a Prometheus
endpoint (prometheus-client), health probes, and systemd's notify protocol.

One opt-in HTTP endpoint per process (`agent.metrics_address`, `consumer.metrics_address`),
on 127.0.0.1 unless an address says otherwise, answers three GETs (and the same HEADs):

- `/metrics`: the process's metrics in the Prometheus text format;
- `/healthz`: 200 while the process's loop turns, 503 when it is stuck (a liveness probe);
- `/readyz`: 200 when the process can do its work, 503 with the reason when it cannot (IMDS
  not answering, the spool not writable, a sink failing for good; a readiness probe).

A probe answers a JSON object: `{"ok": true, "why": "..."}`. Anything else is a 404; the
server takes no request body and keeps no connection open past its answer. Idle and slow
clients cannot starve the probes (Endpoint says how), and its errors go to the log, never
to stderr.

`SystemdNotifier` speaks systemd's notify protocol by hand (a datagram to `$NOTIFY_SOCKET`,
no new dependency): READY=1 once started (with a STATUS= line, such as what it waits for),
WATCHDOG=1 while the loop turns (at most twice per `WatchdogSec`), STOPPING=1 at a stop.
Without `$NOTIFY_SOCKET` it does nothing.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    GCCollector,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

import bridge
from bridge.httpfront import Front
from bridge.redact import describe

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger(__name__)

Probe = Callable[[], tuple[bool, str]]  # (ok, why)
DEFAULT_HOST = "127.0.0.1"
# A scrape or probe is one short request: 8 answered at once (and 2 more kept for the
# probes) and 5 s each are plenty, and bound what slow or malicious local clients can hold.
MAX_CONNECTIONS = 8
PROBE_WORKERS = 2
REQUEST_DEADLINE = 5.0
REQUEST_LINE_DEADLINE = 1.0  # seconds a new connection has to send its request line


def new_registry() -> CollectorRegistry:
    """A registry of this process's own: the process, platform and GC collectors, and
    se_bridge_build_info{version="..."} 1 (which release runs where), no global."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    build = Info("se_bridge_build", "The se-bridge release this process runs.", registry=registry)
    build.info({"version": bridge.__version__})
    return registry


def parse_address(text: str) -> tuple[str, int]:
    """("127.0.0.1", 9465) from "9465"; ("0.0.0.0", 9465) from "0.0.0.0:9465"; IPv6 in
    brackets ("[::1]:9465"). ValueError naming what is wrong."""
    text = text.strip()
    host, _, port = text.rpartition(":") if ":" in text else ("", "", text)
    host = host.strip("[]") or DEFAULT_HOST
    if not port.isdigit() or not 0 <= int(port) < 65536:
        # 0 takes a free port, which the log line "metrics and health probes at ..." names.
        raise ValueError(f"expected PORT or HOST:PORT (a port from 0 to 65535), got {text!r}")
    return host, int(port)


def check_address(setting: str, value: str) -> None:
    """ValueError naming `setting` when `value` (not empty) is no address to listen on."""
    if value:
        try:
            parse_address(value)
        except ValueError as err:
            raise ValueError(f"{setting}: {err}") from err


class Endpoint:
    """The HTTP endpoint: /metrics, /healthz, /readyz, behind bridge.httpfront.

    Any local user can connect to it. Idle or slow clients cost it no thread: a connection
    that sends no request line within a second is dropped, a whole request has
    REQUEST_DEADLINE, and MAX_CONNECTIONS workers answer, with PROBE_WORKERS more kept for
    the probes, so that the kubelet's probes are answered whatever /metrics clients do.
    """

    def __init__(
        self, address: str, registry: CollectorRegistry, *, live: Probe, ready: Probe
    ) -> None:
        self.host, wanted = parse_address(address)
        probes = {"/healthz": live, "/readyz": ready}
        self._front = Front(
            self.host,
            wanted,  # OSError: cannot listen
            app(registry, probes),
            name="se-bridge telemetry",
            workers=MAX_CONNECTIONS,
            reserved=PROBE_WORKERS,
            is_reserved=lambda asked: asked["PATH_INFO"] in probes,
            line_deadline=REQUEST_LINE_DEADLINE,
            request_deadline=REQUEST_DEADLINE,
        )
        self.port = self._front.port

    def start(self) -> Endpoint:
        self._front.start()
        log.info(
            "metrics and health probes at http://%s:%d/metrics, /healthz and /readyz",
            self.host,
            self.port,
        )
        return self

    def close(self) -> None:
        self._front.close()


def app(registry: CollectorRegistry, probes: Mapping[str, Probe]) -> WSGIApplication:
    """/metrics and the probes as a WSGI app (the server sends a HEAD's length, not its body)."""

    def answer(asked: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        status, body, kind, more = _answer(registry, probes, asked)
        start_response(f"{status} {HTTPStatus(status).phrase}", [("Content-Type", kind), *more])
        return [body]

    return answer


PLAIN = "text/plain; charset=utf-8"


def _answer(
    registry: CollectorRegistry, probes: Mapping[str, Probe], asked: WSGIEnvironment
) -> tuple[int, bytes, str, list[tuple[str, str]]]:
    """(status, body, content type, more headers) for one request."""
    if asked["REQUEST_METHOD"] not in ("GET", "HEAD"):
        return 405, b"GET or HEAD\n", PLAIN, [("Allow", "GET, HEAD")]
    path = asked["PATH_INFO"]
    if path == "/metrics":
        try:
            return 200, generate_latest(registry), CONTENT_TYPE_LATEST, []
        except Exception as err:  # a collector's bug: say so, keep serving the probes
            log.warning(
                "collecting the metrics failed (%s), so /metrics answered 500; "
                "the DEBUG log has the traceback",
                describe(err, with_type=True),
            )
            log.debug("collecting the metrics failed", exc_info=True)
            return 500, b"collecting failed\n", PLAIN, []
    if path in probes:
        try:
            ok, why = probes[path]()
        except Exception as err:  # a probe that fails says so: not ok
            ok, why = False, f"the probe failed: {type(err).__name__}: {err}"
        body = json.dumps({"ok": ok, "why": why}).encode()
        return 200 if ok else 503, body, "application/json", []
    return 404, b"not found\n", PLAIN, []


class SystemdNotifier:
    """systemd's notify protocol, by hand: one datagram per message to `$NOTIFY_SOCKET`."""

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        env = os.environ if environ is None else environ
        path = env.get("NOTIFY_SOCKET", "")
        # An abstract socket is given as "@name": its address starts with a NUL byte.
        self._address = "\0" + path[1:] if path.startswith("@") else path
        usec = env.get("WATCHDOG_USEC", "")
        self._every = int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 else None
        self._clock = clock
        self._last = -float("inf")
        self._failed = False

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def ready(self, status: str = "running") -> None:
        self._send(f"READY=1\nSTATUS={status}")

    def status(self, status: str) -> None:
        """What `systemctl status` shows as Status:."""
        self._send(f"STATUS={status}")

    def stopping(self) -> None:
        self._send("STOPPING=1")

    def watchdog(self) -> None:
        """Tell systemd the loop turns; at most twice per WatchdogSec, as systemd advises."""
        if self._every is None or self._clock() - self._last < self._every:
            return
        self._last = self._clock()
        self._send("WATCHDOG=1")

    def _send(self, message: str) -> None:
        if not self._address:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self._address)
                sock.sendall(message.encode())
        except OSError as err:
            if not self._failed:  # said once: systemd may be gone at shutdown
                log.warning("cannot notify systemd at %s: %s", self._address, err)
                self._failed = True
