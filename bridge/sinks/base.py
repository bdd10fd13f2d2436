"""What every sink is: the record as the spool hands it over, and the Sink protocol.

A sink is handed batches in spool order and either returns (every record of the batch
is accepted and may be acknowledged) or raises one of the failure kinds of
`bridge.retry`: RetryableError / ThrottledError (the same batch comes back after a
backoff), PoisonRecords (those records are set aside, the rest retried), or
PermanentError (a person must fix something; retried slowly and logged at ERROR).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bridge.retry import PermanentError


@dataclass(frozen=True)
class SpooledRecord:
    """A record as the spool holds it: its sequence number and its JSON text."""

    seq: int
    record_id: str
    record_type: str
    body: str


class Sink(Protocol):
    """What a sink is and may do; BaseSink gives what a sink has no use for."""

    @property
    def name(self) -> str:
        """Unique, stable name; the spool keeps this sink's progress under it."""

    @property
    def max_batch(self) -> int:
        """Most records one `send` may be handed."""

    def send(self, batch: Sequence[SpooledRecord]) -> None:
        """Deliver every record of `batch`, in order, or raise a bridge.retry failure."""

    def check(self) -> str:
        """A harmless real round trip (`se-bridge check`): what worked, or a bridge.retry
        failure with advice."""

    @property
    def send_interval(self) -> float:
        """Pacing: after a send, a batch whose every record `can_wait` is held until this many
        seconds have passed, so that it goes in one request with whatever comes meanwhile; a
        record that cannot wait, or a flush, sends at once (Log Analytics: a per-rule request
        quota). 0: nothing is held."""

    def can_wait(self, record: SpooledRecord) -> bool:
        """Whether `record` may be held for the next send (see `send_interval`)."""

    def idle(self) -> float | None:
        """Idling: called by the delivery loop whenever it finds nothing to send, to let go of
        what the sink need not hold while idle (a connection). Returns the seconds after which
        it wants to be called again (still holding something), or None; the loop looks again
        then, or when records arrive."""

    def close(self) -> None:
        """Release files and connections; called once at shutdown."""


class BaseSink:
    """A sink that sends at once, holds nothing while idle and has no check: a sink class
    inherits what it has no use for and overrides the rest."""

    send_interval = 0.0

    def can_wait(self, record: SpooledRecord) -> bool:
        return False

    def idle(self) -> float | None:
        return None

    def check(self) -> str:
        return "no check for this sink"

    def close(self) -> None:
        """Nothing to release."""


def could_write(path: Path) -> str:
    """Whether a send could append to the file `path`, creating it and its directories, found
    without writing anything (`se-bridge check` changes nothing): what it found, or a
    PermanentError saying why not. As the user running it: root may write where the agent's
    own user may not."""
    if path.is_dir():
        raise PermanentError(f"cannot append to {path}: it is a directory")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise PermanentError(f"cannot append to {path}: permission denied")
        return f"{path} can be appended to"
    missing = path
    while not missing.parent.exists() and missing.parent != missing:
        missing = missing.parent
    folder = missing.parent
    if not folder.is_dir():
        raise PermanentError(f"cannot create {path}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermanentError(f"cannot create {path}: permission denied in {folder}")
    return f"{missing} does not exist yet; the first send creates it"
