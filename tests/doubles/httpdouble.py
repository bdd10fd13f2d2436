"""The base of the tests' HTTP(S) doubles (the Logs Ingestion API, Key Vault, the Kubernetes
API, a webhook receiver, Entra ID's signing keys, a managed-identity token endpoint): a double
says what to answer (`answer(Asked) -> Reply`), and this module serves it the same way for all.

- The server is bridge.simulator's ClosingHTTPServer, whose stop ends every connection (idle
  keep-alive ones too) and joins the handler threads, on a `Listener` that can go down and come
  back on the same port: "the service is unreachable for a while".
- Given a TLS context (tests/doubles/tls.py), every connection is TLS, its handshake on the
  handler's thread, never in the accept loop; a failed one is told to `tls_failed`.
- A body is read only by its Content-Length and only up to `max_body` bytes: anything else is
  answered by `refuse`, unread, and the connection is closed.
- Answers carry a Content-Length (none for 204), connections are HTTP/1.1 kept alive at most
  30 s idle, and the access log goes to DEBUG without the target, never to stderr.
- `ListeningDouble` is the start-up a double shares: it listens for as long as a `with` block
  runs, and lets go of what else it holds in `close`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any, TypeVar

from bridge.simulator.server import ClosingHTTPServer

logger = logging.getLogger("tests.doubles")

MAX_BODY = 1 << 20  # bytes a double reads of one request unless told otherwise
JSON = "application/json"


@dataclass(frozen=True)
class Asked:
    method: str
    target: str  # path and query, as sent
    headers: Mapping[str, str]  # names in lower case; a repeated header keeps its last value
    body: bytes = b""

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False  # end the connection after this answer


def json_reply(status: int, body: Any, *headers: tuple[str, str], kind: str = JSON) -> Reply:
    return Reply(status, json.dumps(body).encode(), (("Content-Type", kind), *headers))


Answer = Callable[[Asked], Reply | None]  # None: end the connection without an answer
Refuse = Callable[[Asked, int], Reply]  # the request without its body, and its length (-1: none)


def refuse_plainly(asked: Asked, length: int) -> Reply:
    return Reply(411 if length < 0 else 413)


class DoubleServer(ClosingHTTPServer):
    def __init__(
        self,
        address: tuple[str, int],
        answer: Answer,
        *,
        tls: ssl.SSLContext | None = None,
        tls_failed: Callable[[BaseException], None] = lambda _: None,
        max_body: int = MAX_BODY,
        refuse: Refuse = refuse_plainly,
        handler: type[DoubleHandler] | None = None,
    ) -> None:
        self.answer, self.tls, self.tls_failed = answer, tls, tls_failed
        self.max_body, self.refuse = max_body, refuse
        super().__init__(address, handler or DoubleHandler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        if self.tls is None:
            return sock, address
        # The handshake runs in the handler thread (setup()), never in the accept loop.
        return self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def upgraded(self, plain: Any, tls: ssl.SSLSocket) -> None:
        """A connection became TLS on the handler's thread (a CONNECT tunnel): close_connections()
        must reach the TLS socket, the plain one gave it its descriptor."""
        with self._connections_lock:
            self._connections.discard(plain)
            self._connections.add(tls)


class DoubleHandler(BaseHTTPRequestHandler):
    server: DoubleServer
    protocol_version = "HTTP/1.1"
    server_version = "se-bridge-test-double"
    sys_version = ""
    timeout = 30.0  # an idle keep-alive connection is dropped
    wbufsize = -1  # headers and body leave together
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        if self.server.tls is None:
            return
        try:
            self.request.do_handshake()
        except (ssl.SSLError, OSError) as err:
            self.server.tls_failed(err)
            raise

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # Never the target: a webhook's URL is its secret, the whole path of it.
        logger.debug("%s answered %s", self.command, code)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)

    def serve(self) -> None:
        # Header names in lower case (a repeated header keeps its last value).
        headers = {name.lower(): value for name, value in self.headers.items()}
        length = _length(headers)
        if length < 0 or length > self.server.max_body:
            self.close_connection = True  # the body is not read: no other request can follow
            self.send(self.server.refuse(Asked(self.command, self.path, headers), length))
            return
        body = self.rfile.read(length) if length else b""
        reply = self.server.answer(Asked(self.command, self.path, headers, body))
        if reply is None:
            self.close_connection = True
            return
        self.send(reply)

    def _serve(self) -> None:
        self.serve()  # through the attribute: a double's handler may refine serve()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815

    def send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        for name, value in reply.headers:
            self.send_header(name, value)
        if reply.status != 204:
            self.send_header("Content-Length", str(len(reply.body)))
        if reply.close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if reply.status != 204:
            self.wfile.write(reply.body)


def _length(headers: Mapping[str, str]) -> int:
    """The body's Content-Length; -1 without one that can be read (or with a
    Transfer-Encoding: the clients under test send a Content-Length)."""
    if headers.get("transfer-encoding"):
        return -1
    text = headers.get("content-length", "0").strip() or "0"
    return int(text) if text.isdigit() else -1


class Listener:
    """Serves `make((host, port))` on a thread; `down()` closes the listener and every open
    connection (clients get "connection refused"), `up()` listens again on the same port."""

    def __init__(
        self, make: Callable[[tuple[str, int]], ClosingHTTPServer], host: str, name: str
    ) -> None:
        self._make, self.host, self._name = make, host, name
        self.port = 0
        self._lock = threading.Lock()
        self._server: ClosingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://{self.host}:{self.port}"

    def up(self) -> None:
        with self._lock:
            if self._server is not None:
                return
            server = self._make((self.host, self.port))
            self.port = server.server_address[1]
            self._server = server
            self._thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=self._name,
                daemon=True,
            )
            self._thread.start()

    def down(self) -> None:
        with self._lock:
            server, thread = self._server, self._thread
            self._server, self._thread = None, None
        if server is None:
            return
        server.shutdown()
        server.close_connections()
        server.server_close()  # joins the handler threads
        if thread is not None:
            thread.join(timeout=5)


def listener(answer: Answer, name: str, host: str = "127.0.0.1", **options: Any) -> Listener:
    """A Listener of a DoubleServer answering with `answer` (options as DoubleServer's)."""
    return Listener(lambda address: DoubleServer(address, answer, **options), host, name)


_Double = TypeVar("_Double", bound="ListeningDouble")


class ListeningDouble:
    """The start-up of a double served by a `Listener` of `answer` (options as DoubleServer's)
    for as long as a `with` block runs, on a free loopback port. A double that holds more (a
    throwaway certificate, posts it keeps waiting) refines `close` to let go of it too."""

    def __init__(self, answer: Answer, name: str, host: str = "127.0.0.1", **options: Any) -> None:
        self._listener = listener(answer, name, host, **options)

    def __enter__(self: _Double) -> _Double:
        self._listener.up()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening and close every connection."""
        self._listener.down()


@contextlib.contextmanager
def serving(answer: Answer, name: str, **options: Any) -> Iterator[Listener]:
    """`answer` served on a free loopback port for as long as the block runs."""
    served = listener(answer, name, **options)
    served.up()
    try:
        yield served
    finally:
        served.down()
