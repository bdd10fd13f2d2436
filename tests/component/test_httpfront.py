"""bridge.httpfront over real sockets: what one address may hold, the workers kept for the
requests that may use them, and requests refused before anything answers them."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import pytest
import requests

from bridge.httpfront import Front, environ
from tests.support.wait import eventually

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment


class Blocking:
    """A WSGI app that holds every request to /slow until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.held = threading.Semaphore(0)

    def __call__(self, asked: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path, body = asked["PATH_INFO"], asked["wsgi.input"].read()
        if path == "/slow":
            self.held.release()
            self.release.wait(60)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [f"{asked['REQUEST_METHOD']} {path} {len(body)}".encode()]


@pytest.fixture
def handler() -> Iterator[Blocking]:
    made = Blocking()
    yield made
    made.release.set()


@pytest.fixture
def front(handler: Blocking) -> Iterator[Front]:
    served = Front("127.0.0.1", 0, handler, name="test front", workers=1, reserved=1,
                   is_reserved=lambda asked: asked["PATH_INFO"] == "/probe", request_deadline=60,
                   per_client=3, max_body=100).start()  # fmt: skip
    yield served
    served.close()


def url(front: Front, path: str) -> str:
    return f"http://127.0.0.1:{front.port}{path}"


def closed_by_server(client: socket.socket) -> bool:
    client.settimeout(0.2)
    try:
        return client.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_one_address_past_its_cap_loses_its_oldest_idle_connection(front: Front) -> None:
    oldest = socket.create_connection(("127.0.0.1", front.port))
    others = [socket.create_connection(("127.0.0.1", front.port)) for _ in range(2)]
    try:
        assert not closed_by_server(oldest)
        newest = socket.create_connection(("127.0.0.1", front.port))  # the fourth: past 3
        others.append(newest)
        eventually(lambda: closed_by_server(oldest), what="the oldest connection dropped")
        newest.sendall(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
        newest.settimeout(30)
        assert newest.recv(1024).startswith(b"HTTP/1.1 200 OK")
    finally:
        for client in [oldest, *others]:
            client.close()


def test_the_kept_workers_answer_only_the_requests_they_are_kept_for(
    front: Front, handler: Blocking
) -> None:
    slow = threading.Thread(target=requests.get, args=(url(front, "/slow"),),
                            kwargs={"timeout": 60}, daemon=True)  # fmt: skip
    slow.start()
    assert handler.held.acquire(timeout=30), "the slow request never reached the handler"
    # The one general worker is busy: anyone else is told so at once, the probe is answered.
    busy = requests.get(url(front, "/other"), timeout=30)
    assert (busy.status_code, busy.headers["Retry-After"]) == (503, "1")
    assert requests.get(url(front, "/probe"), timeout=30).text == "GET /probe 0"
    handler.release.set()
    slow.join(30)
    # The worker is let go once its send has returned, a moment after the slow request's
    # client has the answer (a 503 in between, once in a CI run): asked again until then.
    eventually(
        lambda: requests.get(url(front, "/other"), timeout=30).status_code == 200,
        what="the general worker free again after the slow request",
    )


def test_a_body_is_read_whole_and_requests_beyond_the_limits_are_refused(front: Front) -> None:
    # One worker answers refusals too, and it is free again only once the last client has gone:
    # on a loaded machine the next request may find it busy, and 503 is then the right answer.
    def answered(send: Callable[[], requests.Response]) -> requests.Response:
        def not_busy() -> tuple[requests.Response] | None:  # a tuple: a 4xx Response is falsy
            answer = send()
            return None if answer.status_code == 503 else (answer,)

        return eventually(not_busy, what="an answer from a free worker")[0]

    body = answered(lambda: requests.post(url(front, "/b"), data=b"x" * 100, timeout=30))
    assert body.text == "POST /b 100"
    too_big = answered(lambda: requests.post(url(front, "/b"), data=b"x" * 101, timeout=30))
    assert too_big.status_code == 413
    chunked = answered(lambda: requests.post(url(front, "/b"), data=iter([b"x"]), timeout=30))
    assert chunked.status_code == 411
    headers = {"X-Big": "y" * 20_000}
    huge = answered(lambda: requests.get(url(front, "/h"), headers=headers, timeout=30))
    assert huge.status_code == 431

    def not_http() -> bytes | None:
        with socket.create_connection(("127.0.0.1", front.port), timeout=30) as client:
            client.sendall(b"NOT HTTP\r\n\r\n")
            answer = client.recv(1024)
        return None if answer.startswith(b"HTTP/1.1 503") else answer

    assert eventually(not_http, what="an answer from a free worker").startswith(b"HTTP/1.1 400")


def test_a_request_reaches_the_app_as_pep_3333_says_and_no_header_passes_for_another() -> None:
    headers = [("X_MS_TOKEN_AAD_ID_TOKEN", "forged"), ("X-Seen", "1"), ("Cookie", "a=1")]
    headers += [("Cookie", "b=2"), ("Content-Type", "application/json"), ("Content-Length", "9")]
    server = ("127.0.0.1", 80)
    asked = environ("post", "/events/E%201?x=1", headers, b"{}", server=server, client="127.0.0.2")
    # "_" and "-" are one in the environ: a name with "_" would pass for App Service
    # Authentication's header, which the page trusts only as it is spelled.
    assert "HTTP_X_MS_TOKEN_AAD_ID_TOKEN" not in asked
    assert asked["REQUEST_METHOD"] == "POST"
    assert (asked["PATH_INFO"], asked["QUERY_STRING"]) == ("/events/E 1", "x=1")
    assert (asked["HTTP_X_SEEN"], asked["HTTP_COOKIE"]) == ("1", "a=1; b=2")
    assert (asked["CONTENT_TYPE"], asked["CONTENT_LENGTH"]) == ("application/json", "2")
    assert asked["wsgi.input"].read() == b"{}"
    assert asked["REMOTE_ADDR"] == "127.0.0.2"
