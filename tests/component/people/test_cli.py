"""`se-bridge approve|hold|pause|resume` against the approval API over real HTTP: with the
local operator's token file, and with a person's Entra ID token."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
from azure.core.credentials import AccessToken

from bridge import cli
from bridge.config import PeopleSettings
from bridge.consumer.people import client
from bridge.consumer.people.server import PageServer, build_app
from bridge.records import parse_time, utc_now
from tests.doubles.entra import AUDIENCE, Tenant, serving
from tests.support.people import NOW, RecordingDesk, open_event

EVENT = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"


@pytest.fixture
def decider() -> RecordingDesk:
    decider = RecordingDesk()
    decider.events[EVENT] = open_event(EVENT, "db-0", "db-1")
    return decider


@dataclass
class FakeCredential:
    """A person's credential as azure-identity gives it: a token for the scope asked."""

    token: str
    scopes: list[str] = field(default_factory=list)

    def get_token(self, *scopes: str) -> AccessToken:
        self.scopes.extend(scopes)
        return AccessToken(self.token, int(utc_now().timestamp()) + 3600)


@pytest.fixture
def tenant() -> Iterator[Tenant]:
    with serving(Tenant()) as served:
        yield served


@pytest.fixture
def entra(
    decider: RecordingDesk, tenant: Tenant, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PageServer]:
    settings = {"TENANT_ID": tenant.tenant_id, "AUDIENCE": AUDIENCE, "JWKS_URL": tenant.jwks_url}
    for key, value in settings.items():
        monkeypatch.setenv(f"SE_BRIDGE_CONSUMER_PEOPLE_{key}", value)
    people = PeopleSettings(tenant_id=tenant.tenant_id, audience=[AUDIENCE],
                            jwks_url=tenant.jwks_url, page_address="127.0.0.1:0")  # fmt: skip
    server = PageServer(build_app(people, decider, tmp_path, lambda: NOW), "127.0.0.1:0").start()
    yield server
    server.close()


def run(*args: str) -> int:
    return cli.main(list(args))


def test_the_local_operator_approves_with_the_token_file(
    local: PageServer,
    decider: RecordingDesk,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = run("approve", EVENT.lower(), "--api", local.url, "--state-dir", str(tmp_path),
               "--reason", "failover done")  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"Reboot {EVENT} on db-0, db-1 (NotBefore 2026-11-27T09:15:00.000Z)" in out
    assert f"Accepted: approved {EVENT}" in out
    [action] = decider.taken
    assert action.by.object_id.startswith("local:")
    assert (action.event_id, action.reason) == (EVENT, "failover done")
    assert action.resources_digest == decider.events[EVENT].resources_digest


def test_an_event_that_is_not_open_is_exit_1(
    local: PageServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("hold", "nope", "--api", local.url, "--state-dir", str(tmp_path)) == 1
    assert "event nope is not open" in capsys.readouterr().err


def test_without_the_token_file_the_local_page_is_not_reached(
    local: PageServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "elsewhere"
    assert run("hold", EVENT, "--api", local.url, "--state-dir", str(other)) == 1
    assert "cannot read the local consumer's operator token" in capsys.readouterr().err


def test_pause_and_resume_with_a_scope_and_a_time(
    local: PageServer, decider: RecordingDesk, tmp_path: Path
) -> None:
    before = utc_now()
    assert run("pause", "--api", local.url, "--state-dir", str(tmp_path), "--until", "2h",
               "--scope", "zone:2", "--reason", "incident 4711") == 0  # fmt: skip
    [pause] = decider.paused
    assert pause.scope == "zone:2"
    assert pause.until is not None
    assert before + timedelta(hours=2) <= pause.until <= utc_now() + timedelta(hours=2)
    until = "2026-12-04T18:00Z"
    assert run("pause", "--api", local.url, "--state-dir", str(tmp_path), "--until", until,
               "--reason", "launch week") == 0  # fmt: skip
    assert decider.taken[-1].until == parse_time(until)
    assert run("resume", "--api", local.url, "--state-dir", str(tmp_path), "--scope", "zone:2",
               "--reason", "closed") == 0  # fmt: skip
    assert [p.scope for p in decider.paused] == [None]


NOWHERE = ("--api", "http://127.0.0.1:9")


@pytest.mark.parametrize(
    "args",
    [
        ("pause", "--until", "2h", *NOWHERE),  # no reason
        ("pause", "--reason", "x", "--until", "soon", *NOWHERE),
        ("approve", EVENT, "--override-budget", *NOWHERE),  # an override needs a reason
        ("approve", EVENT, "--api", "file:///etc/passwd"),
        ("approve", EVENT),  # no API at all
    ],
)
def test_bad_options_are_exit_2(args: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = run(*args)
    except SystemExit as exit_:  # argparse's own usage error
        code = int(exit_.code or 0)
    assert code == 2
    assert capsys.readouterr().err


def test_an_unreachable_api_is_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "operator-token").write_text("t\n", encoding="utf-8")
    code = run("hold", EVENT, "--api", "http://127.0.0.1:9", "--state-dir", str(tmp_path))
    assert code == 1
    assert "cannot reach the approval API" in capsys.readouterr().err


def test_a_person_approves_with_their_own_entra_id_token(
    entra: PageServer,
    tenant: Tenant,
    decider: RecordingDesk,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    credential = FakeCredential(tenant.token(oid="oid-dana", name="Dana"))
    monkeypatch.setattr(client, "person_credential", lambda: credential)
    assert run("approve", EVENT, "--api", entra.url, "--override-budget", "--reason", "P1") == 0
    assert credential.scopes == [f"{AUDIENCE}/.default"]
    [action] = decider.taken
    assert (action.by.object_id, action.by.name, action.override_budget) == (
        "oid-dana",
        "Dana",
        True,
    )


def test_a_person_without_the_role_is_refused_exit_1(
    entra: PageServer,
    tenant: Tenant,
    decider: RecordingDesk,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    credential = FakeCredential(tenant.token(name="Eve", roles=()))
    monkeypatch.setattr(client, "person_credential", lambda: credential)
    assert run("hold", EVENT, "--api", entra.url) == 1
    assert "403: Eve does not have the app role SeBridge.Decide" in capsys.readouterr().err
    assert decider.taken == []


def test_the_persons_credential_is_never_a_machines() -> None:
    chain = [type(c).__name__ for c in client.person_credential().credentials]
    assert "AzureCliCredential" in chain
    for machine in ("ManagedIdentityCredential", "WorkloadIdentityCredential",
                    "EnvironmentCredential"):  # fmt: skip
        assert machine not in chain


def test_the_api_is_found_from_the_page_address_setting(
    local: PageServer,
    decider: RecordingDesk,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SE_BRIDGE_CONSUMER_PEOPLE_PAGE_ADDRESS", str(local.port))
    monkeypatch.setenv("SE_BRIDGE_CONSUMER_STATE_DIR", str(tmp_path))
    assert run("pause", "--reason", "launch week") == 0
    assert [(p.scope, p.until, p.reason) for p in decider.paused] == [(None, None, "launch week")]
