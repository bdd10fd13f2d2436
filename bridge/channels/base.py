"""What every command channel is: a received message, and the two ends (sender, inbox)."""

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
