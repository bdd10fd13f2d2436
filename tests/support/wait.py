"""`eventually`: the one way a test waits for something to happen.

A test never sleeps to let something happen: it polls for it with `eventually`, which returns as
soon as the condition holds and, when it never does, fails naming what it waited for. A wait for
something NOT to happen is no wait at all: it runs on a fake clock (Delivery and CommandListener
take one), or waits for an event or a file that says the thing it races with is done.
"""

from __future__ import annotations

import ast
import inspect
import logging
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

# Generous: a timeout only costs time when something is already wrong.
TIMEOUT = 30.0


def eventually(
    condition: Callable[[], T | None],
    timeout: float = TIMEOUT,
    what: str | None = None,
    details: Callable[[], str] = lambda: "",
    interval: float = 0.02,
) -> T:
    """The first truthy value of `condition`, polled every `interval` s; an AssertionError naming
    `what` (by default the condition's own source) and `details()`, the state that tells why,
    when `timeout` s pass without one."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            more = details()
            named = what or _source(condition)
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {named}" + (f"\n{more}" if more else "")
            )
        time.sleep(interval)


def _source(condition: Callable[..., object]) -> str:
    """A lambda's source, from `lambda` on, or a function's name: what a test waited for, in
    the test's own words."""
    name = getattr(condition, "__qualname__", repr(condition))
    if getattr(condition, "__name__", "") != "<lambda>":
        return name
    try:
        text = " ".join(inspect.getsource(condition).split())
    except (OSError, TypeError):
        return name
    text = text[text.find("lambda") :]
    # The source line goes on after the lambda (", timeout=5)"): keep the longest start of it
    # that is a lambda on its own.
    for end in range(len(text), 0, -1):
        try:
            tree = ast.parse(text[:end], mode="eval")
        except SyntaxError:
            continue
        if isinstance(tree.body, ast.Lambda):
            return text[:end].strip()
    return text


def within(
    condition: Callable[[], object], timeout: float, what: str = "", interval: float = 0.02
) -> bool:
    """Whether `condition` held within `timeout` s: for a tool (the chaos run, the kill test's
    script) that carries on, and says what it gave up on, where a test would fail."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            if what:
                log.warning("gave up waiting for %s after %g s", what, timeout)
            return False
        time.sleep(interval)
    return True
