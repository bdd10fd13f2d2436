"""An HTTP pass-through that counts requests, put in front of one Azurite service.

Azure Storage bills per transaction, and Azurite (started with --silent) logs nothing, so the
cost benchmark counts what crosses this proxy. Shared Key signatures cover the path and
headers, not the host, so clients signing for the proxy's address are accepted upstream.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from urllib.parse import unquote, urlsplit

from tests.support.azurite import Azurite

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


class CountingProxy:
    """Forwards to `upstream` (http://host:port); `counts` holds "METHOD path-kind" totals."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 80
        self.counts: Counter[str] = Counter()
        # Table requests by PartitionKey; "" for others.
        self.partitions: Counter[str] = Counter()
        # Table entities read or written, by PartitionKey (a query returns many; a batch
        # writes many): what a partition's "entities per second" target counts.
        self.entities: Counter[str] = Counter()
        # When each queue's messages were read (time.monotonic()), by queue: an agent's reads
        # come faster for a few seconds after an event appears (benchmark 8 tells them apart).
        self.reads: defaultdict[str, list[float]] = defaultdict(list)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def count(self, key: str, partition: str = "", entities: int = 0) -> None:
        with self._lock:
            self.counts[key] += 1
            self.partitions[partition] += 1
            if entities:
                self.entities[partition] += entities

    def read(self, queue: str) -> None:
        with self._lock:
            self.reads[queue].append(time.monotonic())

    def reads_between(self, began: float, ended: float) -> dict[str, list[float]]:
        with self._lock:
            return {q: [t for t in ts if began <= t <= ended] for q, ts in self.reads.items()}

    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler_for(proxy: CountingProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per request would drown the benchmark's output

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
                proxy.count(
                    f"{self.command} {_kind(self.path)}",
                    _partition(self.path, body),
                    _entities(self.command, self.path, body, data),
                )
                if self.command == "GET" and _kind(self.path) == "messages":
                    proxy.read(_queue(self.path))
                self.send_response(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
            finally:
                upstream.close()

        # http.server looks handlers up by these names.
        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_MERGE = _forward  # noqa: N815

    return Handler


def _kind(path: str) -> str:
    """`messages` for queue message operations, else the first path part after the account."""
    bare = path.split("?", 1)[0].strip("/").split("/")
    if bare[-1] == "messages" or (len(bare) >= 2 and bare[-2] == "messages"):
        return "messages"
    return "other" if len(bare) < 2 else "resource"


def _queue(path: str) -> str:
    """The queue a message operation names: /account/queue/messages."""
    bare = unquote(path.split("?", 1)[0]).strip("/").split("/")
    return bare[bare.index("messages") - 1]


_KEY_IN_PATH = re.compile(r"PartitionKey='([^']*)'")
_KEY_IN_FILTER = re.compile(r"PartitionKey(?:%20|\+| )eq(?:%20|\+| )(?:%27|')([^'%]*)")
_KEY_IN_BODY = re.compile(rb'"PartitionKey"\s*:\s*"([^"]*)"')
# A query of every partition of a spread collection (bridge.consumer.state.tables):
# `PartitionKey ge 'event-' and ...`, counted as the collection's.
_SPREAD_IN_FILTER = re.compile(r"PartitionKey(?:%20|\+| )ge(?:%20|\+| )(?:%27|')([^'%-]*)-")


_BATCH_OPERATION = re.compile(rb"(?m)^(?:POST|PUT|MERGE|PATCH|DELETE|GET) \S+ HTTP/1\.1")


def _entities(method: str, path: str, body: bytes | None, answer: bytes) -> int:
    """Table entities a request read or wrote: one per operation of a batch, those a query
    returned, one for a write to an entity (only meaningful for the table service)."""
    bare = unquote(path.split("?", 1)[0])
    if bare.endswith("$batch"):
        return len(_BATCH_OPERATION.findall(body or b""))
    if method == "GET":
        try:
            found = json.loads(answer)
        except ValueError:  # not JSON: a blob or a queue's XML
            return 0
        if isinstance(found, dict) and isinstance(found.get("value"), list):
            return sum(1 for item in found["value"] if "PartitionKey" in item)
        return 1 if isinstance(found, dict) and "PartitionKey" in found else 0
    if bare.rstrip("/").endswith("/Tables"):
        return 0  # a table made, not an entity
    return 1 if method in ("POST", "PUT", "MERGE", "PATCH", "DELETE") else 0


def _partition(path: str, body: bytes | None) -> str:
    """The table PartitionKey a request names: in the entity's path, a query's filter, or an
    inserted entity's body; "" when none (queue and blob requests, table listings)."""
    found = (
        _KEY_IN_PATH.search(path) or _KEY_IN_FILTER.search(path) or _SPREAD_IN_FILTER.search(path)
    )
    if found:
        return unquote(found.group(1))
    inserted = _KEY_IN_BODY.search(body or b"")
    return inserted.group(1).decode() if inserted else ""


@contextlib.contextmanager
def counted_azurite(folder: Path) -> Iterator[dict[str, CountingProxy]]:
    """Azurite in `folder`, with a counting proxy in front of its queue, table and blob
    services (by service name); stopped at the end."""
    azurite = Azurite(folder).start()
    try:
        with contextlib.ExitStack() as stack:
            yield {
                service: stack.enter_context(CountingProxy(azurite.endpoints[service]))
                for service in ("queue", "table", "blob")
            }
    finally:
        azurite.stop()
