"""What every sink is: the record as the spool hands it over, and the Sink protocol.

A sink is handed batches in spool order and either returns (every record of the batch
is accepted and may be acknowledged) or raises one of the failure kinds of
`bridge.retry`: RetryableError / ThrottledError (the same batch comes back after a
backoff), PoisonRecords (those records are set aside, the rest retried), or
PermanentError (a person must fix something; retried slowly and logged at ERROR).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class SpooledRecord:
    """A record as the spool holds it: its sequence number and its JSON text."""

    seq: int
    record_id: str
    record_type: str
    body: str


class Sink(Protocol):
    @property
    def name(self) -> str:
        """Unique, stable name; the spool keeps this sink's progress under it."""

    @property
    def max_batch(self) -> int:
        """Most records one `send` may be handed."""

    def send(self, batch: Sequence[SpooledRecord]) -> None:
        """Deliver every record of `batch`, in order, or raise a bridge.retry failure."""

    def close(self) -> None:
        """Release files and connections; called once at shutdown.

        A sink may also have `idle() -> float | None`: called by the delivery loop whenever
        it finds nothing to send, to let go of what it need not hold while idle (a
        connection). It returns the seconds after which it wants to be called again (still
        holding something), or None; the loop looks again then, or when records arrive.

        And `send_interval: float` with `can_wait(record) -> bool`: after a send, a batch
        whose every record can wait is held until `send_interval` seconds have passed, so
        that it goes in one request with whatever comes meanwhile; a record that cannot
        wait, or a flush, sends at once (Log Analytics: a per-rule request quota)."""


def check(sink: Sink) -> str:
    """A harmless real round trip to `sink`: what worked, or a bridge.retry failure with advice."""
    probe = getattr(sink, "check", None)
    if probe is None:
        return "no check for this sink"
    result: str = probe()
    return result
