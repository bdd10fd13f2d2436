"""The simulator on HTTP: the main port (control API, /vm/<name>, bare /metadata) and,
optionally, one port per VM that serves that VM at the root paths like 169.254.169.254.

Connections are HTTP/1.1 keep-alive, as with the real IMDS; stop() closes them so no
handler thread or socket outlives the server.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from bridge.simulator import control as simcontrol
from bridge.simulator import imds as simimds
from bridge.simulator.core import Simulator, vm_path
from bridge.simulator.imds import Reply, Request, json_reply

logger = logging.getLogger("bridge.simulator")

MAX_BODY = 1 << 20
ENDLESS_BYTES = 256 << 20  # an "endless" body ends here, so the simulator stops by itself


class ClosingHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server whose stop also ends idle keep-alive connections.

    Handler threads are joined on close; `close_connections()` first wakes the ones that
    wait on an idle keep-alive connection, so closing never hangs. Also the base of the
    tests' HTTPS doubles.
    """

    daemon_threads = False
    block_on_close = True

    def __init__(self, address: tuple[str, int], handler: Any) -> None:
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):  # the client may have closed it already
                # The plain socket's shutdown, also for TLS: SSLSocket.shutdown would drop
                # its TLS state under the feet of the handler thread.
                socket.socket.shutdown(conn, socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-answer is normal for pollers; keep it out of stderr.
        logger.debug("connection from %s ended with an error", client_address, exc_info=True)


class RoutingHTTPServer(ClosingHTTPServer):
    """A simulator's HTTP service: each request, its body read (bounded), goes to `route`.
    Given a TLS context every connection is TLS, its handshake on the handler's thread, never
    in the accept loop (the ARM service, bridge.simulator.arm)."""

    def __init__(
        self, address: tuple[str, int], stopping: threading.Event, tls: ssl.SSLContext | None
    ) -> None:
        super().__init__(address, _Handler)
        self.stopping, self.tls = stopping, tls

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        if self.tls is None:
            return sock, address
        return self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    @property
    def url(self) -> str:
        host, port = self.server_address[0], self.server_address[1]
        host = host.decode() if isinstance(host, bytes) else host
        scheme = "http" if self.tls is None else "https"
        return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"

    def route(self, request: Request) -> Reply:
        raise NotImplementedError


class SimHTTPServer(RoutingHTTPServer):
    def __init__(
        self,
        address: tuple[str, int],
        simulator: Simulator,
        stopping: threading.Event,
        fixed_vm: str | None = None,
    ) -> None:
        super().__init__(address, stopping, None)
        self.simulator = simulator
        self.fixed_vm = fixed_vm

    def route(self, request: Request) -> Reply:
        sim, wait = self.simulator, self.stopping.wait
        if self.fixed_vm is not None:
            return simimds.serve(sim, self.fixed_vm, request, wait)
        path = request.path
        if path == "/control" or path.startswith("/control/"):
            return simcontrol.handle(sim, self.url, request)
        if path.startswith("/vm/"):
            name, _, rest = path[len("/vm/") :].partition("/")
            name = unquote(name)
            if name not in sim.vm_names:
                known = ", ".join(sim.vm_names)
                return json_reply(404, {"error": f"no VM named {name!r}; known VMs: {known}"})
            return simimds.serve(sim, name, replace(request, path="/" + rest), wait)
        if path == "/metadata" or path.startswith("/metadata/"):
            return simimds.serve(sim, sim.vm_names[0], request, wait)
        hint = "IMDS is at /metadata/... or /vm/<name>/metadata/...; control at /control/..."
        return json_reply(404, {"error": f"Not found. {hint}"})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "se-bridge-imds-simulator"
    sys_version = ""
    timeout = 60.0  # an idle keep-alive connection is dropped after a minute
    # Headers and body leave in one segment (flushed after each request), and small
    # segments are not held back: otherwise Nagle plus delayed ACKs add ~40 ms per poll.
    wbufsize = -1
    disable_nagle_algorithm = True
    server: RoutingHTTPServer

    def setup(self) -> None:
        super().setup()
        if self.server.tls is not None:
            self.request.do_handshake()  # fails: handle_error says so at DEBUG

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)

    def _dispatch(self) -> None:
        server = self.server
        assert isinstance(server, RoutingHTTPServer)
        body = self._read_body()
        if body is None:
            self._send(json_reply(413, {"error": "the body is too large"}))
            self.close_connection = True
            return
        url = urlsplit(self.path)
        headers = {name.lower(): value for name, value in self.headers.items()}
        query = parse_qs(url.query, keep_blank_values=True)
        self._send(server.route(Request(self.command, url.path, query, headers, body)))

    def _read_body(self) -> bytes | None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        if length > MAX_BODY:
            return None
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        if reply.content_type:
            self.send_header("Content-Type", reply.content_type)
        for name, value in reply.headers:
            self.send_header(name, value)
        if reply.endless:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        if not (reply.endless or reply.drip):
            self.wfile.write(reply.body)
            return
        self.close_connection = True  # a faulty answer ends its connection
        with contextlib.suppress(OSError):  # the client hung up: what it should do
            self._send_slowly(reply)

    def _send_slowly(self, reply: Reply) -> None:
        server = self.server
        assert isinstance(server, RoutingHTTPServer)
        if reply.endless:
            chunk = b"%x\r\n%s\r\n" % (len(reply.body) or 1, reply.body or b" ")
            for _ in range(ENDLESS_BYTES // len(chunk)):
                if server.stopping.is_set():
                    return
                self.wfile.write(chunk)
            return
        for byte in reply.body:
            if server.stopping.wait(reply.drip):
                return
            self.wfile.write(bytes([byte]))
            self.wfile.flush()


class SimulatorServer:
    """Serves a Simulator in background threads; 127.0.0.1 and a free port by default."""

    def __init__(
        self,
        simulator: Simulator,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        per_vm_ports: bool = False,
        tick_interval: float = 0.05,
    ) -> None:
        self.simulator = simulator
        self._host, self._port = host, port
        self._per_vm_ports = per_vm_ports
        self._tick_interval = tick_interval
        self._stopping = threading.Event()
        self._main: SimHTTPServer | None = None
        self._vm_servers: dict[str, SimHTTPServer] = {}
        self._threads: list[threading.Thread] = []

    def start(self) -> SimulatorServer:
        """Bind every port, then serve; on a bind failure nothing is left open."""
        try:
            self._main = SimHTTPServer((self._host, self._port), self.simulator, self._stopping)
            if self._per_vm_ports:
                self._bind_vm_ports()
        except OSError:
            self._close_all()
            raise
        for server in self._servers():
            self._spawn(server.serve_forever, 0.05)
        self._spawn(self._tick_loop)
        return self

    def _bind_vm_ports(self) -> None:
        for i, name in enumerate(self.simulator.vm_names):
            port = 0 if self._port == 0 else self._port + 1 + i
            address = (self._host, port)
            self._vm_servers[name] = SimHTTPServer(address, self.simulator, self._stopping, name)

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name="imds-simulator", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _tick_loop(self) -> None:
        # Transitions fall due with nobody polling (NotBefore reached, run time over);
        # ticking makes them happen, and get logged, on time.
        while not self._stopping.wait(self._tick_interval):
            try:
                self.simulator.tick()
            except Exception:
                logger.exception("The simulator failed to advance its events; it keeps trying.")

    def _servers(self) -> list[SimHTTPServer]:
        main = [self._main] if self._main is not None else []
        return main + list(self._vm_servers.values())

    def stop(self) -> None:
        """Stop serving, close every connection and port, and join the threads."""
        self._stopping.set()
        servers = self._servers()
        if self._threads:
            # In parallel: each shutdown waits up to one poll interval.
            waits = [threading.Thread(target=server.shutdown) for server in servers]
            for wait in waits:
                wait.start()
            for wait in waits:
                wait.join()
        for server in servers:
            server.close_connections()
        self._close_all()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()

    def _close_all(self) -> None:
        for server in self._servers():
            server.server_close()
        self._main, self._vm_servers = None, {}

    def __enter__(self) -> SimulatorServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The main port's base URL, e.g. http://127.0.0.1:49152."""
        if self._main is None:
            raise RuntimeError("the simulator server is not running; call start() first")
        return self._main.url

    def vm_url(self, name: str) -> str:
        """The base URL an agent uses as --imds-url for VM `name` (on the main port)."""
        self.simulator.fleet.vm(name)
        return self.url + vm_path(name)

    @property
    def vm_port_urls(self) -> dict[str, str]:
        """VM name -> its own port's base URL (empty unless per_vm_ports)."""
        return {name: server.url for name, server in self._vm_servers.items()}
