"""The one backoff and the one failure streak every retry loop uses."""

from __future__ import annotations

import random

from bridge.retry import Backoff, FailureStreak, RetryableError, ThrottledError


def streak() -> FailureStreak:
    return FailureStreak(Backoff(initial=1.0, maximum=8.0, rng=random.Random(7)))


def test_the_first_failure_opens_the_streak_and_the_rest_do_not() -> None:
    s = streak()
    assert [s.failed(RetryableError("x"))[0] for _ in range(4)] == [True, False, False, False]
    assert s.failures == 4


def test_waits_grow_within_bounds_and_start_again_after_a_success() -> None:
    s = streak()
    waits = [s.failed(RetryableError("x"))[1] for _ in range(5)]
    ceilings = [1.0, 2.0, 4.0, 8.0, 8.0]
    assert all(c / 2 <= w <= c for w, c in zip(waits, ceilings, strict=True))
    assert s.succeeded() == 5
    first, wait = s.failed(RetryableError("x"))
    assert first
    assert 0.5 <= wait <= 1.0


def test_a_success_without_failures_ends_no_streak() -> None:
    s = streak()
    assert s.succeeded() == 0
    s.failed(RetryableError("x"))
    assert s.succeeded() == 1
    assert s.succeeded() == 0


def test_a_permanent_failure_waits_the_longest_without_stepping_the_backoff_up() -> None:
    s = streak()
    assert s.failed(RetryableError("x"), longest=True) == (True, 8.0)
    _, wait = s.failed(RetryableError("x"))
    assert 0.5 <= wait <= 1.0  # still the first step


def test_a_throttled_failure_waits_at_least_the_servers_retry_after() -> None:
    s = streak()
    _, wait = s.failed(ThrottledError("slow down", retry_after=5.0))
    assert wait >= 5.0
    _, capped = s.failed(ThrottledError("slow down", retry_after=600.0))
    assert capped == 8.0
