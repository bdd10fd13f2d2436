"""[notify]: a target's URL read from Key Vault with the consumer's identity, by the real
azure-keyvault-secrets client from the Key Vault double; a secret that cannot be read or holds
no URL stops the start, naming the target and never quoting the secret."""

from __future__ import annotations

import pytest

from bridge.config import ConfigError, load
from bridge.notify import kinds
from tests.doubles.keyvault import KeyVaultDouble

SECRET_URL = "https://prod-01.westeurope.logic.azure.com/workflows/1/invoke?sig=c2VjcmV0LXNpZw"


def settings(vault: KeyVaultDouble, secret: str, key_vault: str | None = None) -> dict[str, str]:
    return {"SE_BRIDGE_IDENTITY_KIND": "managed",
            "SE_BRIDGE_NOTIFY_KEY_VAULT": key_vault or vault.vault_url,
            "SE_BRIDGE_NOTIFY_TARGETS": '[{"name": "ops", "kind": "slack", '
                                        f'"url_secret": "{secret}"}}]'}  # fmt: skip


def test_a_url_secret_is_read_from_key_vault_with_the_consumer_s_identity(
    key_vault: KeyVaultDouble,
) -> None:
    key_vault.put("ops-webhook", SECRET_URL)
    notifier = kinds.build(
        load(environ=settings(key_vault, "ops-webhook", key_vault.vault_url + "/"))
    )
    try:
        assert notifier.targets == ("ops",)
        seen = [(r.path, r.authorized, r.status) for r in key_vault.requests]
        assert seen == [("/secrets/ops-webhook/", False, 401), ("/secrets/ops-webhook/", True, 200)]
    finally:
        notifier.close(1)


@pytest.mark.parametrize(
    ("refused", "said"),
    [
        (True, "Key Vault Secrets User"),
        (False, "cannot read secret missing from {} (ResourceNotFound"),
    ],
)
def test_a_secret_that_cannot_be_read_stops_the_start_naming_the_target(
    key_vault: KeyVaultDouble, refused: bool, said: str
) -> None:
    key_vault.refuse = refused
    with pytest.raises(ConfigError, match=r"notify\.targets \(ops\): url_secret") as caught:
        kinds.build(load(environ=settings(key_vault, "missing")))
    assert said.format(key_vault.vault_url) in str(caught.value)
    assert key_vault.requests[-1].status == (403 if refused else 404)


def test_a_secret_that_holds_no_url_is_refused_without_quoting_it(
    key_vault: KeyVaultDouble,
) -> None:
    key_vault.put("ops-webhook", "hunter2")
    with pytest.raises(ConfigError, match="holds no http") as caught:
        kinds.build(load(environ=settings(key_vault, "ops-webhook")))
    assert "hunter2" not in str(caught.value)
