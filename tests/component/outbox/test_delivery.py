"""Delivery workers over a real spool, with fake sinks that fail in every documented way."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from bridge.outbox.delivery import IDLE_WAIT, Delivery
from bridge.outbox.inspect import inspect
from bridge.outbox.spool import Spool, SpoolError, StateKey
from bridge.records import parse_time
from bridge.retry import (
    Backoff,
    PermanentError,
    PoisonRecords,
    RetryableError,
    ThrottledError,
)
from bridge.sinks import BaseSink, Sink, SpooledRecord
from tests.support.wait import eventually


class FakeSink(BaseSink):
    """Accepts batches, or fails as scripted: `outcomes` are raised one per send (None
    accepts), records named in `poison` are rejected, and while `up` is clear every send
    fails retryably with `down_error`."""

    def __init__(
        self,
        name: str = "fake",
        *,
        max_batch: int = 100,
        outcomes: Iterable[BaseException | None] = (),
        poison: Iterable[str] = (),
        down_error: str = "connection refused",
    ) -> None:
        self._name, self._max_batch = name, max_batch
        self.outcomes = list(outcomes)
        self.poison = set(poison)
        self.up = threading.Event()
        self.up.set()
        self.down_error = down_error
        self.delivered: list[str] = []
        self.batches: list[list[int]] = []
        self.closed = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def max_batch(self) -> int:
        return self._max_batch

    def send(self, batch: Sequence[SpooledRecord]) -> None:
        self.batches.append([record.seq for record in batch])
        if not self.up.is_set():
            raise RetryableError(self.down_error)
        if self.outcomes and (outcome := self.outcomes.pop(0)) is not None:
            raise outcome
        rejected = [record.seq for record in batch if record.record_id in self.poison]
        if rejected:
            raise PoisonRecords("schema rejected the record", rejected)
        self.delivered += [record.record_id for record in batch]

    def close(self) -> None:
        self.closed = True


class RecordingWait:
    """Records every backoff pause instead of sleeping through it."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, stop: threading.Event, seconds: float) -> None:
        self.delays.append(seconds)
        stop.wait(0.001)  # a sink that stays down must not spin the CPU


class WaitsSpool(Spool):
    """A spool that keeps every wait a worker asks of it: ("records", timeout) when it has
    nothing to send, ("change", timeout) when it holds what it read for the next send. A test
    reads in them what a worker decided, instead of sleeping to see that it does nothing."""

    def __init__(self, path: Path, sinks: list[str]) -> None:
        super().__init__(path, sinks)
        self.waits: list[tuple[str, float]] = []
        # The sinks' kept errors as each ack found them (what `flush` returns upon).
        self.troubles_at_ack: list[Any] = []

    def ack(self, sink: str, upto_seq: int) -> None:
        self.troubles_at_ack.append((self.load_state(StateKey.DELIVERY) or {}).get("sinks"))
        super().ack(sink, upto_seq)

    def wait_for_records(
        self, sink: str, timeout: float, *, cancel: threading.Event | None = None
    ) -> bool:
        self.waits.append(("records", timeout))
        return super().wait_for_records(sink, timeout, cancel=cancel)

    def wait_for_change(
        self, since: int, timeout: float, *, cancel: threading.Event | None = None
    ) -> None:
        self.waits.append(("change", timeout))
        super().wait_for_change(since, timeout, cancel=cancel)

    def holds_since(self, mark: int) -> bool:
        """Whether a worker held what it read (for its next send) after the first `mark` waits."""
        return any(kind == "change" for kind, _ in self.waits[mark:])


def rec(n: int, record_type: str = "Event") -> dict[str, Any]:
    return {"RecordId": f"r{n}", "RecordType": record_type, "N": n}


def fast_backoff() -> Backoff:
    return Backoff(initial=0.5, maximum=60.0, rng=random.Random(7))


Run = Callable[..., tuple[WaitsSpool, Delivery]]


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    """Open a spool for these sinks and start delivering to them; stopped at teardown."""
    started: list[tuple[WaitsSpool, Delivery]] = []

    def run_(sinks: Sequence[FakeSink], **kwargs: Any) -> tuple[WaitsSpool, Delivery]:
        spool = WaitsSpool(tmp_path / "spool.db", [sink.name for sink in sinks])
        kwargs.setdefault("backoff_factory", fast_backoff)
        kwargs.setdefault("wait", RecordingWait())
        delivery = Delivery(spool, sinks, **kwargs)
        delivery.start()
        started.append((spool, delivery))
        return spool, delivery

    yield run_
    for spool, delivery in started:
        delivery.stop(10)
        spool.close()


