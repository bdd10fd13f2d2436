"""A webhook receiver that attacks the poster: a real local HTTP server whose answer to a post is
`huge` (a 200 with a body of `size` bytes), `endless` (a 200 whose chunked body never ends) or
`drip` (a byte of the status line every `every` seconds, forever).

It counts what it sent and notices when the poster hangs up (`cut`: the connections the poster
closed before the answer was over), which only a poster that stops reading does.
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType
from typing import Literal

Mode = Literal["huge", "endless", "drip"]
CHUNK = 64 * 1024


class HostileWebhook:
    def __init__(self, mode: Mode, *, size: int = 400 * 1024 * 1024, every: float = 0.5) -> None:
        self.mode, self.size, self.every = mode, size, every
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.posts = 0
        self.sent = 0  # bytes of answers, all connections
        self.cut = 0  # connections the poster closed while the answer went on
        self._accepting = threading.Thread(target=self._accept, daemon=True, name="hostile")

    def __enter__(self) -> HostileWebhook:
        self._accepting.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._listener.close()
        self._accepting.join(timeout=10)

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}{path}"

    def counts(self) -> tuple[int, int, int]:
        """(posts, bytes sent, connections cut by the poster)."""
        with self._lock:
            return self.posts, self.sent, self.cut

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(client,), daemon=True).start()

    def _answer(self, client: socket.socket) -> None:
        with client:
            client.settimeout(10)
            try:
                request = b""
                while b"\r\n\r\n" not in request:
                    got = client.recv(CHUNK)
                    if not got:
                        return
                    request += got
                with self._lock:
                    self.posts += 1
                self._send_answer(client)
            except OSError:  # the poster hung up (reset, broken pipe) or stopped reading
                with self._lock:
                    self.cut += 1

    def _send_answer(self, client: socket.socket) -> None:
        if self.mode == "drip":
            for byte in b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 10_000_000:
                if self._stop.wait(self.every):
                    return
                self._send(client, bytes([byte]))
            return
        if self.mode == "huge":
            self._send(client, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % self.size)
            left = self.size
            while left > 0 and not self._stop.is_set():
                self._send(client, b"\0" * min(CHUNK, left))
                left -= CHUNK
            return
        self._send(client, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (CHUNK, b"x" * CHUNK)
        while not self._stop.is_set():
            self._send(client, chunk)

    def _send(self, client: socket.socket, data: bytes) -> None:
        client.sendall(data)
        with self._lock:
            self.sent += len(data)
