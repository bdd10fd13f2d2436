"""Key Vault's secrets, for the code that reads one (bridge.cloud.keyvault: the consumer's
signing key, a notification target's URL): `FakeSecretClient` stands in for
azure.keyvault.secrets.SecretClient, so everything of ours runs (the secret URL's parsing, the
identity's credential, the reading and closing) without a vault.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from azure.core.exceptions import ResourceNotFoundError


class FakeSecretClient:
    """azure.keyvault.secrets.SecretClient's double: the secrets of each vault, by name.

    `read` lists (vault, name, version) per read, so a test sees what was asked and where;
    `refuse`, when set, is raised by every read (a missing role, an unreachable vault)."""

    vaults: ClassVar[dict[str, dict[str, str]]] = {}
    read: ClassVar[list[tuple[str, str, str | None]]] = []
    refuse: ClassVar[BaseException | None] = None

    def __init__(self, vault_url: str, credential: Any) -> None:
        self.vault_url = vault_url
        assert credential is not None, "Key Vault is read with the process's identity"

    def get_secret(self, name: str, version: str | None = None) -> Any:
        self.read.append((self.vault_url, name, version))
        if self.refuse is not None:
            raise self.refuse
        value = self.vaults.get(self.vault_url, {}).get(name)
        if value is None:
            raise ResourceNotFoundError(f"A secret with (name/id) {name} was not found")
        return SimpleNamespace(value=value)

    def close(self) -> None:
        """Nothing to close: no connection was opened."""


def fake_key_vault(
    monkeypatch: pytest.MonkeyPatch, vaults: dict[str, dict[str, str]]
) -> type[FakeSecretClient]:
    """Key Vault holding `vaults` ({vault URL: {secret name: value}}) for this test."""
    monkeypatch.setattr("azure.keyvault.secrets.SecretClient", FakeSecretClient)
    monkeypatch.setattr(FakeSecretClient, "vaults", vaults)
    monkeypatch.setattr(FakeSecretClient, "read", [])
    monkeypatch.setattr(FakeSecretClient, "refuse", None)
    return FakeSecretClient
