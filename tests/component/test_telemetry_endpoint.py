"""The metrics and health endpoint under clients that misbehave: slow ones hold neither its
threads nor its file descriptors, broken ones print no traceback, and HEAD is answered.

Loopback only, a bounded number of connections, each test bounded in time.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
import requests
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from bridge import telemetry
from tests.support.wait import eventually

SLOW_CLIENTS = 2 * telemetry.MAX_CONNECTIONS


def ok() -> tuple[bool, str]:
    return True, "fine"


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[telemetry.Endpoint]:
    monkeypatch.setattr(telemetry, "REQUEST_DEADLINE", 1.0)  # seconds a client may take
    served = telemetry.Endpoint("127.0.0.1:0", CollectorRegistry(), live=ok, ready=ok).start()
    yield served
    served.close()


@pytest.mark.slow
def test_slow_clients_are_capped_and_cut_off_and_a_scrape_gets_through(
    endpoint: telemetry.Endpoint,
) -> None:
    base = threading.active_count()
    clients: list[socket.socket] = []
    for _ in range(SLOW_CLIENTS):
        try:  # past the cap and the listen backlog the kernel may refuse: that is fine
            clients.append(socket.create_connection(("127.0.0.1", endpoint.port), timeout=2))
        except OSError:
            continue
    try:
        peak = _drip_until_cut_off(clients, base)
    finally:
        for client in clients:
            client.close()
    assert peak <= telemetry.MAX_CONNECTIONS
    answer = requests.get(f"http://127.0.0.1:{endpoint.port}/healthz", timeout=10)
    assert answer.status_code == 200


def _drip_until_cut_off(clients: list[socket.socket], base: int) -> int:
    """Send each client's request one byte at a time until the endpoint closed them all; the
    most threads this process had meanwhile, over `base`."""
    for client in clients:
        client.setblocking(False)
    open_ = set(clients)
    peak, deadline = 0, time.monotonic() + 30
    while open_:
        assert time.monotonic() < deadline, f"{len(open_)} slow clients still held after 30 s"
        for client in list(open_):  # a request line that never ends
            try:
                client.send(b"G")
                if client.recv(1024) == b"":
                    open_.discard(client)
            except BlockingIOError:
                pass
            except OSError:  # reset by the endpoint: cut off
                open_.discard(client)
        peak = max(peak, threading.active_count() - base)
        time.sleep(0.2)
    return peak


class Broken(Collector):
    def collect(self) -> Iterator[Metric]:
        raise RuntimeError("the collector broke")


def test_errors_are_logged_not_printed(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    served = telemetry.Endpoint("127.0.0.1:0", registry, live=ok, ready=ok).start()
    registry.register(Broken())
    try:
        caplog.set_level(logging.DEBUG, logger="bridge.telemetry")
        answer = requests.get(f"http://127.0.0.1:{served.port}/metrics", timeout=10)
        assert answer.status_code == 500
        for _ in range(20):  # a client that asks and hangs up at once, with a reset
            client = socket.create_connection(("127.0.0.1", served.port), timeout=5)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            client.close()
        assert requests.get(f"http://127.0.0.1:{served.port}/healthz", timeout=10).ok
    finally:
        served.close()
    assert "Traceback" not in capfd.readouterr().err
    said = [r for r in caplog.records if r.name == "bridge.telemetry"]
    assert any(r.levelno == logging.WARNING and "the collector broke" in r.getMessage()
               for r in said)  # fmt: skip


def test_head_answers_as_get_without_a_body(endpoint: telemetry.Endpoint) -> None:
    base = f"http://127.0.0.1:{endpoint.port}"
    for path in ("/healthz", "/readyz", "/metrics"):
        answer = requests.head(base + path, timeout=10)
        assert answer.status_code == 200, path
        assert answer.content == b""
        whole = requests.get(base + path, timeout=10).content
        assert int(answer.headers["Content-Length"]) == len(whole)
    assert requests.head(base + "/nothing", timeout=10).status_code == 404


# Issue 37: eight idle connections made every liveness probe time out. The tests give a whole
# request two minutes, so that only the request line's own deadline can free what idle
# clients hold, and a probe's generous timeout cannot be met by waiting them out.
LONG = 120.0


@pytest.fixture
def patient(monkeypatch: pytest.MonkeyPatch) -> Iterator[telemetry.Endpoint]:
    monkeypatch.setattr(telemetry, "REQUEST_DEADLINE", LONG)
    served = telemetry.Endpoint("127.0.0.1:0", CollectorRegistry(), live=ok, ready=ok).start()
    yield served
    served.close()


def idle_clients(endpoint: telemetry.Endpoint, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", endpoint.port), timeout=5) for _ in range(count)]


def test_probes_are_answered_while_idle_clients_hold_connections(
    patient: telemetry.Endpoint,
) -> None:
    idle = idle_clients(patient, 3 * telemetry.MAX_CONNECTIONS)
    try:
        for path in ["/healthz"] * 9 + ["/readyz", "/metrics"]:
            answer = requests.get(f"http://127.0.0.1:{patient.port}{path}", timeout=60)
            assert answer.status_code == 200, path
    finally:
        for client in idle:
            client.close()


def test_a_client_that_sends_no_request_line_is_dropped(patient: telemetry.Endpoint) -> None:
    [client] = idle_clients(patient, 1)
    client.settimeout(0.5)

    def dropped() -> bool:
        try:
            return client.recv(1) == b""
        except TimeoutError:
            return False
        except OSError:  # reset
            return True

    try:
        eventually(dropped, timeout=30, what="the idle client dropped", interval=0.1)
    finally:
        client.close()


class Stuck(Collector):
    """A collector that does not return until released: /metrics clients that wait."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def collect(self) -> Iterator[Metric]:
        self.release.wait(LONG)
        return iter(())


def test_probes_are_answered_whatever_metrics_clients_do() -> None:
    registry = CollectorRegistry()
    stuck = Stuck()
    served = telemetry.Endpoint("127.0.0.1:0", registry, live=ok, ready=ok).start()
    registry.register(stuck)
    url = f"http://127.0.0.1:{served.port}"
    scrapes = [threading.Thread(target=_scrape, args=(url,), daemon=True)
               for _ in range(2 * telemetry.MAX_CONNECTIONS)]  # fmt: skip
    try:
        for scrape in scrapes:
            scrape.start()
        for path in ("/healthz", "/readyz"):
            assert requests.get(url + path, timeout=60).status_code == 200
    finally:
        stuck.release.set()
        served.close()


def _scrape(url: str) -> None:
    with contextlib.suppress(requests.RequestException):
        requests.get(url + "/metrics", timeout=LONG)
