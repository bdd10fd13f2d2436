"""The kinds of failure, the one backoff every retry loop in se-bridge uses, and the one way a
loop tells a person about a run of failures.

Every edge that talks to something outside the process (IMDS, sinks, channels, state
stores) maps its errors onto three kinds, all DeliveryErrors, so a single loop decides what
to do:

- PermanentError: retrying the same request cannot help (bad request, auth, schema);
  PoisonRecords is the permanent failure of some records of a batch only, which the
  delivery loop sets aside so the rest go on.
- RetryableError: a transient fault (connection reset, 5xx, 410 from IMDS).
- ThrottledError: a RetryableError where the far side asked us to slow down, optionally
  saying for how long (Retry-After), which the backoff honours.
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
    """Exponential backoff with equal jitter, capped, and reset on success.

    Each wait is drawn between half and all of the capped exponential step: a fleet's
    retries spread out, so thousands of VMs do not retry in step, and none comes sooner
    than half the step. `rng` is injectable so tests can check the bounds without sleeping.
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


@dataclass
class FailureStreak:
    """A run of failures of one activity, for a loop that keeps trying.

    A person wants one line when the trouble starts and one when it ends, not one per
    retry: `failed` counts a failure and says whether it opened the streak (the caller logs
    that one loudly, in its own words, and the rest at DEBUG), and gives the backoff's wait;
    `succeeded` ends the streak, resets the backoff and says how many failures it had, for
    the caller's recovery line (0: there was no streak).

        first, delay = streak.failed(err)
        if first:
            log.warning("cannot read the hub: %s; retrying in %.1f s", err, delay)
        ...
        if ended := streak.succeeded():
            log.info("the hub answers again after %d failed attempts", ended)
    """

    backoff: Backoff = field(default_factory=Backoff)
    failures: int = 0

    def failed(self, error: BaseException, *, longest: bool = False) -> tuple[bool, float]:
        """Count `error`: (whether it opens the streak, the wait before trying again).

        `longest` waits the backoff's maximum without stepping it up: what a failure that
        needs a person (a PermanentError) waits before the next try.
        """
        self.failures += 1
        wait = self.backoff.maximum if longest else self.backoff.delay_for(error)
        return self.failures == 1, wait

    def succeeded(self) -> int:
        """End the streak: how many failures it had."""
        ended, self.failures = self.failures, 0
        self.backoff.reset()
        return ended


class PoisonRecords(PermanentError):
    """Some records of a batch can never be accepted by this sink (for example a schema rejection).

    `seqs` names them by spool sequence number; the delivery loop sets them aside in the
    spool's dead-letter table with `reason` and goes on with the rest, so one bad record
    never blocks a sink and nothing is lost.
    """

    def __init__(self, message: str, seqs: list[int]) -> None:
        super().__init__(message)
        self.seqs = seqs
