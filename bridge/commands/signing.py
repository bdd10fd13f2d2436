"""Ed25519 signatures on commands: the consumer signs, every agent verifies.

The consumer holds the private key (`commands.signing_key`):

    file:/etc/se-bridge/signing.pem      PEM, PKCS8, Ed25519; readable by its owner only
    keyvault:https://contoso.vault.azure.net/secrets/se-bridge-signing-key[/VERSION]
                                         a Key Vault secret whose value is that PEM

Agents hold only public keys (`commands.verify_key`): the base64 of the 32 raw bytes, or
`file:PATH` of a PEM public key; several, comma-separated, while a key is being rotated.
A compromised VM holds no private key, so it cannot make another VM approve anything.

`KeyId` is the first 8 bytes of the SHA-256 of the raw public key, in hex: a refusal
names the key a command was signed with and the keys the agent trusts, so a half-done
rotation shows itself. Ed25519 signatures are deterministic, so a resent command is the
same bytes as the first send.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import dataclasses
import hashlib
import hmac
import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.cloud import keyvault
from bridge.commands.message import Command
from bridge.config import CommandsSettings, IdentitySettings

if TYPE_CHECKING:
    # cryptography costs ~8 MB resident: it loads when a key is read, so an agent with no
    # command channel (most VMs) never holds it.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

FILE = "file:"
KEYVAULT = "keyvault:"
RAW_KEY_BYTES = 32
SECRET_NAME = "se-bridge-signing-key"  # noqa: S105 - a name: infra/main.bicep signingKeySecretName


class SigningError(ValueError):
    """A key cannot be loaded or used; the message names the setting."""


@dataclass(frozen=True)
class Refusal:
    """Why a command must not be acted on: a short code (first word of ApprovalDetail)."""

    code: str  # Unsigned | UnknownKey | BadSignature
    why: str

    def detail(self) -> str:
        return f"{self.code}: {self.why}"


def key_id(public: Ed25519PublicKey) -> str:
    return hashlib.sha256(raw_public(public)).digest()[:8].hex()


def raw_public(public: Ed25519PublicKey) -> bytes:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - see the imports

    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def verify_key_text(public: Ed25519PublicKey) -> str:
    """The `commands.verify_key` value of `public`."""
    return base64.b64encode(raw_public(public)).decode("ascii")


class Signer:
    """The consumer's end: signs each command it sends."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.key_id = key_id(private.public_key())

    def public_key(self) -> Ed25519PublicKey:
        return self._private.public_key()

    def sign(self, command: Command) -> Command:
        unsigned = dataclasses.replace(command, key_id=self.key_id, signature=None, received=None)
        signature = self._private.sign(unsigned.signed_bytes())
        return dataclasses.replace(unsigned, signature=base64.b64encode(signature).decode())

    def sign_data(self, data: bytes) -> str:
        """The base64 signature of `data`. `data` must begin with a signing context of its
        own (not message.SIGNING_CONTEXT): what is signed for another purpose (a person's
        decision, bridge.consumer.people.operatorlog) can then never pass for a command."""
        return base64.b64encode(self._private.sign(data)).decode("ascii")

    def derived_secret(self, purpose: str) -> bytes:
        """A secret for `purpose` that every holder of this key derives alike and nobody
        else can: HMAC-SHA256 keyed with the private key's 32 bytes (an HKDF extract), so the
        key itself never leaves this object. For what the consumer's instances must share
        (the approval page's CSRF key, bridge.consumer.functionapp.csrf_secret)."""
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - see the imports

        raw = self._private.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        return hmac.new(raw, f"se-bridge {purpose}".encode(), hashlib.sha256).digest()


def verifies(public: Ed25519PublicKey, data: bytes, signature: str) -> bool:
    """Whether `signature` (base64) is `public`'s signature of `data`."""
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415 - see the imports

    try:
        public.verify(base64.b64decode(signature, validate=True), data)
    except (binascii.Error, InvalidSignature, ValueError):
        return False
    return True


class Verifier:
    """An agent's end: accepts a command signed by one of the trusted keys, nothing else."""

    def __init__(self, keys: Sequence[Ed25519PublicKey]) -> None:
        if not keys:
            raise SigningError("commands.verify_key names no key")
        self._keys = {key_id(k): k for k in keys}

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    def check(self, command: Command) -> Refusal | None:
        """None when `command` carries a good signature by a trusted key; else why not."""
        trusted = ", ".join(self.key_ids)
        if command.signature is None:
            return Refusal(
                "Unsigned",
                "the command carries no Signature and this agent "
                f"accepts only commands signed by key {trusted}",
            )
        key = self._keys.get(command.key_id or "")
        if key is None:
            return Refusal(
                "UnknownKey",
                f"the command is signed with key {command.key_id}, "
                f"this agent trusts key {trusted} (commands.verify_key): a key "
                "rotation not yet done on both ends, or a forgery",
            )
        from cryptography.exceptions import InvalidSignature  # noqa: PLC0415 - see the imports

        try:
            signature = base64.b64decode(command.signature, validate=True)
            # A signature of another length is bad as it stands; verify would say so too.
            key.verify(signature, command.signed_bytes())
        except (binascii.Error, InvalidSignature):
            return Refusal(
                "BadSignature",
                f"the signature does not verify with key "
                f"{command.key_id}: the command was forged or altered on the "
                "way",
            )
        return None


