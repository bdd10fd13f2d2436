"""Command channels: how an approval travels from the consumer to one VM's agent.

Each VM has its own channel (a Storage Queue named from its VmId, or a directory of
files for runs without Azure). The consumer side `send`s a Command to the VM the
command names; the agent side reads only its own channel, and deletes a message once
it has acted on it (or refused it), so a crash in between only repeats the command,
which is harmless: CommandIds are deterministic and IMDS accepts an approval twice.

The `--commands` SPEC grammar and its check live here, with the kinds. Failures are the
kinds of `bridge.retry`: RetryableError / ThrottledError for transient faults,
PermanentError when a person must fix something (auth, names).
"""

from __future__ import annotations

from pathlib import Path

from bridge import specs
from bridge.channels import local
from bridge.channels.base import CommandInbox, CommandSender, Received
from bridge.channels.local import LocalInbox, LocalSender
from bridge.channels.storagequeue import StorageQueueInbox, StorageQueueSender
from bridge.commands.message import Command
from bridge.commands.signing import Signer
from bridge.config import Config, ConfigError

__all__ = ["CommandInbox", "CommandSender", "Received", "SigningSender", "check_config",
           "check_inbox", "inbox", "parse_spec", "sender"]  # fmt: skip


def parse_spec(spec: str) -> tuple[str, str]:
    """Split `local:DIR` / `storagequeue` into (kind, argument); ValueError names what is wrong."""
    return specs.split(
        spec, "command channel", {"local": "/var/lib/se-bridge/commands", "storagequeue": None}
    )


def sender(spec: str, config: Config) -> CommandSender:
    """The consumer's end of the channels a `commands.channel` SPEC names."""
    kind, arg = parse_spec(spec)
    if kind == "local":
        return LocalSender(Path(arg))
    return StorageQueueSender(config)


def inbox(spec: str, config: Config, vm_id: str) -> CommandInbox:
    """The channel of `vm_id` as its agent reads it; ValueError names a bad setting."""
    kind, arg = parse_spec(spec)
    timeout = config.commands.visibility_timeout
    if kind == "local":
        return LocalInbox(Path(arg), vm_id, timeout)
    return StorageQueueInbox(config, vm_id, timeout)


def check_inbox(spec: str) -> None:
    """ValueError unless the agent may read the channel `spec` names: a local directory must be
    the agent's own (bridge.channels.local.check_directory); a queue has nothing to check."""
    kind, arg = parse_spec(spec)
    if kind == "local":
        local.check_directory(Path(arg))


def check_config(config: Config) -> None:
    """ConfigError naming the setting unless commands.channel's SPEC parses and, secure by
    default, a key signs or verifies what it carries (or unsigned is asked for by name).

    Whether the key itself can be loaded is checked where it is used (the listener, the
    consumer's signer), which also stops the process at start with exit 2.
    """
    settings = config.commands
    if not settings.channel:
        return
    try:
        parse_spec(settings.channel)
    except ValueError as err:
        raise ConfigError(f"commands.channel: {err}") from err
    if not (settings.verify_key or settings.signing_key or settings.allow_unsigned):
        raise ConfigError(
            "commands.channel is set but no key is: agents need commands.verify_key "
            "(SE_BRIDGE_COMMANDS_VERIFY_KEY), the consumer commands.signing_key "
            "(SE_BRIDGE_COMMANDS_SIGNING_KEY); `se-bridge keygen --out FILE` makes a pair. "
            "commands.allow_unsigned = true accepts unsigned commands (not for production)"
        )


class SigningSender:
    """A CommandSender that signs every command before the channel sends it."""

    def __init__(self, inner: CommandSender, signer: Signer) -> None:
        self._inner, self._signer = inner, signer

    def send(self, command: Command, time_to_live: float) -> None:
        self._inner.send(self._signer.sign(command), time_to_live)

    def close(self) -> None:
        self._inner.close()
