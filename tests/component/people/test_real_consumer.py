"""The approval page and the CLI over the real consumer (issue 29, after the merge of the
people desk's operate/open_events/pauses): a person asked about an event approves it through the
CLI, another holds one through the page's form; the command goes out and the audit names them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from bridge import cli
from bridge.config import PeopleSettings
from bridge.consumer.people.auth import read_token
from bridge.consumer.people.server import PageServer, build_app
from bridge.notify import formats
from bridge.notify.notifier import Delivery, Notifier, Target
from tests.component.consumer.test_core import E1, E2
from tests.component.consumer.test_people import People, asking
from tests.component.people.test_api import call, csrf_of, form
from tests.doubles.webhook import WebhookReceiver
from tests.support.wait import eventually


@pytest.fixture
def people(tmp_path: Path) -> Iterator[People]:
    rig = People(tmp_path / "fleet.db", asking())
    yield rig
    rig.store.close()


@pytest.fixture
def served(people: People, tmp_path: Path) -> Iterator[PageServer]:
    settings = PeopleSettings(page_address="127.0.0.1:0")
    app = build_app(settings, people.consumer.desk, tmp_path, lambda: people.fleet.now)
    server = PageServer(app, "127.0.0.1:0").start()
    yield server
    server.close()


def test_the_cli_and_the_page_decide_on_the_real_consumer(
    people: People, served: PageServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    people.event("db_0", E1)
    people.event("web_0", E2)
    code = cli.main(["approve", E1, "--api", served.url, "--state-dir", str(tmp_path),
                     "--reason", "failover done"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert people.approved() == [E1]
    approved = people.last(E1)
    assert (approved["DecisionAction"], approved["OperatorReason"]) == ("Approve", "failover done")
    assert str(approved["DecidedBy"]).startswith("local:")

    sign_in: Any = served.app.sign_in
    login = call(served, "GET", f"/login?code={sign_in.operator.login_code}")
    session = {"Cookie": login.headers["set-cookie"].split(";")[0]}
    page = call(served, "GET", "/", headers=session).text
    assert f"event-{E2}" in page
    digest = re.search(rf'id="event-{E2}".*?name="digest" value="([0-9a-f]+)"', page, re.S)
    assert digest is not None
    fields = {"csrf": csrf_of(page), "action": "hold", "event": E2, "digest": digest.group(1),
              "reason": "release", "token": read_token(tmp_path)}  # fmt: skip
    held = form(served, fields, session)
    assert held.status == 200, held.text
    assert people.last(E2)["DecisionAction"] == "Hold"
    assert people.approved() == [E1]


def test_the_link_a_notice_carries_opens_its_event_on_the_page(
    people: People, served: PageServer
) -> None:
    with WebhookReceiver() as receiver:
        # The page's address is known once it listens: the consumer's notifier is the real
        # one, posting to a webhook with links to this page.
        target = Target("dba", formats.generic, receiver.url("/dba"))
        people.consumer.dispatch.notifier = Notifier([target], Delivery(page_url=served.url))
        people.event("db_0", E1)
        people.event("web_0", E2)
        asked = eventually(lambda: [b for b in receiver.bodies("/dba") if b["EventId"] == E1],
                           what="the ask's notice")  # fmt: skip
        link = urlsplit(asked[0]["Link"])
        assert f"{link.scheme}://{link.netloc}" == served.url

        sign_in: Any = served.app.sign_in
        login = call(served, "GET", f"/login?code={sign_in.operator.login_code}")
        session = {"Cookie": login.headers["set-cookie"].split(";")[0]}
        assert call(served, "GET", link.path).status == 401
        shown = call(served, "GET", link.path, headers=session)
        assert shown.status == 200, shown.text
        assert f'id="event-{E1}"' in shown.text
        assert f"event-{E2}" not in shown.text
        people.consumer.close()
