"""The loopback page's session is the operator's alone (issue 37): a browser sends its cookies
for 127.0.0.1 to every port of it, so a page served on another loopback port gets the
session cookie. The cookie alone must not decide; sessions end when idle and all of them when
the token file is rewritten; the one-time login code is in no INFO line."""

from __future__ import annotations

import logging
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.config import PeopleSettings
from bridge.consumer.people.app import LocalSignIn, PeopleApp
from bridge.consumer.people.auth import LocalOperator, read_token
from bridge.consumer.people.server import PageServer, build_app
from tests.component.people.test_api import DIGEST, api, call, csrf_of, form
from tests.support.people import NOW, RecordingDesk, open_event


@pytest.fixture
def decider() -> RecordingDesk:
    decider = RecordingDesk()
    decider.events["ev-1"] = open_event("ev-1", "db-0", "db-1")
    return decider


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def ticks() -> Ticks:
    return Ticks()


@pytest.fixture
def page(decider: RecordingDesk, tmp_path: Path, ticks: Ticks) -> Iterator[PageServer]:
    operator = LocalOperator.start(tmp_path, idle=600, clock=ticks)
    server = PageServer(PeopleApp(decider, LocalSignIn(operator), lambda: NOW), "127.0.0.1:0")
    yield server.start()
    server.close()


def operator_of(server: PageServer) -> LocalOperator:
    assert isinstance(server.app.sign_in, LocalSignIn)
    return server.app.sign_in.operator


def signed_in(server: PageServer) -> dict[str, str]:
    login = call(server, "GET", f"/login?code={operator_of(server).login_code}")
    assert login.status == 303, login.text
    return {"Cookie": login.headers["set-cookie"].split(";")[0]}


def test_a_session_cookie_alone_cannot_decide(
    page: PageServer, decider: RecordingDesk, tmp_path: Path
) -> None:
    # What a page on another loopback port can do with the cookie the browser sent it: read
    # the page, its CSRF token, and post a decision. Without the operator token: refused.
    stolen = signed_in(page)
    shown = call(page, "GET", "/", headers=stolen)
    assert shown.status == 200
    assert 'name="token"' in shown.text, "each form asks for the operator token"
    fields = {"csrf": csrf_of(shown.text), "action": "approve", "event": "ev-1", "digest": DIGEST}
    refused = form(page, fields, stolen)
    assert refused.status == 403
    assert "operator token" in refused.text
    assert form(page, {**fields, "token": "guess"}, stolen).status == 403
    paused = {"csrf": csrf_of(shown.text), "action": "pause", "reason": "x"}
    assert form(page, paused, stolen).status == 403
    assert decider.taken == []
    # The operator, who can read the token file, decides.
    accepted = form(page, {**fields, "token": read_token(tmp_path)}, stolen)
    assert accepted.status == 200, accepted.text
    assert [a.kind for a in decider.taken] == ["approve"]


def test_the_cookie_is_named_for_this_start_and_port_and_the_page_answers_its_own_host_only(
    page: PageServer, decider: RecordingDesk, tmp_path: Path
) -> None:
    cookie = signed_in(page)["Cookie"]
    name = cookie.split("=", 1)[0]
    assert f"_{page.port}_" in name
    other = LocalOperator.start(tmp_path / "other")
    assert other.cookie_name != operator_of(page).cookie_name
    # A page of another name that resolves to 127.0.0.1 (DNS rebinding) gets nothing.
    rebound = call(page, "GET", "/", headers={"Cookie": cookie,
                                              "Host": f"evil.example:{page.port}"})  # fmt: skip
    assert rebound.status == 403
    for host in (f"127.0.0.1:{page.port}", f"localhost:{page.port}"):
        assert call(page, "GET", "/", headers={"Cookie": cookie, "Host": host}).status == 200


def test_a_session_ends_after_its_idle_time(page: PageServer, ticks: Ticks) -> None:
    session = signed_in(page)
    ticks.now += 599
    assert call(page, "GET", "/", headers=session).status == 200  # used: idle from now
    ticks.now += 599
    assert call(page, "GET", "/", headers=session).status == 200
    ticks.now += 601
    expired = call(page, "GET", "/", headers=session)
    assert expired.status == 401
    assert "sign in" in expired.text.lower()


def test_every_session_ends_when_the_token_file_is_rewritten(
    page: PageServer, tmp_path: Path, decider: RecordingDesk
) -> None:
    session = signed_in(page)
    old = read_token(tmp_path)
    assert call(page, "GET", "/", headers=session).status == 200
    (tmp_path / "operator-token").write_text("a-new-operator-token-of-enough-length\n")
    assert call(page, "GET", "/", headers=session).status == 401
    assert api(page, "/api/v1/events", old).status == 401
    assert api(page, "/api/v1/events", "a-new-operator-token-of-enough-length").status == 200
    login = call(page, "POST", "/login", b"token=a-new-operator-token-of-enough-length",
                 {"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert login.status == 303


def test_the_idle_time_is_a_setting_with_a_default() -> None:
    assert PeopleSettings().session_idle == 1800.0


def test_the_one_time_login_code_is_in_no_info_line(
    decider: RecordingDesk, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    app = build_app(PeopleSettings(page_address="127.0.0.1:0"), decider, tmp_path, lambda: NOW)
    server = PageServer(app, "127.0.0.1:0").start()
    try:
        code = operator_of(server).login_code
        assert code is not None
        assert code not in caplog.text
        assert f"{server.url}/login" in caplog.text
        where = tmp_path / "operator-login"
        assert where.read_text().strip() == f"{server.url}/login?code={code}"
        assert stat.S_IMODE(where.stat().st_mode) == 0o600
        assert str(where) in caplog.text
    finally:
        server.close()


def test_a_session_cookie_alone_cannot_answer_a_patch_run(
    page: PageServer, decider: RecordingDesk, tmp_path: Path
) -> None:
    subject = "(patch:tuesday/20261208020000)"
    decider.ask_patch(subject)
    stolen = signed_in(page)
    shown = call(page, "GET", "/", headers=stolen)
    fields = {"csrf": csrf_of(shown.text), "action": "patch_cancel", "run": subject,
              "reason": "one at a time"}  # fmt: skip
    assert form(page, fields, stolen).status == 403
    assert decider.patch_answers == []
    accepted = form(page, {**fields, "token": read_token(tmp_path)}, stolen)
    assert accepted.status == 200, accepted.text
    assert [a[1] for a in decider.patch_answers] == ["cancel"]
