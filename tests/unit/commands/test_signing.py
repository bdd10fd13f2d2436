"""Keys, signatures and their refusals (bridge.commands.signing), without an agent."""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bridge.agent.command import load_config
from bridge.agent.listener import verifier_for
from bridge.commands import message as commands
from bridge.commands import signing
from bridge.config import CommandsSettings, ConfigError, IdentitySettings, load

NOW = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)


VM_ID = "0000000a-0000-4000-8000-000000000001"


def a_command(reason: str = "User-initiated Reboot: approve at once") -> commands.Command:
    later = NOW + timedelta(minutes=5)
    return commands.approve(vm_id=VM_ID, event_id="E1", document_incarnation=3, issued_at=NOW,
                            expires_at=later, rule="r", reason=reason)  # fmt: skip


def test_a_signed_command_survives_the_wire_and_a_resend_is_the_same_bytes() -> None:
    signer = signing.Signer(Ed25519PrivateKey.generate())
    text = signer.sign(a_command("Réboot ✓")).to_json()
    assert signer.sign(a_command("Réboot ✓")).to_json() == text  # Ed25519 is deterministic
    verifier = signing.Verifier([signer.public_key()])
    assert verifier.check(commands.parse(text)) is None


def test_every_field_is_covered() -> None:
    signer = signing.Signer(Ed25519PrivateKey.generate())
    verifier = signing.Verifier([signer.public_key()])
    text = signer.sign(a_command()).to_json()
    for old, new in [
        ('"0000000a-0000-4000-8000-000000000001"', '"0000000a-0000-4000-8000-000000000002"'),
        ('"E1"', '"E2"'),
        ('"r"', '"s"'),
        ("3,", "4,"),
    ]:
        refusal = verifier.check(commands.parse(text.replace(old, new, 1)))
        assert refusal is not None
        assert refusal.code == "BadSignature"


def test_rotation_trusts_every_listed_key(tmp_path: Path) -> None:
    old, new = (signing.Signer(Ed25519PrivateKey.generate()) for _ in range(2))
    both = ",".join(signing.verify_key_text(s.public_key()) for s in (old, new))
    verifier = signing.load_verifier(CommandsSettings(verify_key=both))
    assert verifier.key_ids == sorted([old.key_id, new.key_id])
    for signer in (old, new):
        assert verifier.check(commands.parse(signer.sign(a_command()).to_json())) is None


def test_keygen_writes_a_private_file_and_prints_the_settings(tmp_path: Path) -> None:
    path = tmp_path / "k.pem"
    text = signing.keygen(path)
    if os.name == "posix":
        assert path.stat().st_mode & 0o777 == 0o600
    signer = signing.load_signer(CommandsSettings(signing_key=f"file:{path}"), IdentitySettings())
    assert signing.verify_key_text(signer.public_key()) in text
    assert signer.key_id in text
    with pytest.raises(FileExistsError):
        signing.keygen(path)


def test_keygen_names_the_key_vault_secret_infra_creates(tmp_path: Path) -> None:
    bicep = (Path(__file__).parents[3] / "infra" / "main.bicep").read_text(encoding="utf-8")
    [secret] = re.findall(r"param signingKeySecretName string = '([^']+)'", bicep)
    text = signing.keygen(tmp_path / "k.pem")
    assert f"--name {secret} " in text
    assert f'/secrets/{secret}"' in text


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "k.pem"
    signing.keygen(path)
    path.chmod(0o640)
    with pytest.raises(signing.SigningError, match="chmod 600"):
        signing.load_signer(CommandsSettings(signing_key=f"file:{path}"), IdentitySettings())


@pytest.mark.parametrize(
    ("verify_key", "message"),
    [("not base64!", "not base64"), ("AAAA", "3 bytes"), ("file:/nonexistent.pem", "cannot read")],
)
def test_a_bad_verify_key_stops_the_start(verify_key: str, message: str) -> None:
    config = load(environ={}, flags={"commands.verify_key": verify_key})
    with pytest.raises(ConfigError, match=message):
        verifier_for(config)  # where the listener is built, before the agent runs


def test_a_channel_without_a_key_needs_allow_unsigned() -> None:
    with pytest.raises(ConfigError, match=r"commands\.verify_key.*commands\.signing_key"):
        load_config(environ={"SE_BRIDGE_COMMANDS_CHANNEL": "storagequeue"})
    env = {"SE_BRIDGE_COMMANDS_CHANNEL": "storagequeue", "SE_BRIDGE_COMMANDS_ALLOW_UNSIGNED": "1"}
    assert load_config(environ=env).commands.allow_unsigned
    with pytest.raises(ConfigError, match="true or false"):
        load_config(environ={**env, "SE_BRIDGE_COMMANDS_ALLOW_UNSIGNED": "maybe"})


@pytest.mark.slow
def test_a_bad_key_vault_url_names_the_setting() -> None:
    settings = CommandsSettings(signing_key="keyvault:https://v.vault.azure.net/keys/x")
    with pytest.raises(signing.SigningError, match=r"commands\.signing_key"):
        signing.load_signer(settings, IdentitySettings())
