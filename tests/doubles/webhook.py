"""A webhook receiver: a real local HTTP server that keeps the JSON bodies posted to it.

Each path is a webhook of its own (`url(path)`), as a Teams workflow's or Slack's URL is: the
bodies it got are in `bodies(path)`. `script(path, 500, 429, ...)` answers its next posts with
those statuses, in order, then 200 again. `hang(path)` holds every post to that path without
an answer until `release()` or the receiver closes; `holding(path)` is set once one is held, so
a test can act *while* a webhook hangs instead of sleeping.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict, deque
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any

from bridge.simulator.server import ClosingHTTPServer


class WebhookReceiver:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bodies: dict[str, list[Any]] = defaultdict(list)
        self._posts: dict[str, int] = defaultdict(int)
        self._scripts: dict[str, deque[int]] = defaultdict(deque)
        self._hanging: dict[str, threading.Event] = {}
        self._release = threading.Event()
        self._server = ClosingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.close_connections()
        self._server.server_close()
        self._thread.join()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def bodies(self, path: str) -> list[Any]:
        """The JSON bodies answered 2xx on `path`, in order."""
        with self._lock:
            return list(self._bodies[path])

    def posts(self, path: str) -> int:
        """Every post to `path`, answered or not."""
        with self._lock:
            return self._posts[path]

    def script(self, path: str, *statuses: int) -> None:
        with self._lock:
            self._scripts[path].extend(statuses)

    def hang(self, path: str) -> None:
        with self._lock:
            self._hanging[path] = threading.Event()

    def holding(self, path: str) -> threading.Event:
        return self._hanging[path]

    def release(self) -> None:
        """Answer the held posts (503), and every later one to a hanging path at once."""
        self._release.set()

    def _answer(self, path: str, body: bytes) -> int:
        with self._lock:
            self._posts[path] += 1
            held = self._hanging.get(path)
            status = self._scripts[path].popleft() if self._scripts[path] else 200
        if held is not None:
            held.set()
            self._release.wait()
            return 503
        if status < 300:
            with self._lock:
                self._bodies[path].append(json.loads(body))
        return status


def _handler(receiver: WebhookReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path = self.path.split("?", 1)[0]
            status = receiver._answer(path, body)
            self.send_response(status)
            if status == 429:
                self.send_header("Retry-After", "0")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the tests read what was posted, not an access log."""

    return Handler
