"""A double's listener that goes down and comes back on the same port: what the HTTP doubles
share for "the service is unreachable for a while"."""

from __future__ import annotations

import threading
from collections.abc import Callable

from bridge.simulator.server import ClosingHTTPServer


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
