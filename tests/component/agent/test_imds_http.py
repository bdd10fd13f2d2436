"""The IMDS client's own HTTP (http.client, one keep-alive connection) against a loopback server.

The server answers from a script, one entry per request, and can drop the connection the way
an idle keep-alive timeout does, so every semantic the old requests-based client had is
checked on the wire: headers, no proxy, no redirects, timeouts, failure kinds, reconnects.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pytest

from bridge.agent import imds
from bridge.agent.approver import Request
from bridge.agent.wiring import build_agent
from bridge.config import AgentSettings, Config, ImdsSettings
from bridge.retry import PermanentError, RetryableError, ThrottledError
from tests.support.wait import eventually

DOC = b'{"DocumentIncarnation": 1, "Events": []}'


@dataclass
class Reply:
    status: int = 200
    body: bytes = DOC
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop_after: bool = False  # close the connection after answering, without saying so
    drop_instead: bool = False  # close the connection without answering at all


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class ScriptedImds(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script: list[Reply] = []
        self.seen: list[Seen] = []
        self.connections = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def next_reply(self) -> Reply:
        with self.lock:
            return self.script.pop(0) if self.script else Reply()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as IMDS does
    server: ScriptedImds

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length) if length else b""
        self.server.seen.append(Seen(self.command, self.path, dict(self.headers), body))
        reply = self.server.next_reply()
        if reply.drop_instead:
            self.close_connection = True
            return
        time.sleep(reply.delay)
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)
        self.close_connection = reply.drop_after


@pytest.fixture
def server() -> Iterator[ScriptedImds]:
    s = ScriptedImds()
    thread = threading.Thread(target=s.serve_forever, daemon=True)
    thread.start()
    yield s
    s.shutdown()
    s.server_close()
    thread.join(5)


@pytest.fixture
def client(server: ScriptedImds) -> Iterator[imds.ImdsClient]:
    c = imds.ImdsClient(server.url + "/vm/vm-0", timeout=2, first_call_timeout=5, max_rps=1e6)
    yield c
    c.close()


def test_get_carries_header_version_and_prefix_over_one_kept_alive_connection(
    server: ScriptedImds, client: imds.ImdsClient
) -> None:
    assert client.scheduled_events() == DOC
    assert client.scheduled_events() == DOC
    first = server.seen[0]
    assert (first.method, first.path) == ("GET", "/vm/vm-0/metadata/scheduledevents"
                                                 "?api-version=2020-07-01")  # fmt: skip
    assert first.headers["Metadata"] == "true"
    assert server.connections == 1


def test_instance_metadata_uses_its_own_version(
    server: ScriptedImds, client: imds.ImdsClient
) -> None:
    server.script.append(Reply(body=b'{"compute": {"name": "vm-0"}}'))
    assert client.instance_metadata() == {"compute": {"name": "vm-0"}}
    assert server.seen[0].path.endswith("/metadata/instance?api-version=2021-02-01")


def test_approval_posts_json_start_requests(server: ScriptedImds, client: imds.ImdsClient) -> None:
    assert client.start_events(["e1", "e2"]) == 200
    seen = server.seen[0]
    assert seen.method == "POST"
    assert seen.headers["Content-Type"] == "application/json"
    assert json.loads(seen.body) == {"StartRequests": [{"EventId": "e1"}, {"EventId": "e2"}]}


def test_a_proxy_in_the_environment_is_never_used(
    server: ScriptedImds, client: imds.ImdsClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{free_port()}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert client.scheduled_events() == DOC
    assert len(server.seen) == 1


def test_a_redirect_is_not_followed_and_is_permanent(
    server: ScriptedImds, client: imds.ImdsClient
) -> None:
    server.script.append(Reply(302, b"", {"Location": server.url + "/elsewhere"}))
    with pytest.raises(PermanentError, match="302"):
        client.scheduled_events()
    assert len(server.seen) == 1


@pytest.mark.parametrize(
    ("reply", "kind", "text"),
    [
        # Refused: a PermanentError that keeps the status (bridge.agent.advisory reads it).
        (Reply(400, b'{ "error": "Bad request: . Required metadata header not specified" }'),
         imds.Refused, "Required metadata header"),
        (Reply(404, b"nope"), imds.Refused, "404"),
        (Reply(410, b""), RetryableError, "410"),
        (Reply(500, b""), RetryableError, "500"),
        (Reply(503, b""), RetryableError, "503"),
        (Reply(429, b"", {"Retry-After": "7"}), ThrottledError, "429"),
    ],
)  # fmt: skip
def test_statuses_map_onto_failure_kinds(
    server: ScriptedImds, client: imds.ImdsClient, reply: Reply, kind: type[Exception], text: str
) -> None:
    server.script.append(reply)
    with pytest.raises(kind, match=text) as info:
        client.scheduled_events()
    assert type(info.value) is kind
    if kind is ThrottledError:
        assert info.value.retry_after == 7.0  # type: ignore[attr-defined]
    assert client.scheduled_events() == DOC  # the connection survives an error status


def test_first_answer_may_be_slow_later_ones_may_not(server: ScriptedImds) -> None:
    client = imds.ImdsClient(server.url, timeout=0.2, first_call_timeout=5, max_rps=1e6)
    server.script += [Reply(delay=0.5), Reply(delay=0.5), Reply()]
    try:
        assert client.scheduled_events() == DOC
        with pytest.raises(RetryableError, match="timed out"):
            client.scheduled_events()
        assert client.scheduled_events() == DOC  # a fresh connection after the timeout
    finally:
        client.close()


def test_nothing_listening_is_retryable() -> None:
    client = imds.ImdsClient(f"http://127.0.0.1:{free_port()}", max_rps=1e6)
    with pytest.raises(RetryableError, match="ConnectionRefusedError"):
        client.scheduled_events()
    client.close()


def test_a_connection_closed_while_idle_is_replaced(
    server: ScriptedImds, client: imds.ImdsClient
) -> None:
    server.script.append(Reply(drop_after=True))
    assert client.scheduled_events() == DOC
    assert client.scheduled_events() == DOC
    assert server.connections == 2


def test_a_kept_alive_connection_closed_under_a_request_is_retried_once_afresh(
    server: ScriptedImds, client: imds.ImdsClient
) -> None:
    assert client.scheduled_events() == DOC
    server.script.append(Reply(drop_instead=True))
    assert client.scheduled_events() == DOC
    assert (len(server.seen), server.connections) == (3, 2)


def test_a_fresh_connection_closed_without_answer_is_retryable_not_retried(
    server: ScriptedImds, client: imds.ImdsClient
) -> None:
    server.script.append(Reply(drop_instead=True))
    with pytest.raises(RetryableError, match="RemoteDisconnected"):
        client.scheduled_events()
    assert len(server.seen) == 1


def test_connection_close_is_honoured(server: ScriptedImds, client: imds.ImdsClient) -> None:
    server.script.append(Reply(headers={"Connection": "close"}, drop_after=True))
    assert client.scheduled_events() == DOC
    assert client.scheduled_events() == DOC
    assert server.connections == 2


def test_a_call_after_close_opens_no_connection(
    server: ScriptedImds, client: imds.ImdsClient
) -> None:
    # A stopping agent closes its client while a call may still wait on its worker thread:
    # that call must not open a connection nobody closes any more (an unclosed socket).
    client.close()
    with pytest.raises(RetryableError, match="closed"):
        client.scheduled_events()
    assert server.connections == 0


def test_a_url_that_is_not_http_is_refused() -> None:
    with pytest.raises(ValueError, match="IMDS URL"):
        imds.ImdsClient("ftp://169.254.169.254")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- an IMDS that never finishes ------------------------------------------------------------


class Hostile:
    """A raw server with one misbehaviour: an endless chunked body, or a body dripped a byte
    at a time; it stops by itself when the test is done."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.stop = threading.Event()
        self.sent = 0
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.recv(65536)
            try:
                if self.kind == "endless":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
                    while not self.stop.is_set() and self.sent < 2**31:
                        conn.sendall(chunk)
                        self.sent += 65536
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n{")
                    while not self.stop.wait(0.2):
                        conn.sendall(b" ")
            except OSError:
                return  # the client hung up: what it should do

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def test_an_endless_body_is_cut_off_at_the_endpoints_cap() -> None:
    server = Hostile("endless")
    client = imds.ImdsClient(server.url, timeout=30, first_call_timeout=30)
    try:
        with pytest.raises(RetryableError, match="more than"):
            client.scheduled_events()
        assert server.sent < 64 * imds.MAX_BODY["scheduledevents"]  # stopped reading early
    finally:
        client.close()
        server.close()


def test_a_body_dripped_byte_by_byte_hits_the_total_deadline() -> None:
    server = Hostile("drip")
    client = imds.ImdsClient(server.url, timeout=1.0, first_call_timeout=1.0)
    began = time.monotonic()
    try:
        with pytest.raises(RetryableError, match="did not finish answering"):
            client.scheduled_events()
        assert time.monotonic() - began < 5  # 1 s deadline, not 100,000 drips
    finally:
        client.close()
        server.close()


@pytest.mark.slow
def test_an_approval_does_not_wait_behind_a_stalled_poll(
    server: ScriptedImds, tmp_path: Path
) -> None:
    """The poll's GET hangs for 3 s; the approval's own read and POST answer at once."""
    doc = (b'{"DocumentIncarnation": 2, "Events": [{"EventId": "E1", "EventStatus": "Scheduled",'
           b' "EventType": "Reboot", "ResourceType": "VirtualMachine", "Resources": ["vm-0"],'
           b' "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT"}]}')  # fmt: skip
    server.script += [Reply(body=doc, delay=3.0), Reply(body=doc), Reply(body=b"")]
    config = Config(
        agent=AgentSettings(state_dir=tmp_path / "state", sinks=[f"jsonl:{tmp_path / 'r'}"]),
        imds=ImdsSettings(url=server.url, timeout=5, first_call_timeout=5),
    )
    agent = build_agent(config, boot_id="b1")
    poll = threading.Thread(target=agent.cycle, daemon=True)
    try:
        poll.start()
        eventually(lambda: server.seen, what="the poll's GET to be held by the server")
        began = time.monotonic()
        attempt = agent.approver.attempt(
            Request("E1", "C1", "Local", "r", "test", datetime.now(timezone.utc))
        )
        assert time.monotonic() - began < 1.5
        assert attempt.kind == "Approved", attempt
    finally:
        poll.join(10)
        agent.shutdown()


@pytest.mark.slow
def test_heartbeats_go_on_while_a_poll_is_stalled(server: ScriptedImds, tmp_path: Path) -> None:
    """The poll's GET takes 4 s; every cycle of the loop still returns within about a second,
    so its housekeeping (the periodic heartbeat) never waits for IMDS."""
    server.script += [Reply(), Reply(), Reply(delay=4.0)]  # events, instance, events
    out = tmp_path / "r.jsonl"
    config = Config(
        agent=AgentSettings(state_dir=tmp_path / "state", sinks=[f"jsonl:{out}"],
                            heartbeat_interval=1, poll_interval=0.2),
        imds=ImdsSettings(url=server.url, timeout=10, first_call_timeout=10),
    )  # fmt: skip
    agent = build_agent(config, boot_id="b1")
    agent.start()
    try:
        agent.cycle()  # the first poll and instance metadata answer at once
        began = time.monotonic()
        longest = 0.0
        while time.monotonic() - began < 3.8:  # the stalled GET answers at about 4 s
            start = time.monotonic()
            time.sleep(agent.cycle())
            longest = max(longest, time.monotonic() - start)
        assert longest < 1.6
        assert agent.delivery.flush(5)
        beats = [line for line in out.read_text().splitlines() if '"Periodic"' in line]
        assert len(beats) >= 2
    finally:
        agent.shutdown()
