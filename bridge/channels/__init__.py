"""Command channels: how an approval travels from the consumer to one VM's agent.

Each VM has its own channel (a Storage Queue named from its VmId, or a directory of
files for runs without Azure). The consumer side `send`s a Command to the VM the
command names; the agent side reads only its own channel, and deletes a message once
it has acted on it (or refused it), so a crash in between only repeats the command,
which is harmless: CommandIds are deterministic and IMDS accepts an approval twice.

Failures are the kinds of `bridge.retry`: RetryableError / ThrottledError for
transient faults, PermanentError when a person must fix something (auth, names).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from bridge import specs

if TYPE_CHECKING:
    from bridge.commands.message import Command
    from bridge.config import Config


@dataclass(frozen=True)
class Received:
    """One message read from an inbox: its raw text (not yet trusted) and a delete handle."""

    text: str
    handle: object
    dequeue_count: int = 1


class CommandSender(Protocol):
    """The consumer's end: deliver to the channel of `command.vm_id`."""

    def send(self, command: Command, time_to_live: float) -> None:
        """Enqueue `command`; it vanishes unread after `time_to_live` seconds."""

    def close(self) -> None: ...


class CommandInbox(Protocol):
    """One agent's end: its own channel only."""

    def receive(self, max_messages: int) -> list[Received]:
        """Up to `max_messages` messages, hidden from other reads for a while; [] when none."""

    def delete(self, message: Received) -> None:
        """Remove a message for good (acted on, refused, or expired)."""

    def close(self) -> None: ...


def parse_spec(spec: str) -> tuple[str, str]:
    """Split `local:DIR` / `storagequeue` into (kind, argument); ValueError names what is wrong."""
    return specs.split(
        spec, "command channel", {"local": "/var/lib/se-bridge/commands", "storagequeue": None}
    )


def sender(spec: str, config: Config) -> CommandSender:
    """The consumer's end of the channels a `commands.channel` SPEC names."""
    kind, arg = parse_spec(spec)
    # Each kind is imported only when configured, so the Storage SDK loads only if used.
    if kind == "local":
        from bridge.channels.local import LocalSender  # noqa: PLC0415

        return LocalSender(Path(arg))
    from bridge.channels.storagequeue import StorageQueueSender  # noqa: PLC0415

    return StorageQueueSender(config)


def inbox(spec: str, config: Config, vm_id: str) -> CommandInbox:
    """The channel of `vm_id` as its agent reads it; ValueError names a bad setting."""
    kind, arg = parse_spec(spec)
    timeout = config.commands.visibility_timeout
    if kind == "local":
        from bridge.channels.local import LocalInbox  # noqa: PLC0415

        return LocalInbox(Path(arg), vm_id, timeout)
    from bridge.channels.storagequeue import StorageQueueInbox  # noqa: PLC0415

    return StorageQueueInbox(config, vm_id, timeout)
