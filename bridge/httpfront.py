"""The one HTTP server of the agent's and the consumer's endpoints, for the WSGI apps any local
user can reach (the telemetry endpoint, the approval page): one thread accepts every connection
and reads each request whole, without a thread per client; only complete requests reach the
worker threads that run the app.

What a client can hold, and for how long:

- a connection that has not sent its request line within `line_deadline` (about a second) is
  dropped, and its whole request (head and body) must arrive within `request_deadline`;
- at most `per_client` requests are being read from one address at once, and `max_pending` in
  all: past that the oldest of them is dropped (an idle client is the oldest; a real client
  sends its request at once and is read long before);
- a request's head is at most MAX_HEAD bytes, its body at most `max_body` (413, 431 beyond);
- answering takes a worker: `workers` of them, and `reserved` more that only the requests
  `is_reserved` picks may use (probes, signed-in people), so that what other clients ask for
  cannot take every worker. With none free the answer is 503 at once.

A worker sends its answer within `request_deadline` (a client that does not read is cut off)
and closes the connection: one request per connection. The app is any WSGI app (PEP 3333); the
Functions app mounts the same page with `environ` and `call` (bridge.consumer.functionapp).
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import unquote_to_bytes

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication, WSGIEnvironment

log = logging.getLogger(__name__)

MAX_HEAD = 16 * 1024  # bytes of request line and headers
MAX_DRAIN = 1024 * 1024  # bytes read and dropped after an answer, before the close
ACCEPT_BACKOFF = 0.5  # seconds without accepting when the process is out of descriptors
_TICK = 0.25  # seconds between looks for deadlines when nothing happens


class _Head(NamedTuple):
    method: str
    target: str
    headers: list[tuple[str, str]]

    def header(self, name: str) -> str:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), "")


class Answer(NamedTuple):
    """What a WSGI app answered, gathered whole: "200 OK", its headers, its body."""

    status: str
    headers: list[tuple[str, str]]
    body: bytes


@dataclass
class _Reading:
    sock: socket.socket
    client: str
    started: float
    data: bytearray = field(default_factory=bytearray)
    need: int | None = None  # bytes of head and body, once the head is read
    body_at: int = 0
    head: _Head | None = None


class Front:
    """Serves the WSGI app `app` on (host, port) from threads of its own until `close`.
    `is_reserved` picks, from a request's WSGI environ, those the reserved workers answer."""

    def __init__(
        self,
        host: str,
        port: int,
        app: WSGIApplication,
        *,
        name: str,
        workers: int,
        reserved: int = 0,
        is_reserved: Callable[[WSGIEnvironment], bool] = lambda _: False,
        line_deadline: float = 1.0,
        request_deadline: float = 10.0,
        per_client: int = 8,
        max_pending: int = 256,
        max_body: int = 0,
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, port), family=family, backlog=128)
        self._listener.setblocking(False)
        self.host, self.port = host, int(self._listener.getsockname()[1])
        self._app, self._name, self._is_reserved = app, name, is_reserved
        self._line_deadline, self._deadline = line_deadline, request_deadline
        self._per_client, self._max_pending, self._max_body = per_client, max_pending, max_body
        self._general = threading.BoundedSemaphore(workers)
        self._reserved = threading.BoundedSemaphore(reserved) if reserved else None
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._reading: dict[socket.socket, _Reading] = {}
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> Front:
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for reading in list(self._reading.values()):
            self._drop(reading)
        self._selector.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()

    # --- the one reading thread -------------------------------------------------------------

    def _loop(self) -> None:
        # It sleeps in select() until a client connects or sends, or a deadline is near:
        # nothing wakes an idle process but its clients.
        while not self._closing.is_set():
            try:
                self._turn()
            except Exception:  # a bug here must not leave the port open and unanswered
                log.warning("%s: serving failed; going on", self._name, exc_info=True)
                self._closing.wait(ACCEPT_BACKOFF)

    def _turn(self) -> None:
        wait = _TICK if self._reading else None
        for key, _ in self._selector.select(wait):
            if key.fileobj is self._listener:
                self._accept()
            elif key.fileobj is self._wake_r:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
            else:
                reading = self._reading.get(key.fileobj)  # type: ignore[call-overload]
                if reading is not None:
                    self._read(reading)
        self._expire(time.monotonic())

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as err:
                log.debug("%s: cannot accept a connection: %s", self._name, err)
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors the listener stays readable: wait, do not spin.
                    self._closing.wait(ACCEPT_BACKOFF)
                return
            sock.setblocking(False)
            client = str(address[0])
            self._make_room(client)
            reading = _Reading(sock, client, time.monotonic())
            self._reading[sock] = reading
            self._selector.register(sock, selectors.EVENT_READ)

    def _make_room(self, client: str) -> None:
        """Drop the oldest request being read from `client` (or from anyone) when a new one
        would pass the caps."""
        same = [r for r in self._reading.values() if r.client == client]
        if len(same) >= self._per_client:
            self._drop(min(same, key=lambda r: r.started), "too many connections from it")
        if len(self._reading) >= self._max_pending:
            self._drop(min(self._reading.values(), key=lambda r: r.started), "too many clients")

    def _read(self, reading: _Reading) -> None:
        try:
            got = reading.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            got = b""
        if not got:
            self._drop(reading)
            return
        reading.data += got
        if reading.head is None and not self._read_head(reading):
            return
        if reading.need is not None and len(reading.data) >= reading.need:
            head = reading.head
            assert head is not None
            body = bytes(reading.data[reading.body_at : reading.need])
            self._forget(reading)
            server = (self.host, self.port)
            self._dispatch(reading.sock, environ(*head, body, server=server, client=reading.client))

    def _read_head(self, reading: _Reading) -> bool:
        """Whether the head is read (and its body may follow); refused when it cannot be."""
        end = reading.data.find(b"\r\n\r\n")
        if end > MAX_HEAD or (end < 0 and len(reading.data) > MAX_HEAD):
            self._refuse(reading, 431, "the request's head is too large")
            return False
        head = self._parse(reading, bytes(reading.data[:end])) if end >= 0 else None
        length = self._length(reading, head) if head is not None else -1
        if head is None or length < 0:
            return False
        reading.head, reading.body_at, reading.need = head, end + 4, end + 4 + length
        return True

    def _parse(self, reading: _Reading, head: bytes) -> _Head | None:
        lines = head.decode("iso-8859-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._refuse(reading, 400, "not an HTTP request")
            return None
        headers = []
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name.strip():
                self._refuse(reading, 400, "a header line without a name")
                return None
            headers.append((name.strip(), value.strip()))
        return _Head(parts[0].upper(), parts[1], headers)

    def _length(self, reading: _Reading, head: _Head) -> int:
        """The body's length; -1 when it is refused (the answer is sent)."""
        if head.header("transfer-encoding"):
            self._refuse(reading, 411, "send the body with a Content-Length")
            return -1
        text = head.header("content-length") or "0"
        if not text.isdigit():
            self._refuse(reading, 400, "the Content-Length is no number")
            return -1
        if int(text) > self._max_body:
            self._refuse(reading, 413, f"a body may hold at most {self._max_body} bytes")
            return -1
        return int(text)

    def _expire(self, now: float) -> None:
        for reading in list(self._reading.values()):
            age = now - reading.started
            if age > self._deadline or (age > self._line_deadline and b"\r\n" not in reading.data):
                self._drop(reading, "it sent no request in time")

    def _forget(self, reading: _Reading) -> None:
        self._reading.pop(reading.sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(reading.sock)

    def _drop(self, reading: _Reading, why: str = "") -> None:
        if why:
            log.debug("%s: dropped a connection from %s: %s", self._name, reading.client, why)
        self._forget(reading)
        reading.sock.close()

    def _refuse(self, reading: _Reading, status: int, why: str) -> None:
        self._forget(reading)
        refusal = _plain(status, why)
        self._work(reading.sock, reading.client, lambda: refusal, drain=True)

    # --- the workers ----------------------------------------------------------------------

    def _dispatch(self, sock: socket.socket, asked: WSGIEnvironment) -> None:
        reserved = self._reserved is not None and self._is_reserved(asked)
        client, head = asked["REMOTE_ADDR"], asked["REQUEST_METHOD"] == "HEAD"
        self._work(sock, client, lambda: self._answer(asked), reserved=reserved, head=head)

    def _work(
        self,
        sock: socket.socket,
        client: str,
        answer: Callable[[], Answer],
        *,
        reserved: bool = False,
        drain: bool = False,
        head: bool = False,
    ) -> None:
        """`answer()` sent on a worker (without its body for a HEAD); 503 at once when none is
        free."""
        pool = self._reserved if reserved else None
        if pool is None or not pool.acquire(blocking=False):
            pool = self._general if self._general.acquire(blocking=False) else None
        if pool is None:
            log.debug("%s: every worker is busy: answered %s 503", self._name, client)
            busy = _plain(503, "busy: try again", [("Retry-After", "1")])
            _send(sock, busy, 0.1)
            return
        taken, deadline = pool, self._deadline

        def work() -> None:
            try:
                _send(sock, answer(), deadline, drain=drain, head=head)
            finally:
                taken.release()

        try:
            threading.Thread(target=work, name=f"{self._name} worker", daemon=True).start()
        except RuntimeError as err:  # no thread to be had (TasksMax)
            taken.release()
            log.debug("%s: cannot answer %s: %s", self._name, client, err)
            sock.close()

    def _answer(self, asked: WSGIEnvironment) -> Answer:
        try:
            return call(self._app, asked)
        except Exception:
            log.warning(
                "%s: answering %s %s failed",
                self._name,
                asked["REQUEST_METHOD"],
                asked["PATH_INFO"][:100],
                exc_info=True,
            )
            return _plain(500, "the answer failed")


# --- WSGI (PEP 3333), for this server and the Functions app's HTTP trigger -------------------


def environ(
    method: str,
    target: str,
    headers: Iterable[tuple[str, str]],
    body: bytes,
    *,
    server: tuple[str, int],
    client: str = "",
    scheme: str = "http",
) -> WSGIEnvironment:
    """The WSGI environ of one request read whole. A header whose name holds "_" is left out,
    as the common servers do: it would pass for the header spelled with "-" (the name of
    App Service Authentication's ID token, say)."""
    path, _, query = target.partition("?")
    made: dict[str, Any] = {
        "REQUEST_METHOD": method.upper(),
        "SCRIPT_NAME": "",
        "PATH_INFO": unquote_to_bytes(_wire(path)).decode("latin-1"),
        "QUERY_STRING": query,
        "SERVER_NAME": server[0],
        "SERVER_PORT": str(server[1]),
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": client,
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scheme,
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": io.StringIO(),  # never stderr: what an app says there is dropped
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for name, value in headers:
        if "_" in name:
            continue
        key = name.upper().replace("-", "_")
        key = key if key == "CONTENT_TYPE" else f"HTTP_{key}"
        if key == "HTTP_CONTENT_LENGTH":
            continue  # CONTENT_LENGTH is the body's, read whole
        glue = "; " if key == "HTTP_COOKIE" else ","
        made[key] = f"{made[key]}{glue}{value}" if key in made else value
    return made


def _wire(text: str) -> bytes:
    """The bytes of a request target: read off the wire as Latin-1, or given as text."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode()


def call(app: WSGIApplication, asked: WSGIEnvironment) -> Answer:
    """What `app` answers `asked`, gathered whole (each answer here is small)."""
    started: list[tuple[str, list[tuple[str, str]]]] = []
    written: list[bytes] = []

    def start_response(
        status: str, headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Callable[[bytes], object]:
        if started and exc_info is None:
            raise RuntimeError("start_response was called twice")
        started[:] = [(status, headers)]
        return written.append

    chunks = app(asked, start_response)
    try:
        written.extend(chunks)
    finally:
        if hasattr(chunks, "close"):
            chunks.close()
    if not started:
        raise RuntimeError("the app answered without start_response")
    status, headers = started[0]
    return Answer(status, headers, b"".join(written))


def _plain(status: int, text: str, headers: list[tuple[str, str]] | None = None) -> Answer:
    kind = ("Content-Type", "text/plain; charset=utf-8")
    line = f"{status} {HTTPStatus(status).phrase}"
    return Answer(line, [kind, *(headers or [])], (text + "\n").encode())


def _send(
    sock: socket.socket, answer: Answer, seconds: float, *, drain: bool = False, head: bool = False
) -> None:
    """The answer, then the connection closed; a client that does not take it within
    `seconds` is cut off. With `drain`, what the client still sends (a body refused unread) is
    read and dropped first, for at most a second and MAX_DRAIN bytes: closing on unread bytes
    would reset the connection, and the client could lose the answer. For a HEAD, the length
    of the body and not the body."""
    ours = ("content-length", "connection")
    lines = [f"HTTP/1.1 {answer.status}", "Server: se-bridge"]
    lines += [f"{name}: {value}" for name, value in answer.headers if name.lower() not in ours]
    lines += [f"Content-Length: {len(answer.body)}", "Connection: close", "", ""]
    end = time.monotonic() + min(seconds, 1.0)
    try:
        # An app's header that is not Latin-1 (PEP 3333 asks for it) ends the connection.
        data = "\r\n".join(lines).encode("latin-1") + (b"" if head else answer.body)
        sock.settimeout(max(0.001, seconds))
        sock.sendall(data)
        if not drain:
            return
        sock.shutdown(socket.SHUT_WR)
        drained = 0
        while drained < MAX_DRAIN and time.monotonic() < end:
            sock.settimeout(max(0.001, end - time.monotonic()))
            got = sock.recv(65536)
            if not got:
                break
            drained += len(got)
    except (OSError, UnicodeEncodeError) as err:
        log.debug("sending an answer failed: %s", err)
    finally:
        sock.close()
