"""The approval page and its API over real HTTP: who may decide, what a forged form gets, and
that every answer carries the page's security headers."""

from __future__ import annotations

import http.client
import json
import re
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bridge import cli
from bridge.commands import signing
from bridge.config import PeopleSettings
from bridge.consumer.people import server as server_module
from bridge.consumer.people.app import CSP, MAX_BODY
from bridge.consumer.people.auth import read_token
from bridge.consumer.people.server import PageError, PageServer, build_app
from bridge.notify.notifier import event_link
from tests.doubles.entra import AUDIENCE, Tenant, serving
from tests.support.people import NOW, RecordingDesk, open_event


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> dict[str, object]:
        data = json.loads(self.body)
        assert isinstance(data, dict)
        return data

    @property
    def text(self) -> str:
        return self.body.decode()


def call(
    server: PageServer,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> Reply:
    connection = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        connection.request(method, path, body=body, headers=dict(headers or {}))
        answer = connection.getresponse()
        return Reply(answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read())
    finally:
        connection.close()


def api(server: PageServer, path: str, token: str, body: dict[str, object] | None = None) -> Reply:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    if body is None:
        return call(server, "GET", path, headers=headers)
    return call(server, "POST", path, json.dumps(body).encode(), headers)


def form(server: PageServer, fields: Mapping[str, str], headers: Mapping[str, str]) -> Reply:
    body = "&".join(f"{k}={v}" for k, v in fields.items()).encode()
    sent = {"Content-Type": "application/x-www-form-urlencoded", **headers}
    return call(server, "POST", "/decide", body, sent)


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, page
    return found.group(1)


@pytest.fixture(scope="module")
def tenant() -> Iterator[Tenant]:
    with serving(Tenant()) as served:
        yield served


@pytest.fixture
def decider() -> RecordingDesk:
    decider = RecordingDesk()
    decider.events["ev-1"] = open_event("ev-1", "db-0", "db-1", ask="db-owners until 09:10")
    return decider


@pytest.fixture
def entra(tenant: Tenant, decider: RecordingDesk, tmp_path: Path) -> Iterator[PageServer]:
    settings = PeopleSettings(
        tenant_id=tenant.tenant_id,
        audience=[AUDIENCE],
        jwks_url=tenant.jwks_url,
        page_address="127.0.0.1:0",
    )
    server = PageServer(build_app(settings, decider, tmp_path, clock=lambda: NOW), "127.0.0.1:0")
    server.start()
    yield server
    server.close()


DIGEST = open_event("ev-1", "db-0", "db-1").resources_digest


def test_a_person_with_the_role_approves_through_the_api(
    entra: PageServer, tenant: Tenant, decider: RecordingDesk
) -> None:
    token = tenant.token(oid="oid-dana", name="Dana")
    listed = api(entra, "/api/v1/events", token).json()
    assert listed["Events"] == [
        {
            "EventId": "ev-1",
            "EventType": "Reboot",
            "Vms": ["db-0", "db-1"],
            "NotBefore": "2026-11-27T09:15:00.000Z",
            "Explanation": ["rule <ask db owners>: ask db-owners until 09:10",
                            "budget zones: 1 of 2 used"],
            "Ask": "db-owners until 09:10",
            "ResourcesDigest": DIGEST,
            "Advisory": False,
        }
    ]  # fmt: skip
    reply = api(entra, "/api/v1/events/ev-1/approve", token,
                {"Reason": "failover done", "ResourcesDigest": DIGEST})  # fmt: skip
    assert (reply.status, reply.json()["Code"]) == (200, "Accepted")
    [action] = decider.taken
    assert (action.kind, action.event_id, action.by.object_id, action.by.name) == (
        "approve", "ev-1", "oid-dana", "Dana"
    )  # fmt: skip
    assert (action.reason, action.resources_digest, action.at) == ("failover done", DIGEST, NOW)


def test_an_identity_without_the_role_is_refused(
    entra: PageServer, tenant: Tenant, decider: RecordingDesk
) -> None:
    token = tenant.token(name="Eve", roles=("SeBridge.Read",))
    reply = api(entra, "/api/v1/events/ev-1/approve", token, {"ResourcesDigest": DIGEST})
    assert reply.status == 403
    assert "Eve does not have the app role SeBridge.Decide" in str(reply.json()["Detail"])
    page = call(entra, "GET", "/", headers={"X-MS-TOKEN-AAD-ID-TOKEN": token})
    assert page.status == 403
    assert decider.taken == []


def test_no_token_or_a_forged_one_is_refused(entra: PageServer, tenant: Tenant) -> None:
    assert call(entra, "GET", "/api/v1/events").status == 401
    page = call(entra, "GET", "/")
    assert page.status == 401
    assert "App Service Authentication" in page.text
    header, _, signature = tenant.token(roles=()).split(".")
    _, granted, _ = tenant.token().split(".")
    assert api(entra, "/api/v1/events", f"{header}.{granted}.{signature}").status == 401


def test_changed_resources_and_closed_events_are_refused_with_the_reason(
    entra: PageServer, tenant: Tenant, decider: RecordingDesk
) -> None:
    token = tenant.token()
    stale = api(entra, "/api/v1/events/ev-1/approve", token, {"ResourcesDigest": "0" * 16})
    assert (stale.status, stale.json()["Code"]) == (409, "ResourcesChanged")
    gone = api(entra, "/api/v1/events/ev-9/hold", token, {"ResourcesDigest": DIGEST})
    assert (gone.status, gone.json()["Code"]) == (409, "NotOpen")
    assert decider.taken == []


def test_pause_and_resume_through_the_api(
    entra: PageServer, tenant: Tenant, decider: RecordingDesk
) -> None:
    token = tenant.token()
    bad = api(entra, "/api/v1/pause", token, {"Reason": "launch", "Until": "soon"})
    assert (bad.status, bad.json()["Code"]) == (409, "BadTime")
    assert api(entra, "/api/v1/pause", token, {"Until": "2h"}).json()["Code"] == "NoReason"
    paused = api(entra, "/api/v1/pause", token, {"Reason": "launch", "Until": "2h",
                                                  "Scope": "zone:2"})  # fmt: skip
    assert paused.status == 200
    assert (decider.taken[0].scope, decider.taken[0].until) == ("zone:2", NOW + timedelta(hours=2))
    listed = api(entra, "/api/v1/events", token).json()
    assert listed["Pauses"] == [{"Scope": "zone:2", "Until": "2026-11-27T11:00:00.000Z",
                                 "By": "Dana Operator", "ByObjectId": decider.taken[0].by.object_id,
                                 "Reason": "launch", "At": "2026-11-27T09:00:00.000Z"}]  # fmt: skip
    resumed = api(entra, "/api/v1/resume", token, {"Reason": "launched", "Scope": "zone:2"})
    assert resumed.status == 200
    assert api(entra, "/api/v1/events", token).json()["Pauses"] == []


def test_the_api_takes_json_only(entra: PageServer, tenant: Tenant) -> None:
    headers = {"Authorization": f"Bearer {tenant.token()}",
               "Content-Type": "application/x-www-form-urlencoded"}  # fmt: skip
    reply = call(entra, "POST", "/api/v1/events/ev-1/approve", b"Reason=x", headers)
    assert reply.status == 415


def test_the_page_through_app_service_authentication(
    entra: PageServer, tenant: Tenant, decider: RecordingDesk
) -> None:
    signed_in = {"X-MS-TOKEN-AAD-ID-TOKEN": tenant.token(oid="oid-dana", name="Dana")}
    page = call(entra, "GET", "/", headers=signed_in)
    assert page.status == 200
    assert "Signed in as Dana" in page.text
    assert "db-0, db-1" in page.text
    fields = {"csrf": csrf_of(page.text), "action": "hold", "event": "ev-1", "digest": DIGEST}
    held = form(entra, fields, signed_in)
    assert held.status == 200
    assert "Accepted: held ev-1 by Dana" in held.text
    assert [(a.kind, a.by.name) for a in decider.taken] == [("hold", "Dana")]


def test_a_forged_or_borrowed_csrf_token_is_refused(
    entra: PageServer, tenant: Tenant, decider: RecordingDesk
) -> None:
    dana = {"X-MS-TOKEN-AAD-ID-TOKEN": tenant.token(oid="oid-dana", name="Dana")}
    eve = {"X-MS-TOKEN-AAD-ID-TOKEN": tenant.token(oid="oid-eve", name="Eve")}
    fields = {"action": "approve", "event": "ev-1", "digest": DIGEST}
    stamp = str(int(NOW.timestamp()))
    assert form(entra, {**fields, "csrf": f"{stamp}.{'0' * 64}"}, dana).status == 403
    assert form(entra, fields, dana).status == 403
    # Eve's token from her own page does not work in Dana's name.
    eves = csrf_of(call(entra, "GET", "/", headers=eve).text)
    assert form(entra, {**fields, "csrf": eves}, dana).status == 403
    assert decider.taken == []


def test_every_answer_has_the_security_headers(entra: PageServer, tenant: Tenant) -> None:
    signed_in = {"X-MS-TOKEN-AAD-ID-TOKEN": tenant.token()}
    for reply in (
        call(entra, "GET", "/", headers=signed_in),
        call(entra, "GET", "/"),
        call(entra, "GET", "/api/v1/events", headers={"Authorization": f"Bearer {tenant.token()}"}),
        call(entra, "GET", "/nowhere"),
        call(entra, "GET", "/style.css"),
    ):
        assert reply.headers["content-security-policy"] == CSP
        assert reply.headers["x-content-type-options"] == "nosniff"
        assert reply.headers["referrer-policy"] == "no-referrer"
        assert reply.headers["cache-control"] == "no-store"


def test_a_large_body_is_refused_unread(entra: PageServer, tenant: Tenant) -> None:
    headers = {"Authorization": f"Bearer {tenant.token()}", "Content-Type": "application/json"}
    reply = call(entra, "POST", "/api/v1/pause", b"{" + b" " * MAX_BODY + b"}", headers)
    assert reply.status == 413


def test_what_the_fleet_says_is_escaped(
    entra: PageServer, tenant: Tenant, decider: RecordingDesk
) -> None:
    decider.events["<b>x"] = open_event("<b>x", "<script>alert(1)</script>")
    page = call(entra, "GET", "/", headers={"X-MS-TOKEN-AAD-ID-TOKEN": tenant.token()}).text
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>x" not in page


def test_the_local_operator_signs_in_once_and_the_cli_uses_the_token(
    local: PageServer, decider: RecordingDesk, tmp_path: Path
) -> None:
    assert call(local, "GET", "/").status == 401
    sign_in = local.app.sign_in
    code = getattr(getattr(sign_in, "operator", None), "login_code", None)
    assert isinstance(code, str)
    login = call(local, "GET", f"/login?code={code}")
    assert (login.status, login.headers["location"]) == (303, "/")
    cookie = login.headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    session = {"Cookie": cookie.split(";")[0]}
    page = call(local, "GET", "/", headers=session)
    assert "for one operator on this machine" in page.text
    assert call(local, "GET", f"/login?code={code}").status == 401  # once only
    token = read_token(tmp_path)
    fields = {"csrf": csrf_of(page.text), "action": "approve", "event": "ev-1", "digest": DIGEST,
              "token": token}  # fmt: skip
    assert form(local, fields, session).status == 200
    # The API takes the token file, never the cookie.
    assert call(local, "GET", "/api/v1/events", headers=session).status == 401
    assert api(local, "/api/v1/events", token).status == 200
    assert [a.by.object_id for a in decider.taken] == [sign_in.operator.person.object_id]  # type: ignore[union-attr]


def test_the_local_page_refuses_a_non_loopback_address(
    decider: RecordingDesk, tmp_path: Path
) -> None:
    with pytest.raises(PageError, match="not a loopback address"):
        build_app(PeopleSettings(page_address="0.0.0.0:8089"), decider, tmp_path)
    assert not (tmp_path / "operator-token").exists()


def test_the_consumer_will_not_start_the_local_page_beyond_loopback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = tmp_path / "signing.pem"
    signing.keygen(key)
    monkeypatch.setenv("SE_BRIDGE_COMMANDS_SIGNING_KEY", f"file:{key}")
    args = ["consume", "--hub", str(tmp_path / "hub"), "--state-dir", str(tmp_path),
            "--commands", f"local:{tmp_path / 'cmds'}", "--page-address", "0.0.0.0:0"]  # fmt: skip
    code = cli.main(args)
    assert code == 2
    assert "is not a loopback address" in capsys.readouterr().err
    assert not (tmp_path / "operator-token").exists()


def test_a_state_that_does_not_answer_is_a_500_that_says_so(
    entra: PageServer, tenant: Tenant, decider: RecordingDesk, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(now: object) -> list[object]:
        raise TimeoutError("the fleet state did not answer")

    monkeypatch.setattr(decider, "open_events", broken)
    page = call(entra, "GET", "/", headers={"X-MS-TOKEN-AAD-ID-TOKEN": tenant.token()})
    assert page.status == 500
    assert "the fleet state did not answer" in page.text
    assert page.headers["content-security-policy"] == CSP
    listed = api(entra, "/api/v1/events", tenant.token())
    assert (listed.status, listed.json()["Code"]) == (500, "Failed")


def test_idle_clients_cannot_keep_the_operator_out(
    decider: RecordingDesk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 37: 20 idle connections left 6 of 44 pause calls answered. A whole request may
    # take two minutes here, so only the request line's own deadline, the cap per client and
    # the room kept for signed-in requests can let the calls through.
    monkeypatch.setattr(server_module, "REQUEST_DEADLINE", 120.0)
    app = build_app(PeopleSettings(page_address="127.0.0.1:0"), decider, tmp_path, lambda: NOW)
    page = PageServer(app, "127.0.0.1:0").start()
    idle = [socket.create_connection((page.host, page.port)) for _ in range(20)]
    try:
        token = read_token(tmp_path)
        for n in range(44):
            reply = api(page, "/api/v1/pause", token, {"Reason": f"call {n}", "Until": "1h"})
            assert reply.status == 200, (n, reply.text)
        assert len(decider.taken) == 44
    finally:
        for client in idle:
            client.close()
        page.close()


def test_an_events_own_address_shows_it_alone_to_a_signed_in_person(
    entra: PageServer, tenant: Tenant, decider: RecordingDesk
) -> None:
    """A notice links to `{page_url}/events/{EventId}` (bridge.notify.notifier.event_link)."""
    decider.events["ev-2"] = open_event("ev-2", "web-0")
    decider.events["<b>x"] = open_event("<b>x", "<i>vm")
    signed_in = {"X-MS-TOKEN-AAD-ID-TOKEN": tenant.token(oid="oid-dana", name="Dana")}
    assert call(entra, "GET", "/events/ev-1").status == 401
    shown = call(entra, "GET", "/events/ev-1", headers=signed_in)
    assert shown.status == 200, shown.text
    assert shown.headers["content-security-policy"] == CSP
    assert 'id="event-ev-1"' in shown.text
    assert "event-ev-2" not in shown.text
    assert 'href="/"' in shown.text  # the whole page is one link away
    fields = {"csrf": csrf_of(shown.text), "action": "approve", "event": "ev-1", "digest": DIGEST}
    assert form(entra, fields, signed_in).status == 200
    assert [(a.kind, a.event_id) for a in decider.taken] == [("approve", "ev-1")]

    odd = call(entra, "GET", "/events/%3Cb%3Ex", headers=signed_in)
    assert odd.status == 200
    assert "event-&lt;b&gt;x" in odd.text
    assert "<b>x" not in odd.text
    assert "<i>vm" not in odd.text
    gone = call(entra, "GET", "/events/ev-9", headers=signed_in)
    assert gone.status == 404
    assert "ev-9 is not open" in gone.text
    assert call(entra, "POST", "/events/ev-1", b"", signed_in).status == 405


def test_the_local_operator_signs_in_from_a_notices_link_and_lands_on_its_event(
    local: PageServer, decider: RecordingDesk
) -> None:
    code = local.app.sign_in.operator.login_code  # type: ignore[union-attr]
    asked = call(local, "GET", "/events/ev-1")
    assert asked.status == 401
    assert 'name="next" value="/events/ev-1"' in asked.text
    login = call(local, "GET", f"/login?code={code}&next=/events/ev-1")
    assert (login.status, login.headers["location"]) == (303, "/events/ev-1")
    session = {"Cookie": login.headers["set-cookie"].split(";")[0]}
    assert 'id="event-ev-1"' in call(local, "GET", "/events/ev-1", headers=session).text
    # Only a path of this page: never another site.
    for elsewhere in (
        "https://evil.example/",
        "//evil.example/x",
        "/\\evil.example",
        "/x%0d%0aSet-Cookie:%20a=b",
    ):
        token = read_token_of(local)
        body = f"token={token}&next={elsewhere}".encode()
        posted = call(local, "POST", "/login", body,
                      {"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
        assert (posted.status, posted.headers["location"]) == (303, "/")


def read_token_of(server: PageServer) -> str:
    return str(server.app.sign_in.operator.token)  # type: ignore[union-attr]


def test_a_client_that_drips_its_request_is_cut_off_at_the_deadline(
    entra: PageServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A byte every 0.2 s keeps a per-read timeout from ever firing: only a deadline for the
    # whole request frees the slot. The guard is generous; the deadline is 1 s.
    monkeypatch.setattr(server_module, "REQUEST_DEADLINE", 1.0)
    client = socket.create_connection((entra.host, entra.port))
    client.settimeout(0.2)
    guard = 30.0
    try:
        while guard > 0:
            try:
                client.send(b"G")
                if client.recv(1024) == b"":
                    return
            except TimeoutError:
                guard -= 0.2
            except OSError:  # reset by the server: cut off
                return
        pytest.fail("a client dripping its request held its slot for 30 s")
    finally:
        client.close()


def test_a_person_answers_the_ask_about_a_patch_run_through_the_api(
    entra: PageServer, tenant: Tenant, decider: RecordingDesk
) -> None:
    decider.patch_asks.add("(patch:tuesday/20261208020000)")
    token = tenant.token(oid="oid-dana", name="Dana")
    path = "/api/v1/patchruns/tuesday/20261208020000/cancel"
    assert api(entra, path, token, {"Reason": ""}).json()["Code"] == "NoReason"
    reply = api(entra, path, token, {"Reason": "the web tier patches one VM at a time"})
    assert (reply.status, reply.json()["Code"]) == (200, "Accepted")
    assert decider.patch_answers == [("(patch:tuesday/20261208020000)", "cancel", "oid-dana",
                                      "the web tier patches one VM at a time")]  # fmt: skip
    again = api(entra, path, token, {"Reason": "twice"})
    assert (again.status, again.json()["Code"]) == (409, "NotAsked")
    # Nobody without the role answers, and the answer is one of the two.
    outsider = tenant.token(oid="oid-eve", name="Eve", roles=("SeBridge.Read",))
    assert api(entra, path, outsider, {"Reason": "x"}).status == 403
    assert api(entra, "/api/v1/patchruns/tuesday/20261208020000/skip", token, {}).status == 404


def test_the_page_lists_the_patch_run_asks_and_takes_their_answers(
    entra: PageServer, tenant: Tenant, decider: RecordingDesk
) -> None:
    subject = "(patch:tuesday/20261208020000)"
    decider.ask_patch(subject)
    dana = {"X-MS-TOKEN-AAD-ID-TOKEN": tenant.token(oid="oid-dana", name="Dana")}
    shown = call(entra, "GET", "/", headers=dana)
    assert shown.status == 200
    text = shown.text
    assert "Patch runs asked about (1)" in text
    assert "maintenanceConfigurations/tuesday" in text
    assert "4 VMs" in text
    assert "budget one-at-a-time: 4 of 1" in text
    assert "2026-11-27T09:20:00.000Z" in text  # the cut-off
    assert 'value="patch_run"' in text
    assert 'value="patch_cancel"' in text
    # A form with a forged CSRF token answers nothing, as for events.
    fields = {"action": "patch_cancel", "run": subject, "reason": "one-at-a-time"}
    assert form(entra, {**fields, "csrf": "1.0"}, dana).status == 403
    assert decider.patch_answers == []
    answered = form(entra, {**fields, "csrf": csrf_of(text)}, dana)
    assert answered.status == 200, answered.text
    assert "Accepted" in answered.text
    assert decider.patch_answers == [(subject, "cancel", "oid-dana", "one-at-a-time")]
    again = form(entra, {**fields, "csrf": csrf_of(text)}, dana)
    assert again.status == 409
    assert "NotAsked" in again.text


def test_a_patch_runs_own_address_shows_its_ask_alone(
    entra: PageServer, tenant: Tenant, decider: RecordingDesk
) -> None:
    """A patch run's notice links to `{page_url}/patchruns/{configuration}/{run}`."""
    subject = "(patch:tuesday/20261208020000)"
    decider.ask_patch(subject)
    dana = {"X-MS-TOKEN-AAD-ID-TOKEN": tenant.token(oid="oid-dana", name="Dana")}
    assert call(entra, "GET", "/patchruns/tuesday/20261208020000").status == 401
    shown = call(entra, "GET", "/patchruns/tuesday/20261208020000", headers=dana)
    assert shown.status == 200, shown.text
    assert 'value="patch_cancel"' in shown.text
    assert "event-ev-1" not in shown.text
    gone = call(entra, "GET", "/patchruns/tuesday/20261201020000", headers=dana)
    assert gone.status == 404
    assert "is not asked about" in gone.text


def test_a_patch_run_notice_links_to_its_ask() -> None:
    link = event_link("https://se-bridge.example/", "(patch:tuesday/20261208020000)")
    assert link == "https://se-bridge.example/patchruns/tuesday/20261208020000"
    assert (
        event_link("https://se-bridge.example", "ev-1") == "https://se-bridge.example/events/ev-1"
    )


def test_the_listing_marks_advisories_and_lists_the_patch_run_asks(
    entra: PageServer, tenant: Tenant, decider: RecordingDesk
) -> None:
    # Before: the page showed both, the JSON listing neither (issue 40 leftover 3).
    decider.events["ev-spot"] = replace(
        open_event("ev-spot", "spot-0"), event_type="SpotRebalanceRecommendation", advisory=True
    )
    decider.ask_patch("(patch:tuesday/20261208020000)")
    listed: dict[str, Any] = api(entra, "/api/v1/events", tenant.token()).json()
    flags = {e["EventId"]: e["Advisory"] for e in listed["Events"]}
    assert flags == {"ev-1": False, "ev-spot": True}
    assert listed["PatchRuns"] == [
        {
            "Run": "(patch:tuesday/20261208020000)",
            "Configuration": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Maintenance/"
            "maintenanceConfigurations/tuesday",
            "Name": "20261208020000",
            "Vms": 4,
            "Start": "2026-11-27T09:30:00.000Z",
            "End": "2026-11-27T12:00:00.000Z",
            "CutOff": "2026-11-27T09:20:00.000Z",
            "Asked": "ops",
            "Deadline": "2026-11-27T09:16:00.000Z",
            "OnDeadline": "run",
            "Breaches": ["budget one-at-a-time: 4 of 1 VMs of scale_set web"],
            "Page": "/patchruns/tuesday/20261208020000",
        }
    ]
