"""Delivery: one worker thread per sink, shipping spooled records with at-least-once semantics.

Each worker reads its sink's next batch from the spool, sends it, and acknowledges it only
after `send` returned, so a crash at any point at worst delivers a batch twice. Workers
share nothing but the spool: one failing sink never holds the others back, and when it
recovers it catches up from the spool in order. This is the one retry loop for sinks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from bridge.outbox.spool import Spool, StateKey
from bridge.records import iso, utc_now
from bridge.redact import describe
from bridge.retry import Backoff, FailureStreak, PermanentError, PoisonRecords, RetryableError
from bridge.sinks.base import Sink, SpooledRecord

log = logging.getLogger(__name__)

Waiter = Callable[[threading.Event, float], object]
# The spool wakes an idle worker the moment records are appended; this timeout is only the
# safety net. Waking every second to ask SQLite cost the idle agent a third of its CPU.
IDLE_WAIT = 60.0


def interruptible_wait(stop: threading.Event, seconds: float) -> None:
    """The backoff pause: returns early when `stop` is set, so shutdown never waits it out."""
    stop.wait(seconds)


class _Hurry:
    """Set while any flush runs (flushes may overlap): then nothing is held back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flushes = 0

    def enter(self) -> None:
        with self._lock:
            self._flushes += 1

    def leave(self) -> None:
        with self._lock:
            self._flushes -= 1

    def is_set(self) -> bool:
        with self._lock:
            return self._flushes > 0


class _Troubles:
    """Each failing sink's last error, kept in the spool's state where `se-bridge status` (another
    process) reads it: {"error": describe()'s secret-free, bounded text, "kind": how it failed,
    "since": when this streak began}. Written when a sink starts failing, fails another way,
    or delivers again; never once per retry."""

    def __init__(self, spool: Spool, names: Sequence[str]) -> None:
        self._spool, self._lock = spool, threading.Lock()
        saved = (spool.load_state(StateKey.DELIVERY) or {}).get("sinks")
        # A sink no longer configured has nothing to say; what is not ours to read is dropped.
        self._sinks: dict[str, dict[str, str]] = {
            name: trouble
            for name, trouble in (saved if isinstance(saved, dict) else {}).items()
            if name in names and isinstance(trouble, dict)
        }

    def failed(self, name: str, kind: str, error: str) -> None:
        with self._lock:
            before = self._sinks.get(name)
            if before is not None and (before.get("kind"), before.get("error")) == (kind, error):
                return
            since = before["since"] if before and "since" in before else iso(utc_now())
            self._sinks[name] = {"error": error, "kind": kind, "since": since}
            self._save()

    def succeeded(self, name: str) -> None:
        with self._lock:
            if self._sinks.pop(name, None) is not None:
                self._save()

    def _save(self) -> None:
        try:
            self._spool.commit([], state={StateKey.DELIVERY: {"sinks": dict(self._sinks)}})
        except Exception as err:  # only status's view is stale; delivery goes on
            log.debug("cannot keep the sinks' last errors in the spool: %s", describe(err))


