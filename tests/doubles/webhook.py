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
from typing import Any

from tests.doubles.httpdouble import Asked, ListeningDouble, Reply


class WebhookReceiver(ListeningDouble):
    def __init__(self) -> None:
        super().__init__(self._serve, "webhook-receiver")
        self._lock = threading.Lock()
        self._bodies: dict[str, list[Any]] = defaultdict(list)
        self._posts: dict[str, int] = defaultdict(int)
        self._scripts: dict[str, deque[int]] = defaultdict(deque)
        self._hanging: dict[str, threading.Event] = {}
        self._release = threading.Event()

    def close(self) -> None:
        self._release.set()  # a held post ends, or stopping would wait on its handler
        super().close()

    def url(self, path: str) -> str:
        return f"{self._listener.url()}{path}"

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

    def _serve(self, asked: Asked) -> Reply:
        if asked.method != "POST":
            return Reply(501, close=True)
        status = self._answer(asked.path, asked.body)
        # One post per connection, as the receiver has always answered (HTTP/1.0's way).
        return Reply(status, b"", (("Retry-After", "0"),) if status == 429 else (), close=True)

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
