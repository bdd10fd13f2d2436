"""`eventually` and `within` (tests/support/wait.py): what a test's wait returns and says."""

from __future__ import annotations

import itertools

import pytest

from tests.support.wait import eventually, within


def test_eventually_returns_the_first_truthy_value() -> None:
    counter = itertools.count()
    assert eventually(lambda: next(counter) >= 3 and "there", timeout=5, interval=0) == "there"


def test_eventually_names_what_it_waited_for_and_why_it_did_not_come() -> None:
    with pytest.raises(AssertionError) as info:
        eventually(lambda: None, timeout=0.01, what="the sink to drain", details=lambda: "3 left")
    assert str(info.value) == "timed out after 0.01 s waiting for the sink to drain\n3 left"


def test_without_what_it_names_the_condition_in_the_tests_own_words() -> None:
    queue: list[int] = []
    with pytest.raises(AssertionError, match=r"waiting for lambda: len\(queue\) == 2$"):
        eventually(lambda: len(queue) == 2, timeout=0.01)

    def drained() -> bool:
        return False

    with pytest.raises(AssertionError, match=r"waiting for .*drained$"):
        eventually(drained, timeout=0.01)


def test_within_says_whether_it_held_and_does_not_fail() -> None:
    assert within(lambda: True, timeout=0)
    assert not within(lambda: False, timeout=0.01, what="nothing")
