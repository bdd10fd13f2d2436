"""The hand-written managed-identity credential against the IMDS simulator's identity endpoint,
over real HTTP; and which credential `identity.kind = "managed"` gets where."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future

import pytest
from azure.core.credentials import AccessTokenInfo, SupportsTokenInfo, TokenCredential
from azure.core.exceptions import ClientAuthenticationError

from bridge.cloud import advice, identity, managedidentity
from bridge.cloud.managedidentity import ImdsManagedIdentity
from bridge.config import IdentitySettings
from bridge.retry import Backoff
from bridge.simulator import Simulator, SimulatorServer
from tests.doubles.httpdouble import Asked, Reply, serving
from tests.support.wait import eventually

SCOPE = "https://monitor.azure.com//.default"  # the Logs Ingestion client's, as it asks
QUICK = Backoff(initial=0.02, maximum=0.05)


def token_calls(sim: Simulator, status: int | None = None) -> int:
    counters = sim.counters().get("vm-0", {})
    return counters.get("GET token", 0) if status is None else counters.get(f"status {status}", 0)


@pytest.fixture
def credential(sim: tuple[Simulator, SimulatorServer]) -> ImdsManagedIdentity:
    return ImdsManagedIdentity(host=sim[1].vm_url("vm-0"), backoff=QUICK)


def test_a_token_comes_from_imds_once_and_is_kept_until_near_its_expiry(
    sim: tuple[Simulator, SimulatorServer], credential: ImdsManagedIdentity
) -> None:
    first = credential.get_token(SCOPE)
    assert first.token
    assert first.expires_on > 0
    info = credential.get_token_info(SCOPE)
    assert isinstance(info, AccessTokenInfo)
    assert (info.token, info.expires_on) == (first.token, first.expires_on)
    assert token_calls(sim[0]) == 1  # kept: one request for both
    # Another resource is another token.
    assert credential.get_token("https://eventhubs.azure.net/.default").token != first.token
    assert token_calls(sim[0]) == 2
    # The SDKs take it as they take azure-identity's.
    assert isinstance(credential, TokenCredential)
    assert isinstance(credential, SupportsTokenInfo)


def test_a_token_near_its_expiry_is_fetched_anew(
    sim: tuple[Simulator, SimulatorServer], credential: ImdsManagedIdentity
) -> None:
    first = credential.get_token(SCOPE)
    assert credential.get_token(SCOPE).token == first.token
    # 299 s left: under the 5 minutes a token is kept for.
    nearly = AccessTokenInfo(first.token, int(time.time()) + 299)
    credential._tokens["https://monitor.azure.com/"] = nearly
    assert credential.get_token(SCOPE).token != first.token
    assert token_calls(sim[0]) == 2


def test_a_user_assigned_identity_is_asked_for_by_its_client_id(
    sim: tuple[Simulator, SimulatorServer],
) -> None:
    who = "11111111-2222-3333-4444-555555555555"
    credential = ImdsManagedIdentity(who, host=sim[1].vm_url("vm-0"))
    credential.get_token(SCOPE)
    assert token_calls(sim[0]) == 1


def test_imds_transient_answers_are_retried_until_it_gives_a_token(
    sim: tuple[Simulator, SimulatorServer], credential: ImdsManagedIdentity
) -> None:
    simulator = sim[0]
    simulator.faults.set({"rate_410": 0.5, "rate_500": 0.25, "rate_429": 0.25}, vm="vm-0")
    simulator.faults.set({"retry_after": 0}, vm="vm-0")
    got: Future[str] = Future()
    threading.Thread(target=lambda: got.set_result(credential.get_token(SCOPE).token)).start()
    eventually(lambda: token_calls(simulator) >= 3, timeout=10, what="three faulty answers")
    assert not got.done()  # every answer so far was a fault
    simulator.faults.clear("vm-0")
    assert got.result(timeout=10)
    assert token_calls(simulator, 200) == 1


def test_no_token_within_the_deadline_is_an_error_that_says_what_to_do(
    sim: tuple[Simulator, SimulatorServer],
) -> None:
    sim[0].faults.set({"rate_503": 1}, vm="vm-0")
    credential = ImdsManagedIdentity(host=sim[1].vm_url("vm-0"), deadline=0.5, backoff=QUICK)
    with pytest.raises(ClientAuthenticationError) as info:
        credential.get_token(SCOPE)
    # What the last attempt met: a 503, or on a loaded machine the deadline cutting it short.
    assert re.search(r"gave no token within 0\.5 s \(last: (RetryableError: HTTP 503|TimeoutError)",
                     str(info.value)), str(info.value)  # fmt: skip
    assert advice.CREDENTIAL_ADVICE in str(info.value)
    assert token_calls(sim[0], 503) >= 2


def test_an_exchange_the_deadline_cuts_short_is_said_to_have_timed_out(
    sim: tuple[Simulator, SimulatorServer],
) -> None:
    """The deadline shuts the socket wherever the exchange is (sending, or waiting for the
    status line): what that breaks is reported as the deadline, not as a broken connection."""
    sim[0].faults.set({"latency": 3.0}, vm="vm-0")
    credential = ImdsManagedIdentity(host=sim[1].vm_url("vm-0"), deadline=0.5, backoff=QUICK)
    with pytest.raises(ClientAuthenticationError) as info:
        credential.get_token(SCOPE)
    assert "gave no token within 0.5 s (last: TimeoutError" in str(info.value), str(info.value)


def test_an_answer_that_never_ends_cannot_hold_the_caller_past_the_deadline(
    sim: tuple[Simulator, SimulatorServer],
) -> None:
    sim[0].faults.set({"rate_endless": 1}, vm="vm-0")
    credential = ImdsManagedIdentity(host=sim[1].vm_url("vm-0"), deadline=1.0, backoff=QUICK)
    with pytest.raises(ClientAuthenticationError, match="gave no token within 1 s"):
        credential.get_token(SCOPE)


def test_an_answer_without_a_token_is_refused_without_quoting_it(
    sim: tuple[Simulator, SimulatorServer], credential: ImdsManagedIdentity
) -> None:
    sim[0].faults.set({"rate_not_document": 1}, vm="vm-0")
    with pytest.raises(ClientAuthenticationError) as info:
        credential.get_token(SCOPE)
    assert "answered 200 without a token and its expiry" in str(info.value)
    assert advice.CREDENTIAL_ADVICE in str(info.value)


def test_an_error_answer_is_named_and_not_retried(
    sim: tuple[Simulator, SimulatorServer],
    credential: ImdsManagedIdentity,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An api-version IMDS does not know: a 400 with an error body, as "Identity not found" is.
    monkeypatch.setattr(managedidentity, "API_VERSION", "1999-01-01")
    with pytest.raises(ClientAuthenticationError, match=r"refused a token for the VM \(HTTP 400"):
        credential.get_token(SCOPE)
    assert token_calls(sim[0]) == 1


def test_no_imds_at_all_is_an_error_at_once() -> None:
    credential = ImdsManagedIdentity(host="http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(ClientAuthenticationError, match="no managed identity endpoint answers"):
        credential.get_token(SCOPE)


@pytest.mark.parametrize(
    ("environ", "ours"),
    [
        ({}, True),
        ({"AZURE_POD_IDENTITY_AUTHORITY_HOST": "http://127.0.0.1:1"}, True),
        ({"IDENTITY_ENDPOINT": "http://x", "IDENTITY_HEADER": "h"}, False),  # App Service
        ({"IDENTITY_ENDPOINT": "http://x", "IMDS_ENDPOINT": "http://y"}, False),  # Arc
        ({"MSI_ENDPOINT": "http://x"}, False),  # Cloud Shell
        ({"IDENTITY_SERVER_THUMBPRINT": "ab"}, False),  # Service Fabric
        ({"AZURE_FEDERATED_TOKEN_FILE": "/var/run/token"}, False),  # workload identity
    ],
)
def test_managed_on_a_plain_vm_is_ours_and_any_other_host_azure_identitys(
    environ: dict[str, str], ours: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (*managedidentity.OTHER_HOSTS, "IDENTITY_HEADER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    if "AZURE_FEDERATED_TOKEN_FILE" in environ:
        monkeypatch.setenv("AZURE_TENANT_ID", "t")
        monkeypatch.setenv("AZURE_CLIENT_ID", "c")
    made = identity.credential(IdentitySettings(kind="managed"))
    assert isinstance(made, ImdsManagedIdentity) is ours
    if not ours:
        from azure.identity import ManagedIdentityCredential

        assert isinstance(made, ManagedIdentityCredential)
    from azure.identity import DefaultAzureCredential

    assert isinstance(identity.credential(IdentitySettings(kind="auto")), DefaultAzureCredential)


@contextlib.contextmanager
def answering(status: int, body: bytes) -> Iterator[str]:
    """A managed-identity endpoint on loopback that answers `status` and `body` to each GET."""

    def answer(asked: Asked) -> Reply:
        return Reply(status, body, (("Content-Type", "application/json"),))

    with serving(answer, "token-endpoint") as served:
        yield served.url()


def test_an_error_answer_is_quoted_short_and_with_its_control_bytes_escaped() -> None:
    """An endpoint's error text goes into the exception (and so the log) bounded and
    printable: 60 KB with terminal escapes must not reach a person's screen as they are."""
    description = "\x1b[2J\x1b]0;pwned\x07" + "A" * 60_000 + "\r\nforged: log line"
    body = json.dumps({"error": "invalid_request", "error_description": description}).encode()
    with answering(400, body) as host:
        credential = ImdsManagedIdentity(host=host, backoff=QUICK)
        with pytest.raises(ClientAuthenticationError) as info:
            credential.get_token(SCOPE)
    said = str(info.value)
    assert "refused a token for the VM (HTTP 400, invalid_request: " in said
    assert len(said) < 1_000, len(said)
    assert not any(ch in said for ch in "\x1b\x07\r\n"), said[:200]
    assert "\\x1b[2J" in said  # escaped, not dropped: a person sees what came
    assert advice.CREDENTIAL_ADVICE in said


def test_a_token_that_claims_to_live_for_years_is_kept_a_day_at_most() -> None:
    years = int(time.time()) + 10 * 365 * 86_400
    body = json.dumps({"access_token": "t0k3n", "expires_on": str(years)}).encode()
    with answering(200, body) as host:
        credential = ImdsManagedIdentity(host=host, backoff=QUICK)
        info = credential.get_token_info(SCOPE)
        assert info.token == "t0k3n"
        assert info.expires_on <= time.time() + managedidentity.MAX_LIFETIME
        assert managedidentity.MAX_LIFETIME <= 24 * 3600
        # The kept token is the bounded one: a day later it is fetched anew.
        kept = credential._tokens["https://monitor.azure.com/"]
        assert kept.expires_on == info.expires_on
