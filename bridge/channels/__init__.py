"""Command channels: how an approval travels from the consumer to one VM's agent.

Each VM has its own channel (a Storage Queue named from its VmId, or a directory of
files for runs without Azure). The consumer side `send`s a Command to the VM the
command names; the agent side reads only its own channel, and deletes a message once
it has acted on it (or refused it), so a crash in between only repeats the command,
which is harmless: CommandIds are deterministic and IMDS accepts an approval twice.

The `--commands` SPEC's kinds are bridge.channels.kinds.KINDS. Failures are the
kinds of `bridge.retry`: RetryableError / ThrottledError for transient faults,
PermanentError when a person must fix something (auth, names).
"""

from __future__ import annotations

from bridge.channels.base import Channel, CommandInbox, CommandSender, Received
from bridge.channels.kinds import KINDS, check_config, check_inbox, inbox, sender
from bridge.commands.message import Command
from bridge.commands.signing import Signer

__all__ = [
    "KINDS",
    "Channel",
    "CommandInbox",
    "CommandSender",
    "Received",
    "SigningSender",
    "check_config",
    "check_inbox",
    "inbox",
    "sender",
]


class SigningSender:
    """A CommandSender that signs every command before the channel sends it."""

    def __init__(self, inner: CommandSender, signer: Signer) -> None:
        self._inner, self._signer = inner, signer

    def send(self, command: Command, time_to_live: float) -> None:
        self._inner.send(self._signer.sign(command), time_to_live)

    def close(self) -> None:
        self._inner.close()
