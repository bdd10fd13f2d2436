"""What keeps the consumer's periodic passes going (issue 36's review): a pass that fails, for
whatever reason, is counted and said, and the next pass runs on schedule.

After start-up `se-bridge consume` keeps running and holds what it has: a thread that turns on
a timer (the re-evaluation tick, the Resource Graph reconciler) must never end because one
pass raised, and one row or event that fails must never keep the rest of its pass out. Each
activity has a `Guard`: every failure is counted by its kind (the exception's type name: a
handful per activity, a metric label of low cardinality), and each kind is said once, at the
level its caller gives, with what a person can do about it, until a pass succeeds again (one
line then, at INFO). The counts go to `se_bridge_consumer_failures_total{activity, kind}`
(bridge.consumer.metrics); a sample:

    se_bridge_consumer_failures_total{activity="reconcile",kind="OperationalError"} 2.0
    se_bridge_consumer_failures_total{activity="reconcile_row",kind="KeyError"} 1.0
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

from bridge.redact import describe


class Guard:
    """The failures of one activity (`activity` names it in the metric), said through `log`."""

    def __init__(self, activity: str, log: logging.Logger, failures: Failures | None = None):
        self.activity, self._log = activity, log
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()  # by kind, since the start
        self._said: set[str] = set()  # kinds said in the present run of failures
        self.streak = 0  # failures since the last success
        if failures is not None:
            failures.add(self)

    def failed(
        self, err: BaseException, what: str, advice: str, *, level: int = logging.ERROR
    ) -> None:
        """Count `err`; say it at `level` if its kind was not said in this run of failures:
        "`what` failed (the error); `advice`", with the traceback where it is no error of a
        service (ERROR: a bug, or the state failing)."""
        kind = type(err).__name__
        with self._lock:
            self._counts[kind] += 1
            self.streak += 1
            first = kind not in self._said
            self._said.add(kind)
        if first:
            self._log.log(
                level,
                "%s failed (%s): %s",
                what,
                describe(err, with_type=True),
                advice,
                exc_info=err if level >= logging.ERROR else None,
            )
        else:
            self._log.debug("%s failed again: %s", what, describe(err, with_type=True))

    def succeeded(self, what: str) -> None:
        """End a run of failures: one line that `what` works again."""
        with self._lock:
            ended, self.streak = self.streak, 0
            self._said.clear()
        if ended:
            self._log.info("%s works again after %d failed attempts", what, ended)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class Failures:
    """Every guard of one consumer, for the metric (asked at each scrape)."""

    def __init__(self) -> None:
        self._guards: list[Guard] = []

    def add(self, guard: Guard) -> None:
        self._guards.append(guard)

    def counts(self) -> dict[tuple[str, str], int]:
        """{(activity, kind): failures since the start}."""
        found: Counter[tuple[str, str]] = Counter()
        for guard in list(self._guards):
            for kind, count in guard.counts().items():
                found[(guard.activity, kind)] += count
        return dict(found)