def settled(delivery: Delivery, sink: str) -> None:
    """Wait for the worker's bookkeeping after its last ack (flush returns at the ack)."""
    eventually(lambda: delivery.status()[sink]["consecutive_failures"] == 0)


def warnings_and_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --- the happy path -----------------------------------------------------------------------


def test_every_sink_gets_every_record_in_order_then_the_spool_empties(run: Run) -> None:
    a, b = FakeSink("a"), FakeSink("b", max_batch=3)
    spool, delivery = run([a, b])
    spool.commit([rec(n) for n in range(5)])
    spool.commit([rec(n) for n in range(5, 10)])

    assert delivery.flush(10)

    expected = [f"r{n}" for n in range(10)]
    assert a.delivered == expected
    assert b.delivered == expected
    assert all(len(batch) <= 3 for batch in b.batches)
    assert spool.depth() == 0


def test_flush_with_nothing_spooled_returns_at_once(run: Run) -> None:
    _, delivery = run([FakeSink()])
    assert delivery.flush(0) is True


def test_stop_closes_every_sink_even_if_one_fails_to_close(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    broken, fine = FakeSink("broken"), FakeSink("fine")

    def fail_to_close() -> None:
        raise OSError("already gone")

    broken.close = fail_to_close  # type: ignore[method-assign]
    _, delivery = run([broken, fine])
    delivery.stop(10)
    assert fine.closed
    assert "sink broken failed to close: OSError: already gone" in caplog.text


# --- failures -----------------------------------------------------------------------------


def test_retryable_failures_are_retried_with_growing_backoff_and_one_warning(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    sink = FakeSink(outcomes=[RetryableError("503 from the endpoint")] * 3)
    wait = RecordingWait()
    spool, delivery = run([sink], wait=wait)
    spool.commit([rec(1), rec(2)])

    assert delivery.flush(10)
    settled(delivery, "fake")

    assert sink.delivered == ["r1", "r2"]
    assert sink.batches == [[1, 2]] * 4  # the same batch, retried
    assert 0.25 <= wait.delays[0] <= 0.5
    assert 1.0 <= wait.delays[2] <= 2.0  # third attempt: ceiling 0.5 * 2**2
    assert warnings_and_errors(caplog) == [
        "sink fake failed: 503 from the endpoint; records stay in the spool, retrying with backoff",
        "sink fake recovered after 3 failures; catching up 0 records",
    ]
    assert delivery.status()["fake"]["consecutive_failures"] == 0


def test_success_resets_the_backoff(run: Run) -> None:
    sink = FakeSink(outcomes=[RetryableError("down")] * 4)
    wait = RecordingWait()
    spool, delivery = run([sink], wait=wait, backoff_factory=lambda: Backoff(initial=1.0))
    spool.commit([rec(1)])
    assert delivery.flush(10)
    sink.outcomes = [RetryableError("down again")]
    spool.commit([rec(2)])
    assert delivery.flush(10)

    assert wait.delays[3] >= 4.0  # fourth failure in a row: ceiling 8
    assert wait.delays[4] <= 1.0  # first failure of a new streak: ceiling 1


def test_throttling_honours_retry_after(run: Run) -> None:
    sink = FakeSink(outcomes=[ThrottledError("429 Too Many Requests", retry_after=42.0)])
    wait = RecordingWait()
    spool, delivery = run([sink], wait=wait)
    spool.commit([rec(1)])

    assert delivery.flush(10)

    assert wait.delays == [42.0]  # the server's hint beats the 0.5 s backoff
    assert sink.delivered == ["r1"]


def test_permanent_error_is_logged_once_with_its_advice_and_retried_slowly(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    advice = "403: grant the VM identity 'Monitoring Metrics Publisher' on the DCR"
    sink = FakeSink(outcomes=[PermanentError(advice)] * 3)
    wait = RecordingWait()
    spool, delivery = run([sink], wait=wait)
    spool.commit([rec(1)])

    assert delivery.flush(10)

    assert wait.delays == [60.0, 60.0, 60.0]  # the maximum backoff
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        f"sink fake cannot deliver: {advice}; records stay in the spool and are retried "
        "every 60 s until this is fixed"
    ]
    assert sink.delivered == ["r1"]


def test_a_sink_bug_never_kills_the_thread(run: Run, caplog: pytest.LogCaptureFixture) -> None:
    sink = FakeSink(outcomes=[KeyError("Zone"), ZeroDivisionError("division by zero")])
    spool, delivery = run([sink])
    spool.commit([rec(1)])

    assert delivery.flush(10)

    assert sink.delivered == ["r1"]
    first, second = [r for r in caplog.records if r.levelno == logging.WARNING and r.exc_info]
    assert "sink fake failed with an unexpected KeyError (a bug in the sink?): 'Zone'" in (
        first.getMessage()
    )
    assert "unexpected ZeroDivisionError" in second.getMessage()
    assert delivery.status()["fake"]["running"] is True


def test_spool_trouble_never_kills_the_thread(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    sink = FakeSink()
    spool, delivery = run([sink])
    real_ack = spool.ack
    failures = [SpoolError("disk I/O error")]

    def flaky_ack(name: str, upto: int) -> None:
        if failures:
            raise failures.pop()
        real_ack(name, upto)

    monkeypatch.setattr(spool, "ack", flaky_ack)
    spool.commit([rec(1), rec(2)])

    assert delivery.flush(10)

    # The ack after the first send was lost: at-least-once means sending the batch again.
    assert sink.delivered == ["r1", "r2", "r1", "r2"]
    assert spool.depth() == 0


def test_poison_records_are_dead_lettered_and_the_rest_delivered(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    picky, easy = FakeSink("picky", poison=["r2", "r4"]), FakeSink("easy")
    spool, delivery = run([picky, easy])
    spool.commit([rec(n) for n in range(1, 6)])

    assert delivery.flush(10)

    assert picky.delivered == ["r1", "r3", "r5"]
    assert easy.delivered == ["r1", "r2", "r3", "r4", "r5"]
    letters = spool.dead_letters("picky")
    assert [d["record_id"] for d in letters] == ["r2", "r4"]
    assert {d["reason"] for d in letters} == {"schema rejected the record"}
    assert spool.dead_letters("easy") == []
    assert spool.depth() == 0
    assert any(
        r.levelno == logging.ERROR and "sink picky rejected 2 records" in r.getMessage()
        for r in caplog.records
    )


def test_poison_naming_no_record_of_the_batch_is_treated_as_permanent(run: Run) -> None:
    sink = FakeSink(outcomes=[PoisonRecords("rejected something", [999])])
    wait = RecordingWait()
    spool, delivery = run([sink], wait=wait)
    spool.commit([rec(1)])

    assert delivery.flush(10)

    assert wait.delays == [60.0]
    assert sink.delivered == ["r1"]
    assert spool.dead_letters() == []


# --- independence and catching up ---------------------------------------------------------


def test_a_failing_sink_never_holds_the_others_back_and_catches_up_in_order(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    down, healthy = FakeSink("down"), FakeSink("healthy")
    down.up.clear()
    spool, delivery = run([down, healthy])
    spool.commit([rec(n) for n in range(5)])

    eventually(lambda: len(healthy.delivered) == 5)
    spool.commit([rec(n) for n in range(5, 8)])
    eventually(lambda: len(healthy.delivered) == 8)
    assert down.delivered == []
    assert spool.depth() == 8  # held for the sink that is down
    assert delivery.flush(0.01) is False

    down.up.set()
    assert delivery.flush(10)
    settled(delivery, "down")
    assert down.delivered == [f"r{n}" for n in range(8)]
    assert spool.depth() == 0
    # Said by the worker after its counters are reset, so perhaps just after `settled`.
    eventually(lambda: any("sink down recovered after" in m for m in warnings_and_errors(caplog)))


def test_undelivered_records_survive_a_restart(tmp_path: Path) -> None:
    sink = FakeSink()
    sink.up.clear()
    spool = Spool(tmp_path / "spool.db", [sink.name])
    delivery = Delivery(spool, [sink], wait=RecordingWait())
    delivery.start()
    spool.commit([rec(1), rec(2)])
    eventually(lambda: len(sink.batches) > 0)
    delivery.stop(10)
    spool.close()

    restarted = FakeSink()
    spool = Spool(tmp_path / "spool.db", [restarted.name])
    delivery = Delivery(spool, [restarted])
    delivery.start()
    try:
        assert delivery.flush(10)
        assert restarted.delivered == ["r1", "r2"]
    finally:
        delivery.stop(10)
        spool.close()


def test_an_idle_worker_sleeps_until_records_arrive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = WaitsSpool(tmp_path / "spool.db", ["s"])
    reads: list[str] = []
    read_batch = spool.read_batch

    def counted(sink: str, limit: int) -> list[SpooledRecord]:
        reads.append(sink)
        return read_batch(sink, limit)

    monkeypatch.setattr(spool, "read_batch", counted)
    sink = FakeSink("s")
    delivery = Delivery(spool, [sink])  # the agent's default idle timeout
    delivery.start()
    try:
        eventually(lambda: spool.waits, what="the worker to wait for records")
        # Not a one-second timer: one read, then a wait as long as the idle wait.
        assert spool.waits == [("records", IDLE_WAIT)]
        assert len(reads) == 1
        spool.commit([rec(1)])
        eventually(lambda: sink.delivered == ["r1"])  # woken by the commit, not a timeout
    finally:
        delivery.stop(10)
        spool.close()


# --- stopping and status ------------------------------------------------------------------


def test_stop_interrupts_a_long_backoff_and_an_idle_wait(tmp_path: Path) -> None:
    throttled, idle = FakeSink("throttled"), FakeSink("idle")
    throttled.outcomes = [ThrottledError("429", retry_after=3600.0)]
    spool = Spool(tmp_path / "spool.db", ["throttled", "idle"])
    delivery = Delivery(
        spool,
        [throttled, idle],
        backoff_factory=lambda: Backoff(maximum=3600.0),
        idle_wait=3600.0,
    )
    delivery.start()
    try:
        spool.commit([rec(1)])
        eventually(lambda: idle.delivered == ["r1"] and len(throttled.batches) == 1)
        started = time.monotonic()
        delivery.stop(30)
        assert time.monotonic() - started < 10  # not an hour
        assert throttled.closed
        assert idle.closed
        assert not any(s["running"] for s in delivery.status().values())
    finally:
        spool.close()


def test_status_reports_progress_and_a_secret_free_last_error(run: Run) -> None:
    down = FakeSink(
        "down", down_error="AMQP connect failed: Endpoint=sb://ns/;SharedAccessKey=s3cr3t+/="
    )
    down.up.clear()
    spool, delivery = run([down])
    spool.commit([rec(1), rec(2)])
    eventually(lambda: delivery.status()["down"]["consecutive_failures"] >= 2)

    status = delivery.status()["down"]
    assert status["acked_seq"] == 0
    assert status["backlog"] == 2
    assert status["last_error"] == "AMQP connect failed: Endpoint=sb://ns/;SharedAccessKey=***"

    down.up.set()
    assert delivery.flush(10)
    settled(delivery, "down")
    status = delivery.status()["down"]
    assert status["acked_seq"] == 2
    assert status["backlog"] == 0
    assert status["consecutive_failures"] == 0


def test_a_sinks_last_error_is_kept_in_the_spool_for_status_until_it_delivers(
    run: Run, tmp_path: Path
) -> None:
    # Down until told otherwise: a sink that ran out of scripted failures while the test
    # read the spool had recovered, and cleared its error, before the read (a flaky race).
    down = FakeSink(
        "down", outcomes=[PermanentError("no token for Event Hubs (sig=s3cr3t)")] * 10**4
    )
    up = FakeSink("up")
    spool, delivery = run([down, up])
    spool.commit([rec(1)])
    eventually(lambda: delivery.status()["down"]["consecutive_failures"] >= 2)
    # Read as `se-bridge status` reads it: from the file, by another connection.
    kept = inspect(tmp_path / "spool.db").state[StateKey.DELIVERY]["sinks"]
    assert list(kept) == ["down"]
    assert kept["down"]["error"].startswith("no token for Event Hubs (sig=***")
    assert kept["down"]["kind"] == "permanent"
    assert parse_time(kept["down"]["since"]) is not None

    down.outcomes.clear()
    assert delivery.flush(10)
    assert inspect(tmp_path / "spool.db").state[StateKey.DELIVERY] == {"sinks": {}}


def test_a_sinks_kept_error_is_gone_before_its_records_are_acknowledged(run: Run) -> None:
    # `flush` returns at the ack: a status read after it must not show the error just cured
    # (the test above failed in CI when its read fell between the ack and the clearing).
    down = FakeSink("down", outcomes=[PermanentError("no token for Event Hubs")] * 3)
    spool, delivery = run([down])
    spool.commit([rec(1)])
    assert delivery.flush(10)
    assert spool.troubles_at_ack == [{}]


def test_sinks_must_be_known_to_the_spool_and_unique(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.db", ["a"])
    try:
        with pytest.raises(ValueError, match="not configured"):
            Delivery(spool, [FakeSink("b")])
        with pytest.raises(ValueError, match="unique"):
            Delivery(spool, [FakeSink("a"), FakeSink("a")])
    finally:
        spool.close()


def test_fake_sink_satisfies_the_protocol() -> None:
    sink: Sink = FakeSink()
    assert sink.name == "fake"


class IdlingSink(FakeSink):
    """Counts the delivery loop's idle looks; the first one fails, as a sink's might."""

    def __init__(self) -> None:
        super().__init__("idling")
        self.idles = 0

    def idle(self) -> float | None:
        self.idles += 1
        if self.idles == 1:
            raise OSError("the connection was gone already")
        return None


def test_a_sink_is_told_when_there_is_nothing_to_send(run: Run) -> None:
    sink = IdlingSink()
    spool, delivery = run([sink], idle_wait=0.05)
    eventually(lambda: sink.idles >= 3)  # a failing idle() stops nothing
    spool.commit([rec(1)])
    assert delivery.flush(10)
    assert sink.delivered == ["r1"]


class ClosingSink(FakeSink):
    """Asks to be looked at again 0.1 s after each idle look until it has let go (issue 15)."""

    def __init__(self) -> None:
        super().__init__("closing")
        self.looks: list[float] = []

    def idle(self) -> float | None:
        self.looks.append(time.monotonic())
        return 0.1 if len(self.looks) < 3 else None


def test_the_idle_look_comes_when_the_sink_asks_for_it_not_a_minute_later(run: Run) -> None:
    """An Event Hubs connection is let go a few seconds after the last send: the loop's own
    idle wait (a minute) must not hold it open, or every idle agent counts against the
    namespace's connection quota a fifth of the time."""
    sink = ClosingSink()
    spool, delivery = run([sink], idle_wait=60.0)
    eventually(lambda: ("records", 60.0) in spool.waits, what="the loop's own idle wait")
    assert len(sink.looks) == 3  # then back to the loop's own wait: nothing more to let go
    spool.commit([rec(1)])
    assert delivery.flush(10)
    assert sink.delivered == ["r1"]


class HoldingSink(FakeSink):
    """Lets records of type "Heartbeat" wait up to `send_interval` for its next send."""

    send_interval = 60.0

    def can_wait(self, record: SpooledRecord) -> bool:
        return record.record_type == "Heartbeat"


def test_what_can_wait_goes_with_the_next_send_and_what_cannot_goes_at_once(run: Run) -> None:
    # Log Analytics' per-rule request quota (issue 15): neighbours' records and heartbeats
    # share one upload a minute, a VM's own event goes at once and takes them along.
    sink = HoldingSink("holding", max_batch=5)
    spool, delivery = run([sink])
    spool.commit([rec(1)])
    eventually(lambda: sink.delivered == ["r1"])
    mark = len(spool.waits)
    spool.commit([rec(2, "Heartbeat")])
    spool.commit([rec(3, "Heartbeat")])
    eventually(lambda: spool.holds_since(mark), what="the worker to hold the heartbeats")
    assert sink.delivered == ["r1"]  # held: one send a minute for these
    spool.commit([rec(4)])
    eventually(lambda: sink.delivered == ["r1", "r2", "r3", "r4"])
    assert sink.batches[-1] == [2, 3, 4]  # one request for all three
    # A full batch is a whole request already: it goes, and what is behind it too.
    mark = len(spool.waits)
    spool.commit([rec(n, "Heartbeat") for n in range(5, 11)])
    eventually(lambda: spool.holds_since(mark), what="the worker to hold the tenth")
    assert len(sink.delivered) == 9  # the tenth waits for the next
    # Flushing (a stopping agent) holds nothing back.
    assert delivery.flush(10)
    assert sink.delivered == [f"r{n}" for n in range(1, 11)]


class AppendingWhileRead(Spool):
    """Appends `late` right after the first read that returns records: an agent spooling a
    record between the worker's read and its hold."""

    def __init__(self, path: Path, sinks: list[str]) -> None:
        super().__init__(path, sinks)
        self.late: list[dict[str, Any]] = []

    def read_batch(self, sink: str, limit: int) -> list[SpooledRecord]:
        batch = super().read_batch(sink, limit)
        if batch and self.late:
            late, self.late = self.late, []
            self.commit(late)
        return batch


def test_a_record_spooled_while_held_records_are_read_still_wakes_the_hold(
    tmp_path: Path,
) -> None:
    sink = HoldingSink("holding", max_batch=5)
    spool = AppendingWhileRead(tmp_path / "spool.db", [sink.name])
    delivery = Delivery(spool, [sink], backoff_factory=fast_backoff, wait=RecordingWait())
    delivery.start()
    try:
        spool.commit([rec(1)])
        eventually(lambda: sink.delivered == ["r1"])
        spool.late = [rec(3)]  # cannot wait: appended just after the heartbeat below is read
        spool.commit([rec(2, "Heartbeat")])
        eventually(lambda: sink.delivered == ["r1", "r2", "r3"], timeout=5.0)
    finally:
        delivery.stop(10)
        spool.close()
