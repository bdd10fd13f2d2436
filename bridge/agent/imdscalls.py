"""The agent's IMDS calls, each on a thread of its own kind (the poll's, the approvals'), so a
stop signal never waits for a slow answer (the first may take two minutes) and an approval
never waits behind a poll that IMDS is slow to answer.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Generic, TypeVar, cast

from bridge import telemetry
from bridge.retry import RetryableError

STOP_CHECK_SECONDS = 0.1
T = TypeVar("T")


class ImdsCalls:
    """Runs calls on the poll's worker or the approvals' and waits for their answers, giving
    up (RetryableError) once `stop` is set."""

    def __init__(self, notifier: telemetry.SystemdNotifier) -> None:
        self.stop = threading.Event()  # the agent's: Agent.run puts its caller's here
        self._notifier = notifier
        self.polls = _Worker("imds")
        self.approvals = _Worker("imds approvals")

    def result(self, future: Pending[T], seconds: float = math.inf, alive_for: float = 0) -> T:
        """`future`'s result; FutureTimeout when it is not ready within `seconds`, and
        RetryableError if the agent is told to stop meanwhile. For the first `alive_for`
        seconds of the wait systemd's watchdog hears that the loop is alive."""
        started = time.monotonic()
        while True:
            try:
                return future.result(timeout=STOP_CHECK_SECONDS)
            except FutureTimeout:
                if self.stop.is_set():
                    raise RetryableError("stopping before IMDS answered") from None
                waited = time.monotonic() - started
                if waited >= seconds:
                    raise
                if waited < alive_for:
                    self._notifier.watchdog()

    def stopping(self) -> bool:
        return self.stop.is_set()

    def approve(self, call: Callable[[], T]) -> T:
        """`call()` on the approvals' worker (the Approver's Runner), abandoned if the agent
        is told to stop."""
        return self.result(self.approvals.submit(call))

    def close(self) -> None:
        self.polls.stop()
        self.approvals.stop()


class Pending(Generic[T]):
    """A call handed to a worker, and its outcome once the worker has it: what a
    concurrent.futures.Future gives here, at a fraction of its cost (a Future makes a
    Condition and notifies through it in Python, at every poll of every second).

    `result` is read by one thread, the caller's; the worker puts the outcome once.
    """

    __slots__ = ("_box", "_outcome")

    def __init__(self) -> None:
        self._box: queue.SimpleQueue[tuple[Any, BaseException | None]] = queue.SimpleQueue()
        self._outcome: tuple[Any, BaseException | None] | None = None

    def result(self, timeout: float | None = None) -> T:
        """The call's value (or its exception, raised); FutureTimeout if not within `timeout`."""
        if self._outcome is None:
            try:
                self._outcome = self._box.get(timeout=timeout)
            except queue.Empty:
                raise FutureTimeout from None
        value, error = self._outcome
        if error is not None:
            raise error
        return cast(T, value)

    def settle(self, value: Any, error: BaseException | None) -> None:
        self._box.put((value, error))


class _Worker:
    """One daemon thread running calls in turn.

    Daemon, unlike a ThreadPoolExecutor's workers, so an abandoned call cannot hold the
    process at exit.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Pending[Any]] | None] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def submit(self, call: Callable[[], T]) -> Pending[T]:
        pending: Pending[T] = Pending()
        self._calls.put((call, pending))
        return pending

    def stop(self) -> None:
        self._calls.put(None)

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            call, pending = item
            try:
                value = call()
            except BaseException as err:  # handed to the caller, who decides
                pending.settle(None, err)
            else:
                pending.settle(value, None)