class _Worker:
    """Feeds one sink from the spool; its thread never dies until told to stop."""

    def __init__(
        self,
        spool: Spool,
        sink: Sink,
        *,
        backoff: Backoff,
        stop: threading.Event,
        progressed: Callable[[], None],
        idle_wait: float,
        wait: Waiter,
        hurry: _Hurry,
        clock: Callable[[], float],
        troubles: _Troubles,
    ) -> None:
        self.sink, self.name = sink, sink.name
        self._troubles = troubles
        self._spool, self._streak = spool, FailureStreak(backoff)
        self._stop, self._progressed = stop, progressed
        self._idle_wait, self._wait = idle_wait, wait
        self._hurry, self._clock = hurry, clock
        self._sent_at: float | None = None  # the last successful send, on `clock`
        self.last_error: str | None = None
        self._reported: set[str] = set()  # what this failure streak already logged loudly
        # Since the start, for the metrics; `permanent` while the last attempt failed for good.
        self.failures_by_kind: dict[str, int] = {}
        self.dead_lettered = 0
        self.permanent = False
        self.thread = threading.Thread(
            target=self._run, name=f"se-bridge-delivery {self.name}", daemon=True
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception as err:  # the spool itself failed (disk, I/O); keep going
                self._failed(err, kind="spool")

    def _step(self) -> None:
        # Before reading: a record appended (or a flush) after the read wakes a hold below.
        generation = self._spool.generation
        batch = self._spool.read_batch(self.name, self.sink.max_batch)
        if not batch:
            again = self._idle()
            wait = self._idle_wait if again is None else max(0.0, min(self._idle_wait, again))
            self._spool.wait_for_records(self.name, wait, cancel=self._stop)
            return
        hold = self._hold(batch)
        if hold > 0:
            # A record that cannot wait wakes the loop when appended; so do stop and flush.
            self._spool.wait_for_change(generation, hold, cancel=self._stop)
            return
        try:
            self.sink.send(batch)
        except PoisonRecords as err:
            self._set_aside(batch, err)
        except PermanentError as err:
            self._failed(err, kind="permanent")
        except RetryableError as err:
            self._failed(err, kind="retryable")
        except Exception as err:  # a sink bug must not end delivery: retry it like a fault
            self._failed(err, kind="unexpected")
        else:
            # The kept error goes first: `flush` returns at the ack, and a status read after
            # it must not show the error this send just cured.
            self._troubles.succeeded(self.name)
            self._spool.ack(self.name, batch[-1].seq)
            self._sent_at = self._clock()
            self._succeeded()

    def _hold(self, batch: Sequence[SpooledRecord]) -> float:
        """Seconds `batch` may still wait for the sink's next send (see Sink); 0: send now."""
        interval = self.sink.send_interval
        if not interval or self._sent_at is None or self._hurry.is_set():
            return 0.0
        if len(batch) >= self.sink.max_batch:
            return 0.0  # a full request already; and what cannot wait may be behind it
        remaining = self._sent_at + interval - self._clock()
        if remaining <= 0:
            return 0.0
        try:
            waits = all(self.sink.can_wait(record) for record in batch)
        except Exception as err:  # a sink's rule must never stop delivery: send now
            log.debug("sink %s could not tell what may wait: %s", self.name, describe(err))
            return 0.0
        return remaining if waits else 0.0

    def _idle(self) -> float | None:
        """Tell the sink there is nothing to send; the seconds until it wants to be told again."""
        try:
            return self.sink.idle()
        except Exception as err:  # letting go of a connection must never stop delivery
            log.debug("sink %s failed to go idle: %s", self.name, describe(err, with_type=True))
            return None

    def _set_aside(self, batch: Sequence[SpooledRecord], err: PoisonRecords) -> None:
        seqs = sorted({record.seq for record in batch} & set(err.seqs))
        if not seqs:
            # Naming no record of the batch would make it fail forever without progress.
            self._failed(err, kind="permanent")
            return
        reason = describe(err)
        self._spool.dead_letter(self.name, seqs, reason)
        self.dead_lettered += len(seqs)
        log.error(
            "sink %s rejected %d records (spool seqs %s): %s; they are kept as dead letters "
            "in the spool and the rest of the batch is retried",
            *(self.name, len(seqs), _seq_list(seqs), reason),
        )
        self._progressed()

    @property
    def failures(self) -> int:
        """Failures in a row, up to now."""
        return self._streak.failures

    def _failed(self, err: Exception, *, kind: str) -> None:
        _, delay = self._streak.failed(err, longest=kind == "permanent")
        self.failures_by_kind[kind] = self.failures_by_kind.get(kind, 0) + 1
        self.permanent = kind == "permanent"
        self.last_error = describe(err, with_type=kind in ("unexpected", "spool"))
        self._troubles.failed(self.name, kind, self.last_error)
        self._log_failure(err, delay, kind)
        self._wait(self._stop, delay)

    def _log_failure(self, err: Exception, delay: float, kind: str) -> None:
        # One line per streak and kind of trouble, not one per retry.
        key = {
            "permanent": f"permanent:{self.last_error}",
            "unexpected": f"unexpected:{type(err).__name__}",
        }.get(kind, kind)
        if key in self._reported:
            log.debug("sink %s failed again (%d): %s", self.name, self.failures, self.last_error)
            return
        self._reported.add(key)
        if kind == "permanent":
            log.error(
                "sink %s cannot deliver: %s; records stay in the spool and are retried "
                "every %.0f s until this is fixed",
                *(self.name, self.last_error, delay),
            )
        elif kind == "unexpected":
            log.warning(
                "sink %s failed with an unexpected %s (a bug in the sink?): %s; "
                "retrying with backoff",
                *(self.name, type(err).__name__, describe(err)),
                exc_info=err,
            )
        elif kind == "spool":
            log.warning(
                "sink %s: reading or acknowledging in the spool failed: %s; retrying with backoff",
                *(self.name, self.last_error),
                exc_info=err,
            )
        else:
            log.warning(
                "sink %s failed: %s; records stay in the spool, retrying with backoff",
                *(self.name, self.last_error),
            )

    def _succeeded(self) -> None:
        self.permanent = False
        if ended := self._streak.succeeded():
            log.warning(
                "sink %s recovered after %d failures; catching up %d records",
                *(self.name, ended, self._spool.backlog(self.name)),
            )
        self._reported.clear()
        self._progressed()

    def status(self) -> dict[str, Any]:
        return {
            "acked_seq": self._spool.acked(self.name),
            "consecutive_failures": self.failures,
            "last_error": self.last_error,
            "backlog": self._spool.backlog(self.name),
            "running": self.thread.is_alive(),
            "failures_by_kind": dict(self.failures_by_kind),
            "dead_lettered": self.dead_lettered,
            "failing_permanently": self.permanent,
        }

    def close_sink(self) -> None:
        try:
            self.sink.close()
        except Exception as err:  # shutting down: report, and close the other sinks anyway
            log.warning("sink %s failed to close: %s", self.name, describe(err, with_type=True))


def _seq_list(seqs: Sequence[int]) -> str:
    shown = ", ".join(str(seq) for seq in seqs[:10])
    return shown if len(seqs) <= 10 else f"{shown}, ... ({len(seqs)} in all)"


class Delivery:
    """Runs one `_Worker` per sink over a shared spool."""

    def __init__(
        self,
        spool: Spool,
        sinks: Sequence[Sink],
        *,
        backoff_factory: Callable[[], Backoff] = Backoff,
        idle_wait: float = IDLE_WAIT,
        clock: Callable[[], float] = time.monotonic,
        wait: Waiter = interruptible_wait,
    ) -> None:
        names = [sink.name for sink in sinks]
        if len(set(names)) != len(names):
            raise ValueError(f"sink names must be unique: {names}")
        for name in names:
            spool.acked(name)  # ValueError now rather than a retry loop that never succeeds
        self._spool, self._clock = spool, clock
        self._stop = threading.Event()
        self._hurry = _Hurry()
        self._progress = threading.Condition()
        troubles = _Troubles(spool, names)
        self._workers = [
            _Worker(
                spool,
                sink,
                backoff=backoff_factory(),
                stop=self._stop,
                progressed=self._notify,
                idle_wait=idle_wait,
                wait=wait,
                hurry=self._hurry,
                clock=clock,
                troubles=troubles,
            )
            for sink in sinks
        ]

    def start(self) -> None:
        for worker in self._workers:
            worker.thread.start()

    def flush(self, timeout: float) -> bool:
        """Wait until every sink has handled what is spooled now (True), or `timeout` (False).
        Records a sink would hold back for its next send go at once meanwhile."""
        deadline = self._clock() + timeout
        target = self._spool.last_seq()
        self._hurry.enter()
        self._spool.wake()
        try:
            with self._progress:
                while not self._caught_up(target):
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        return False
                    self._progress.wait(remaining)
            return True
        finally:
            self._hurry.leave()

    def _caught_up(self, target: int) -> bool:
        return all(
            self._spool.backlog(worker.name, upto=target, limit=1) == 0 for worker in self._workers
        )

    def _notify(self) -> None:
        with self._progress:
            self._progress.notify_all()

    def stop(self, timeout: float) -> None:
        """Stop every worker (interrupting waits at once), then close the sinks."""
        self._stop.set()
        self._spool.wake()
        deadline = self._clock() + timeout
        for worker in self._workers:
            if worker.thread.ident is not None:
                worker.thread.join(max(0.0, deadline - self._clock()))
        for worker in self._workers:
            if worker.thread.is_alive():
                log.warning(
                    "sink %s is still sending after %.1f s; leaving it, its unacknowledged "
                    "records stay in the spool and are sent again at the next start",
                    *(worker.name, timeout),
                )
            else:
                worker.close_sink()

    def status(self) -> dict[str, dict[str, Any]]:
        """Per sink: acked seq, consecutive failures, last error (secret-free), backlog."""
        return {worker.name: worker.status() for worker in self._workers}
