"""The agent's and the consumer's window for the tools SREs already run: a Prometheus
endpoint (prometheus-client), health probes, and systemd's notify protocol.

One opt-in HTTP endpoint per process (`agent.metrics_address`, `consumer.metrics_address`),
on 127.0.0.1 unless an address says otherwise, answers three GETs (and the same HEADs):

- `/metrics`: the process's metrics in the Prometheus text format;
- `/healthz`: 200 while the process's loop turns, 503 when it is stuck (a liveness probe);
- `/readyz`: 200 when the process can do its work, 503 with the reason when it cannot (IMDS
  not answering, the spool not writable, a sink failing for good; a readiness probe).

A probe answers a JSON object: `{"ok": true, "why": "..."}`. Anything else is a 404; the
server reads no request body and keeps no connection open past its answer; it serves at
most MAX_CONNECTIONS clients at once, each for at most REQUEST_DEADLINE seconds, and its
errors go to the log, never to stderr.

`Notifier` speaks systemd's notify protocol by hand (a datagram to `$NOTIFY_SOCKET`, no
new dependency): READY=1 once started (with a STATUS= line, such as what it waits for),
WATCHDOG=1 while the loop turns (at most twice per `WatchdogSec`), STOPPING=1 at a stop.
Without `$NOTIFY_SOCKET` it does nothing.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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
from bridge.redact import describe

log = logging.getLogger(__name__)

Probe = Callable[[], tuple[bool, str]]  # (ok, why)
DEFAULT_HOST = "127.0.0.1"
# A scrape or probe is one short request: 8 at once and 5 s each are plenty, and bound what
# slow or malicious local clients can hold.
MAX_CONNECTIONS = 8
REQUEST_DEADLINE = 5.0
ACCEPT_BACKOFF = 0.5


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
    """The HTTP endpoint: /metrics, /healthz, /readyz, on a thread of its own.

    Any local user can connect to it, so a client gets at most REQUEST_DEADLINE seconds for
    its whole exchange (a request dripped a byte at a time is cut off) and at most
    MAX_CONNECTIONS are served at once: past that the accept loop waits, and new connections
    queue in the kernel's backlog, costing this process no thread and no file descriptor.
    """

    def __init__(
        self, address: str, registry: CollectorRegistry, *, live: Probe, ready: Probe
    ) -> None:
        self.host, wanted = parse_address(address)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        handler = _handler(registry, {"/healthz": live, "/readyz": ready}, REQUEST_DEADLINE)
        self._slots = threading.Semaphore(MAX_CONNECTIONS)
        server_class = type("Server", (_Server,), {"address_family": family})
        self._server = server_class((self.host, wanted), handler)  # OSError: cannot listen
        self._server.slots = self._slots
        self.port = int(self._server.server_address[1])
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="se-bridge telemetry", daemon=True)

    def _serve(self) -> None:
        # Not serve_forever: it wakes every half second to look for a shutdown, which is most
        # of an idle agent's cost. Here the loop sleeps in accept() until a request comes, and
        # `close` sends one to wake it.
        while not self._closing.is_set():
            self._slots.acquire()
            if self._closing.is_set():
                break
            try:
                request, client = self._server.get_request()
            except OSError as err:
                self._slots.release()
                # Out of file descriptors (EMFILE) the listening socket stays readable: wait
                # instead of spinning on accept().
                log.debug("telemetry: cannot accept a connection: %s", err)
                self._closing.wait(ACCEPT_BACKOFF)
                continue
            try:
                self._server.process_request(request, client)
            except Exception as err:  # no thread to be had (TasksMax): drop this client
                self._slots.release()
                self._server.shutdown_request(request)
                log.debug("telemetry: cannot serve %s: %s", client[0], err)
                self._closing.wait(ACCEPT_BACKOFF)

    def start(self) -> Endpoint:
        self._thread.start()
        log.info("metrics and health probes at http://%s:%d/metrics, /healthz and /readyz",
                 self.host, self.port)  # fmt: skip
        return self

    def close(self) -> None:
        self._closing.set()
        self._slots.release()  # the loop may wait for a slot, not in accept()
        if self._thread.is_alive():
            with contextlib.suppress(OSError):  # the loop may be gone already
                socket.create_connection((self.host, self.port), timeout=2).close()
            self._thread.join(timeout=5)
        self._server.server_close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a stop never waits for a client: each has its deadline anyway
    slots: threading.Semaphore

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback to stderr; a client that hangs up is no news, and
        # anything else goes through the log, in its format and at its level.
        err = sys.exc_info()[1]
        if isinstance(err, OSError):
            log.debug("telemetry: the client %s went away: %s", client_address[0], err)
        else:
            log.warning(
                "answering a request from %s on the metrics endpoint failed",
                client_address[0],
                exc_info=True,
            )


class DeadlineReader(io.RawIOBase):
    """A socket's reading end that ends (TimeoutError) at a deadline, however slowly the
    bytes come: a per-read timeout alone lets a client that drips a byte at a time stay."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the client took too long")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


def _handler(
    registry: CollectorRegistry, probes: Mapping[str, Probe], deadline: float
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "se-bridge"
        timeout = deadline

        def setup(self) -> None:
            super().setup()
            self._deadline = time.monotonic() + deadline
            self.rfile.close()  # the plain reader setup made: only its reference to the socket
            self.rfile = io.BufferedReader(DeadlineReader(self.connection, self._deadline))

        def do_GET(self) -> None:
            self._respond(head=False)

        def do_HEAD(self) -> None:
            self._respond(head=True)

        def _respond(self, *, head: bool) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                try:
                    body = generate_latest(registry)
                except Exception as err:  # a collector's bug: say so, keep serving the probes
                    log.warning(
                        "collecting the metrics failed (%s), so /metrics answered 500; "
                        "the DEBUG log has the traceback",
                        describe(err, with_type=True),
                    )
                    log.debug("collecting the metrics failed", exc_info=True)
                    self._answer(500, "text/plain; charset=utf-8", b"collecting failed\n", head)
                    return
                self._answer(200, CONTENT_TYPE_LATEST, body, head)
            elif path in probes:
                try:
                    ok, why = probes[path]()
                except Exception as err:  # a probe that fails says so: not ok
                    ok, why = False, f"the probe failed: {type(err).__name__}: {err}"
                body = json.dumps({"ok": ok, "why": why}).encode()
                self._answer(200 if ok else 503, "application/json", body, head)
            else:
                self._answer(404, "text/plain; charset=utf-8", b"not found\n", head)

        def _answer(self, status: int, content_type: str, body: bytes, head: bool) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            # sendall's timeout bounds the whole answer: a client that reads slowly is cut off.
            self.connection.settimeout(max(0.001, self._deadline - time.monotonic()))
            if not head:
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
