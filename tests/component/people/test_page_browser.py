"""The approval page in a real Chromium with scripting off: sign in once through the logged
address, approve an event through its form and read what happened; a form posted from another
page (no CSRF token of ours) is refused. Screenshots are kept as test artefacts."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from bridge.config import PeopleSettings
from bridge.consumer.people.app import LocalSignIn
from bridge.consumer.people.server import PageServer, build_app
from tests.doubles.entra import AUDIENCE, Tenant, answering, serving
from tests.support.browser import Chromium
from tests.support.people import NOW, RecordingDesk, open_event
from tests.support.wait import eventually

EVENT = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"


@pytest.fixture
def decider() -> RecordingDesk:
    decider = RecordingDesk()
    decider.events[EVENT] = open_event(EVENT, "db-0", "db-1", ask="db-owners until 09:10")
    decider.events["E2"] = open_event("E2", "web-3")
    return decider


@pytest.fixture
def chromium(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Chromium]:
    with Chromium.start(tmp_path, request.node.name) as browser:
        yield browser


def login_url(local: PageServer) -> str:
    assert isinstance(local.app.sign_in, LocalSignIn)
    return f"{local.url}/login?code={local.app.sign_in.operator.login_code}"


def operator_token(local: PageServer) -> str:
    assert isinstance(local.app.sign_in, LocalSignIn)
    return local.app.sign_in.operator.token


def test_a_person_approves_an_event_through_the_page_with_scripting_off(
    local: PageServer, chromium: Chromium, decider: RecordingDesk
) -> None:
    driver = chromium.driver
    driver.get(login_url(local))
    assert driver.current_url == local.url + "/"
    section = driver.find_element(By.ID, f"event-{EVENT}")
    assert "db-0, db-1" in section.text
    assert "Asked: db-owners until 09:10" in section.text
    assert "zones" in driver.find_element(By.TAG_NAME, "table").text
    chromium.shot("open-events")
    form = section.find_element(By.XPATH, ".//form[.//button[@value='approve']]")
    form.find_element(By.NAME, "reason").send_keys("failover done")
    form.find_element(By.NAME, "token").send_keys(operator_token(local))
    form.find_element(By.TAG_NAME, "button").click()
    answer = driver.find_element(By.ID, "answer")
    assert answer.text == f"Accepted: approved {EVENT} by {decider.taken[0].by.name}"
    chromium.shot("approved")
    [action] = decider.taken
    assert (action.kind, action.event_id, action.reason) == ("approve", EVENT, "failover done")
    assert action.resources_digest == decider.events[EVENT].resources_digest
    assert action.by.object_id.startswith("local:")


def test_an_override_without_a_reason_is_stopped_by_the_form_and_by_the_consumer(
    local: PageServer, chromium: Chromium, decider: RecordingDesk
) -> None:
    driver = chromium.driver
    driver.get(login_url(local))
    section = driver.find_element(By.ID, "event-E2")
    form = section.find_element(By.XPATH, ".//form[.//button[@value='override']]")
    reason = form.find_element(By.NAME, "reason")
    assert reason.get_attribute("required") is not None
    reason.send_keys("   ")  # blank: the browser lets it through, the consumer does not
    form.find_element(By.NAME, "token").send_keys(operator_token(local))
    form.find_element(By.TAG_NAME, "button").click()
    assert driver.find_element(By.ID, "answer").text.startswith("NoReason:")
    chromium.shot("override-refused")
    assert decider.taken == []


def test_a_form_from_another_page_is_refused(
    local: PageServer, chromium: Chromium, decider: RecordingDesk, tmp_path: Path
) -> None:
    digest = decider.events[EVENT].resources_digest
    hostile = (
        f'<form method="post" action="{local.url}/decide">'
        '<input type="hidden" name="action" value="approve">'
        f'<input type="hidden" name="event" value="{EVENT}">'
        f'<input type="hidden" name="digest" value="{digest}">'
        '<input type="hidden" name="csrf" value="1700000000.00">'
        '<button type="submit" id="go">Win a prize</button></form>'
        # The browser runs no script (this page has no CSP of its own to stop it).
        "<script>document.getElementById('go').textContent = 'scripted';</script>"
    ).encode()

    with answering(lambda: hostile, "text/html") as other:
        driver = chromium.driver
        driver.get(login_url(local))  # signed in: the session cookie is there
        driver.get(other)
        button = driver.find_element(By.ID, "go")
        assert button.text == "Win a prize"  # scripting is off
        button.click()
        assert "not made by this page" in driver.find_element(By.ID, "answer").text
        chromium.shot("forged-form-refused")
    assert decider.taken == []


@pytest.fixture
def entra(decider: RecordingDesk, tmp_path: Path) -> Iterator[tuple[PageServer, Tenant]]:
    with serving(Tenant()) as tenant:
        settings = PeopleSettings(tenant_id=tenant.tenant_id, audience=[AUDIENCE],
                                  jwks_url=tenant.jwks_url, page_address="127.0.0.1:0")  # fmt: skip
        server = PageServer(build_app(settings, decider, tmp_path, lambda: NOW), "127.0.0.1:0")
        yield server.start(), tenant
        server.close()


def signed_in(chromium: Chromium, token: str) -> None:
    """What App Service Authentication does for a signed-in person: every request the browser
    sends carries their ID token in X-MS-TOKEN-AAD-ID-TOKEN (set here through DevTools, which
    needs no script in the page)."""
    chromium.driver.execute_cdp_cmd("Network.enable", {})
    headers = {"X-MS-TOKEN-AAD-ID-TOKEN": token}
    chromium.driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": headers})


def test_behind_app_service_authentication_the_role_decides_who_may_use_the_page(
    entra: tuple[PageServer, Tenant], chromium: Chromium, decider: RecordingDesk
) -> None:
    server, tenant = entra
    signed_in(chromium, tenant.token(oid="oid-eve", name="Eve", roles=()))
    chromium.driver.get(server.url + "/")
    said = chromium.driver.find_element(By.ID, "answer").text
    assert "Eve does not have the app role SeBridge.Decide" in said
    chromium.shot("no-role")
    signed_in(chromium, tenant.token(oid="oid-dana", name="Dana"))
    chromium.driver.get(server.url + "/")
    form = chromium.driver.find_element(By.XPATH, "//form[.//button[@value='pause']]")
    form.find_element(By.NAME, "scope").send_keys("zone:2")
    form.find_element(By.NAME, "until").send_keys("2h")
    form.find_element(By.NAME, "reason").send_keys("incident 4711")
    form.find_element(By.TAG_NAME, "button").click()
    assert chromium.driver.find_element(By.ID, "answer").text == "Accepted: pause of zone:2"
    assert (
        "Paused: zone:2, until 2026-11-27T11:00:00.000Z, by Dana"
        in chromium.driver.find_element(By.TAG_NAME, "body").text
    )
    chromium.shot("paused")
    [action] = decider.taken
    assert (action.kind, action.by.object_id, action.scope) == ("pause", "oid-dana", "zone:2")


class CookieCatcher:
    """A page on another loopback port, as any local user can serve one: it keeps the
    Cookie header the browser sends it."""

    def __init__(self) -> None:
        self.cookies: list[str] = []
        caught = self.cookies

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                caught.append(self.headers.get("Cookie", ""))
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/"


def test_a_page_on_another_loopback_port_gets_the_cookie_but_cannot_decide_with_it(
    local: PageServer, chromium: Chromium, decider: RecordingDesk
) -> None:
    catcher = CookieCatcher()
    try:
        chromium.driver.get(login_url(local))
        chromium.driver.get(catcher.url)  # the operator opens a link to another local page
        cookie = eventually(lambda: catcher.cookies, what="the other page's request")[0]
    finally:
        catcher.server.shutdown()
        catcher.server.server_close()
    assert "se_bridge_" in cookie, "browsers send 127.0.0.1's cookies to every port of it"
    # What that page's owner then does with it: read the page and its CSRF token, post a
    # pause in the operator's name.
    page = fetch(local, "GET", "/", cookie)
    csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    forged = fetch(local, "POST", "/decide", cookie,
                   f"csrf={csrf}&action=pause&reason=mine".encode())  # fmt: skip
    assert "operator token" in forged
    assert decider.taken == []


def fetch(server: PageServer, method: str, path: str, cookie: str, body: bytes = b"") -> str:
    connection = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        headers = {"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"}
        connection.request(method, path, body=body or None, headers=headers)
        return connection.getresponse().read().decode()
    finally:
        connection.close()
