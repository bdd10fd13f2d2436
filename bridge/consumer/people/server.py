"""The standalone consumer's approval page and API on `consumer.people.page_address`
(http.server, a thread per request, each with a deadline).

Without Entra ID settings the page is for one operator on loopback: a non-loopback address is
refused at start (`PageError`, the consumer exits 2), the operator token file is written and
the one-time login address beside it. With `consumer.people.tenant_id` and `audience` set, the
API takes Entra ID tokens (the CLI's) on any address; put TLS in front of a non-loopback one.
"""

from __future__ import annotations

import io
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bridge.config import PeopleSettings
from bridge.consumer.people.app import MAX_BODY, Decider, EntraSignIn, LocalSignIn, PeopleApp
from bridge.consumer.people.app import Request as AppRequest
from bridge.consumer.people.auth import LocalOperator, verifier_for
from bridge.records import utc_now
from bridge.telemetry import DeadlineReader, parse_address

log = logging.getLogger(__name__)

REQUEST_DEADLINE = 10.0  # seconds a client has for its whole request, however it sends it
MAX_CONNECTIONS = 16  # clients served at once: one operator, or a few people and their CLIs


class PageError(ValueError):
    """The page's settings cannot work (the consumer's start says so and exits 2)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_app(
    settings: PeopleSettings,
    decider: Decider,
    state_dir: Path,
    clock: Callable[[], datetime] = utc_now,
) -> PeopleApp:
    """The app the settings ask for: Entra ID sign-in when they name a tenant and audience,
    else the local operator (loopback only)."""
    try:
        host, _ = parse_address(settings.page_address)
    except ValueError as err:
        raise PageError(f"consumer.people.page_address: {err}") from err
    verifier = verifier_for(settings)
    if verifier is not None:
        return PeopleApp(decider, EntraSignIn(verifier), clock)
    if not is_loopback(host):
        raise PageError(
            f"consumer.people.page_address {settings.page_address} is not a loopback address: "
            "without Entra ID sign-in (consumer.people.tenant_id and audience) the page is for "
            "one operator on this machine; listen on 127.0.0.1 or set them"
        )
    operator = LocalOperator.start(state_dir, idle=settings.session_idle)
    return PeopleApp(decider, LocalSignIn(operator), clock)


class PageServer:
    """Serves `app` on `address` in a thread of its own until `close`."""

    def __init__(self, app: PeopleApp, address: str) -> None:
        self.app = app
        self.host, wanted = parse_address(address)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        server_class = type("Server", (_Server,), {"address_family": family})
        self._server = server_class((self.host, wanted), _handler(app))
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="se-bridge page", daemon=True
        )

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> PageServer:
        sign_in = self.app.sign_in
        if isinstance(sign_in, LocalSignIn):
            sign_in.operator.port = self.port
        self._thread.start()
        if isinstance(sign_in, LocalSignIn):
            login = sign_in.operator.write_login(self.url)
            # The code is a secret: in a file only this user reads, never in the log.
            log.info("the approval page is at %s for one operator on this machine: open the "
                     "one-time address in %s to sign in (or give the token in %s at %s/login); "
                     "each decision asks for that token too", self.url, login,
                     sign_in.operator.path, self.url)  # fmt: skip
        else:
            log.info("the approval page and its API are at %s (Entra ID sign-in)", self.url)
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _Server(ThreadingHTTPServer):
    """A thread per client, at most MAX_CONNECTIONS at once: past that a new client is turned
    away at once, so that slow or idle clients cannot hold every thread of the process."""

    daemon_threads = True
    block_on_close = False
    slots = threading.BoundedSemaphore(1)  # replaced per server in __init__

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            log.debug("page: turned %s away: %d clients are served", client_address[0],
                      MAX_CONNECTIONS)  # fmt: skip
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("page: answering %s failed", client_address[0], exc_info=True)


def _handler(app: PeopleApp) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "se-bridge"
        timeout = REQUEST_DEADLINE

        def setup(self) -> None:
            # A per-read timeout lets a client that drips a byte at a time keep its slot: the
            # whole request has a deadline, as the telemetry endpoint's has.
            super().setup()
            self.rfile.close()  # the plain reader setup made: only its reference to the socket
            deadline = time.monotonic() + REQUEST_DEADLINE
            self.rfile = io.BufferedReader(DeadlineReader(self.connection, deadline))

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def _serve(self) -> None:
            length = self.headers.get("Content-Length", "0")
            size = int(length) if length.isdigit() else -1
            if not 0 <= size <= MAX_BODY:
                self.send_error(413 if size > MAX_BODY else 411, "the body is too large")
                return
            body = self.rfile.read(size) if size else b""
            response = app(AppRequest.of(self.command, self.path, self.headers.items(), body))
            self.send_response(response.status)
            for name, value in response.all_headers():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(response.body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(response.body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("page: " + format, *args)

    return Handler
