"""What the consumer needs of bridge.notify's notifier (the asks, their time outs, people's
decisions and pauses are told through it)."""

from __future__ import annotations

from typing import Protocol

from bridge.notify.notice import Notice

EVERY_TARGET = "*"  # a notice for every target (a pause, a person's decision on no ask)


class NoticeQueue(Protocol):
    """Where the consumer hands its notices: `notify` queues one and never blocks; `close`
    gives what is queued up to `timeout` seconds to go out."""

    @property
    def targets(self) -> tuple[str, ...]: ...

    def notify(self, notice: Notice) -> None: ...

    def failing(self) -> tuple[str, ...]: ...

    def close(self, timeout: float) -> None: ...
