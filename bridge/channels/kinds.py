"""The kinds of command channel a `commands.channel` SPEC may name, and their settings: the one
module of bridge.channels that reads the configuration. A new kind is a module with its
Channel (bridge.channels.base) and one line in KINDS.
"""

from __future__ import annotations

from pathlib import Path

from bridge.channels.base import Channel, CommandInbox, CommandSender
from bridge.channels.local import LocalChannel
from bridge.channels.storagequeue import StorageQueueChannel
from bridge.config import Config, ConfigError
from bridge.specs import Kind, Kinds


def _local(argument: str, config: Config) -> Channel:
    return LocalChannel(Path(argument), config.commands.visibility_timeout)


def _storagequeue(argument: str, config: Config) -> Channel:
    c = config.commands
    return StorageQueueChannel(
        config.storage, config.identity, c.queue_prefix, c.queue_accounts, c.visibility_timeout
    )


KINDS: Kinds[Channel] = Kinds(
    "command channel",
    Kind("local", "/var/lib/se-bridge/commands", _local, argument="directory"),
    Kind("storagequeue", None, _storagequeue),
)


def sender(spec: str, config: Config) -> CommandSender:
    """The consumer's end of the channels a `commands.channel` SPEC names."""
    return KINDS.build(spec, config).sender()


def inbox(spec: str, config: Config, vm_id: str) -> CommandInbox:
    """The channel of `vm_id` as its agent reads it; ValueError names a bad setting."""
    return KINDS.build(spec, config).inbox(vm_id)


def check_inbox(spec: str, config: Config | None = None) -> None:
    """ValueError unless the agent may read the channel `spec` names: a local directory must be
    the agent's own (bridge.channels.local.check_directory); a queue has nothing to check.
    No setting of today's kinds changes what is checked: `config` may be left out."""
    KINDS.build(spec, config or Config()).check_inbox()


def check_config(config: Config) -> None:
    """ConfigError naming the setting unless commands.channel's SPEC parses and, secure by
    default, a key signs or verifies what it carries (or unsigned is asked for by name).

    Whether the key itself can be loaded is checked where it is used (the listener, the
    consumer's signer), which also stops the process at start with exit 2.
    """
    settings = config.commands
    if not settings.channel:
        return
    KINDS.check(settings.channel, config, "commands.channel")
    if not (settings.verify_key or settings.signing_key or settings.allow_unsigned):
        raise ConfigError(
            "commands.channel is set but no key is: agents need commands.verify_key "
            "(SE_BRIDGE_COMMANDS_VERIFY_KEY), the consumer commands.signing_key "
            "(SE_BRIDGE_COMMANDS_SIGNING_KEY); `se-bridge keygen --out FILE` makes a pair. "
            "commands.allow_unsigned = true accepts unsigned commands (not for production)"
        )
