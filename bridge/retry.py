"""The three kinds of failure and the one backoff every retry loop in se-bridge uses.

Every edge that talks to something outside the process (IMDS, sinks, hooks) maps
its errors onto these kinds, so a single loop decides what to do:

- PermanentError: retrying the same request cannot help (bad request, auth, schema).
- RetryableError: a transient fault (connection reset, 5xx, 410 from IMDS).
- ThrottledError: the far side asked us to slow down, optionally saying for how long.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


class DeliveryError(Exception):
    """Base class of the failures an edge reports to its retry loop."""


class PermanentError(DeliveryError):
    """Retrying the same request will not help; a person must act."""


class RetryableError(DeliveryError):
    """A transient failure: retry after a backoff."""


class ThrottledError(RetryableError):
    """The far side throttled us; `retry_after` (seconds) is its hint, if it gave one."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header; None when absent or not a delay in seconds."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


@dataclass
class Backoff:
    """Exponential backoff with full jitter, capped, and reset on success.

    `rng` is injectable so tests can check the bounds without sleeping.
    """

    initial: float = 0.5
    maximum: float = 60.0
    multiplier: float = 2.0
    rng: random.Random = field(default_factory=random.Random)
    attempts: int = 0

    def next_delay(self, retry_after: float | None = None) -> float:
        """The wait before the next attempt; never shorter than the server's Retry-After."""
        ceiling = min(self.maximum, self.initial * self.multiplier**self.attempts)
        self.attempts += 1
        # Full jitter spreads a fleet's retries so thousands of VMs do not retry in step.
        delay = self.rng.uniform(ceiling / 2, ceiling)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.maximum))
        return delay

    def delay_for(self, error: BaseException) -> float:
        """The wait after `error`, honouring a ThrottledError's Retry-After."""
        retry_after = error.retry_after if isinstance(error, ThrottledError) else None
        return self.next_delay(retry_after)

    def reset(self) -> None:
        self.attempts = 0


class PoisonRecords(PermanentError):
    """Some records of a batch can never be accepted by this sink (for example a schema rejection).

    `seqs` names them by spool sequence number; the delivery loop sets them aside in the
    spool's dead-letter table with `reason` and goes on with the rest, so one bad record
    never blocks a sink and nothing is lost.
    """

    def __init__(self, message: str, seqs: list[int]) -> None:
        super().__init__(message)
        self.seqs = seqs