# --- loading keys ---------------------------------------------------------------------------


def load_signer(settings: CommandsSettings, identity: IdentitySettings) -> Signer:
    """The Signer of `commands.signing_key`; SigningError names what is wrong."""
    spec = settings.signing_key.strip()
    if spec.lower().startswith(KEYVAULT):
        pem = _keyvault_secret(spec[len(KEYVAULT) :].strip(), identity)
        where = "the Key Vault secret"
    elif spec.lower().startswith(FILE):
        path = Path(spec[len(FILE) :].strip()).expanduser()
        pem, where = _private_file(path), str(path)
    else:
        raise SigningError(f"commands.signing_key must be file:PATH or keyvault:URL, got {spec!r}")
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - see the imports
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PrivateKey,
    )

    try:
        private = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as err:
        # The message of a key parse error never holds key material; still, say only where.
        raise SigningError(
            f"commands.signing_key: {where} is not an unencrypted PEM private "
            f"key ({type(err).__name__})"
        ) from None
    if not isinstance(private, Ed25519PrivateKey):
        raise SigningError(f"commands.signing_key: {where} is not an Ed25519 key")
    return Signer(private)


def load_verifier(settings: CommandsSettings) -> Verifier:
    """The Verifier of `commands.verify_key`; SigningError names what is wrong."""
    return Verifier([parse_public(part) for part in split_keys(settings.verify_key)])


def split_keys(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_public(text: str) -> Ed25519PublicKey:
    """One `commands.verify_key` entry: base64 of the 32 raw bytes, or file:PATH of a PEM."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - see the imports
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PublicKey,
    )

    if text.lower().startswith(FILE):
        path = Path(text[len(FILE) :].strip()).expanduser()
        try:
            public = serialization.load_pem_public_key(path.read_bytes())
        except OSError as err:
            raise SigningError(f"commands.verify_key: cannot read {path}: {err.strerror}") from err
        except ValueError as err:
            raise SigningError(f"commands.verify_key: {path} is not a PEM public key") from err
        if not isinstance(public, Ed25519PublicKey):
            raise SigningError(f"commands.verify_key: {path} is not an Ed25519 public key")
        return public
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error as err:
        raise SigningError(f"commands.verify_key: {text!r} is not base64") from err
    if len(raw) != RAW_KEY_BYTES:
        raise SigningError(
            f"commands.verify_key: {text!r} is {len(raw)} bytes, an Ed25519 public key "
            f"{RAW_KEY_BYTES} (`se-bridge keygen` prints one)"
        )
    return Ed25519PublicKey.from_public_bytes(raw)


def _private_file(path: Path) -> bytes:
    try:
        if os.name == "posix":
            mode = stat.S_IMODE(path.stat().st_mode)
            if mode & 0o077:
                raise SigningError(
                    f"commands.signing_key: {path} may be read by group or others "
                    f"(mode {mode:04o}); run: chmod 600 {path}"
                )
        return path.read_bytes()
    except OSError as err:
        raise SigningError(f"commands.signing_key: cannot read {path}: {err.strerror}") from err


def _keyvault_secret(url: str, identity: IdentitySettings) -> bytes:
    try:
        return keyvault.read_secret(url, identity).encode("utf-8")
    except keyvault.KeyVaultError as err:
        raise SigningError(f"commands.signing_key: {err}") from None


# --- keygen -----------------------------------------------------------------------------------


def keygen(path: Path) -> str:
    """Write a new private key to `path` (mode 0600, never over a file); the text to print."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - see the imports
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PrivateKey,
    )

    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags, 0o600)  # FileExistsError when it exists: never replace a key
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    public = verify_key_text(private.public_key())
    kid = key_id(private.public_key())
    return (
        f"wrote a new Ed25519 signing key (KeyId {kid}) to {path}, readable by you only;\n"
        "keep it on the consumer (or in Key Vault) and nowhere else.\n\n"
        "consumer:\n"
        f'  [commands] signing_key = "file:{path}"\n'
        f"  or SE_BRIDGE_COMMANDS_SIGNING_KEY=file:{path}\n"
        f"  in Key Vault: az keyvault secret set --vault-name VAULT --name {SECRET_NAME} "
        f"--file {path}\n"
        f'  then signing_key = "keyvault:https://VAULT.vault.azure.net/secrets/{SECRET_NAME}"\n'
        "agents:\n"
        f'  [commands] verify_key = "{public}"\n'
        f"  or SE_BRIDGE_COMMANDS_VERIFY_KEY={public}\n"
    )


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "keygen",
        help="make a key pair for signed commands; prints the agents' verify key",
        description="Write a new Ed25519 private key (PEM, mode 0600, never over an existing "
        "file) for the consumer's commands.signing_key, and print its KeyId and the public "
        "key for the agents' commands.verify_key.",
        epilog="""examples:
  se-bridge keygen --out /etc/se-bridge/signing.pem
  se-bridge keygen --out new.pem   # rotating: give agents both keys, comma-separated
""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="PATH",
        help="where the private key goes (mode 0600; never over a file)",
    )
    p.set_defaults(func=run_keygen)


def run_keygen(args: argparse.Namespace) -> int:
    try:
        print(keygen(args.out), end="")
    except FileExistsError:
        print(f"se-bridge: {args.out} exists; a key is never overwritten", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"se-bridge: cannot write {args.out}: {err.strerror}", file=sys.stderr)
        return 1
    return 0
