"""The agent's and the consumer's window for the tools SREs already run: a Prometheus
endpoint (prometheus-client), health probes, and systemd's notify protocol.

One opt-in HTTP endpoint per process (`agent.metrics_address`, `consumer.metrics_address`),
on 127.0.0.1 unless an address says otherwise, answers three GETs:

- `/metrics`: the process's metrics in the Prometheus text format;
- `/healthz`: 200 while the process's loop turns, 503 when it is stuck (a liveness probe);
- `/readyz`: 200 when the process can do its work, 503 with the reason when it cannot (IMDS
  not answering, the spool not writable, a sink failing for good; a readiness probe).

A probe answers a JSON object: `{"ok": true, "why": "..."}`. Anything else is a 404; the
server reads no request body and keeps no connection open past its answer.

`Notifier` speaks systemd's notify protocol by hand (a datagram to `$NOTIFY_SOCKET`, no
new dependency): READY=1 once started, WATCHDOG=1 while the loop turns (at most twice per
`WatchdogSec`), STOPPING=1 at a stop. Without `$NOTIFY_SOCKET` it does nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

log = logging.getLogger(__name__)

Probe = Callable[[], tuple[bool, str]]  # (ok, why)
DEFAULT_HOST = "127.0.0.1"


def new_registry() -> CollectorRegistry:
    """A registry of this process's own: the process, platform and GC collectors, no global."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
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
    """The HTTP endpoint: /metrics, /healthz, /readyz, on a thread of its own."""

    def __init__(
        self, address: str, registry: CollectorRegistry, *, live: Probe, ready: Probe
    ) -> None:
        self.host, wanted = parse_address(address)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        handler = _handler(registry, {"/healthz": live, "/readyz": ready})
        server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family})
        self._server = server_class((self.host, wanted), handler)  # OSError: cannot listen
        self._server.daemon_threads = True
        self._server.timeout = None  # handle_request blocks: no wake-ups while idle
        self.port = int(self._server.server_address[1])
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="se-bridge telemetry", daemon=True)

    def _serve(self) -> None:
        # Not serve_forever: it wakes every half second to look for a shutdown, which is most
        # of an idle agent's cost. Here the loop sleeps in accept() until a request comes, and
        # `close` sends one to wake it.
        while not self._closing.is_set():
            self._server.handle_request()

    def start(self) -> Endpoint:
        self._thread.start()
        log.info("metrics and health probes at http://%s:%d/metrics, /healthz and /readyz",
                 self.host, self.port)  # fmt: skip
        return self

    def close(self) -> None:
        self._closing.set()
        if self._thread.is_alive():
            with contextlib.suppress(OSError):  # the loop may be gone already
                socket.create_connection((self.host, self.port), timeout=2).close()
            self._thread.join(timeout=5)
        self._server.server_close()


def _handler(
    registry: CollectorRegistry, probes: Mapping[str, Probe]
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "se-bridge"
        timeout = 10  # a client that sends nothing is dropped

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._answer(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif path in probes:
                try:
                    ok, why = probes[path]()
                except Exception as err:  # a probe that fails says so: not ok
                    ok, why = False, f"the probe failed: {type(err).__name__}: {err}"
                body = json.dumps({"ok": ok, "why": why}).encode()
                self._answer(200 if ok else 503, "application/json", body)
            else:
                self._answer(404, "text/plain; charset=utf-8", b"not found\n")

        def _answer(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("telemetry: " + format, *args)

    return Handler


class Notifier:
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

    def ready(self) -> None:
        self._send("READY=1\nSTATUS=running")

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
