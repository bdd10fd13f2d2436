"""The Key Vault double, driven by the real azure-keyvault-secrets SecretClient over TLS that the
client really verifies, with its challenge-based authentication running as against Azure."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from azure.core.credentials import AccessToken
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError, ServiceRequestError
from azure.keyvault.secrets import SecretClient

from tests.doubles.keyvault import TENANT, KeyVaultDouble


class Credential:
    """azure-core's credential protocol (get_token), counting what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[tuple[str, ...], Any]] = []

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.asked.append((scopes, kwargs.get("tenant_id")))
        return AccessToken("t0k3n", int(time.time()) + 3600)


@pytest.fixture
def vault(monkeypatch: pytest.MonkeyPatch) -> Iterator[KeyVaultDouble]:
    with KeyVaultDouble({"ops-webhook": "https://hooks.example/1"}) as double:
        double.reachable(monkeypatch)
        yield double


def client(vault: KeyVaultDouble, credential: Credential) -> SecretClient:
    return SecretClient(vault.vault_url, credential)


def test_the_client_is_challenged_then_reads_with_a_token_for_the_vault(
    vault: KeyVaultDouble,
) -> None:
    credential = Credential()
    with client(vault, credential) as secrets:
        secret = secrets.get_secret("ops-webhook")
        assert secret.value == "https://hooks.example/1"
        assert secret.id == f"{vault.vault_url}/secrets/ops-webhook/{secret.properties.version}"
        assert secrets.get_secret("ops-webhook").value == "https://hooks.example/1"
    assert credential.asked == [(("https://vault.azure.net/.default",), TENANT)]
    seen = [(r.path, r.authorized, r.status) for r in vault.requests]
    assert seen == [
        # The client asks for the current version with an empty one: the trailing slash.
        ("/secrets/ops-webhook/", False, 401),
        ("/secrets/ops-webhook/", True, 200),
        ("/secrets/ops-webhook/", True, 200),  # the challenge is remembered
    ]
    assert all(r.api_version for r in vault.requests)


def test_a_version_is_read_as_asked_and_the_newest_by_default(vault: KeyVaultDouble) -> None:
    first = vault.put("key", "one")
    vault.put("key", "two")
    with client(vault, Credential()) as secrets:
        assert secrets.get_secret("key", first).value == "one"
        assert secrets.get_secret("key").value == "two"
    assert vault.requests[-2].path == f"/secrets/key/{first}"


@pytest.mark.parametrize("version", [None, "0" * 32])
def test_an_unknown_secret_is_key_vault_s_404(vault: KeyVaultDouble, version: str | None) -> None:
    with client(vault, Credential()) as secrets, pytest.raises(ResourceNotFoundError) as caught:
        secrets.get_secret("ops-webhook" if version else "missing", version)
    assert caught.value.error is not None
    assert caught.value.error.code == "SecretNotFound"
    path = f"/secrets/ops-webhook/{version}" if version else "/secrets/missing/"
    assert [(r.method, r.path, r.authorized, r.status) for r in vault.requests[1:]] == [
        ("GET", path, True, 404)
    ]


def test_a_refused_read_is_a_403_after_the_challenge(vault: KeyVaultDouble) -> None:
    vault.refuse = True
    with client(vault, Credential()) as secrets, pytest.raises(HttpResponseError) as caught:
        secrets.get_secret("ops-webhook")
    assert caught.value.status_code == 403
    assert caught.value.error is not None
    assert caught.value.error.code == "Forbidden"
    assert [(r.authorized, r.status) for r in vault.requests] == [(False, 401), (True, 403)]


def test_the_vault_is_untrusted_without_its_ca(
    vault: KeyVaultDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    # No retries: the SDK's three, 0.8 s apart and growing, would each meet the same refusal.
    untrusting = SecretClient(vault.vault_url, Credential(), retry_total=0)
    with untrusting as secrets, pytest.raises(ServiceRequestError, match="SSL"):
        secrets.get_secret("ops-webhook")
    assert vault.requests == []


def test_the_proxy_tunnels_to_the_vault_only(vault: KeyVaultDouble) -> None:
    proxies = {"https": vault.proxy_url}
    with pytest.raises(requests.exceptions.ProxyError, match="403"):
        requests.get("https://example.com/", proxies=proxies, timeout=10)
    assert vault.requests == []
