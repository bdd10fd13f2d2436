"""The consumer's signing key read from Key Vault (bridge.commands.signing) by the real
azure-keyvault-secrets client from the Key Vault double, with the managed identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.commands import signing
from bridge.config import CommandsSettings, IdentitySettings
from tests.doubles.keyvault import KeyVaultDouble


def test_the_signing_key_is_read_from_key_vault(tmp_path: Path, key_vault: KeyVaultDouble) -> None:
    path = tmp_path / "k.pem"
    signing.keygen(path)
    key_vault.put("key", path.read_text(encoding="utf-8"), "v2")
    key_vault.put("key", "not this version")
    who = IdentitySettings(kind="managed")
    from_file = signing.load_signer(CommandsSettings(signing_key=f"file:{path}"), who)
    settings = CommandsSettings(signing_key=f"keyvault:{key_vault.vault_url}/secrets/key/v2")
    assert signing.load_signer(settings, who).key_id == from_file.key_id
    assert [r.path for r in key_vault.requests if r.status == 200] == ["/secrets/key/v2"]
    key_vault.refuse = True
    with pytest.raises(signing.SigningError, match=r"signing_key: cannot read secret key from"):
        signing.load_signer(settings, who)
