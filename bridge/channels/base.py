"""What every command channel is: a received message, the two ends (sender, inbox), and the
channel that makes them (what a `commands.channel` SPEC's kind builds)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from bridge.commands.message import Command


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


class Channel(Protocol):
    """One kind of channel with its settings: both of its ends, made on demand."""

    def sender(self) -> CommandSender:
        """The consumer's end; ValueError naming a setting that makes it unusable."""

    def inbox(self, vm_id: str) -> CommandInbox:
        """The agent's end for `vm_id`; ValueError naming a setting that makes it unusable."""

    def check_inbox(self) -> None:
        """ValueError unless an agent may read its inbox here (checked when the agent starts)."""
