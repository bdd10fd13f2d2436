"""Benchmark 8's queue reads (tests/benchmarks/bench_quota.py): the burst an agent reads as an
event that affects it appears, apart from the steady rate while the event is pending."""

from __future__ import annotations

import pytest

from tests.benchmarks.bench_quota import queue_reads


def _run(start: float, pending: float) -> list[float]:
    """An agent's reads for one event: every 0.2 s for 3 s, then every second while pending."""
    return [start + i * 0.2 for i in range(15)] + [start + 3.0 + i for i in range(int(pending) - 3)]


def test_the_reads_of_an_events_first_seconds_are_its_burst_and_the_rest_the_steady_rate() -> None:
    reads = queue_reads({"vm-0": _run(10.0, 20), "vm-1": _run(11.5, 20), "vm-2": []})
    assert (reads.events, reads.short) == (2, 0)
    assert reads.per_second == pytest.approx(1.0)
    # 15 reads in the first 3 s where the steady rate would have made 3.
    assert reads.per_event == pytest.approx(12.0)


def test_a_vm_that_stops_reading_and_starts_again_had_a_second_event() -> None:
    reads = queue_reads({"vm-0": _run(10.0, 20) + _run(60.0, 10)})
    assert reads.events == 2
    assert reads.per_second == pytest.approx(1.0)
    assert reads.per_event == pytest.approx(12.0)


def test_an_event_approved_within_its_burst_tells_neither_and_is_left_out() -> None:
    reads = queue_reads({"vm-0": _run(10.0, 20), "vm-1": [20.0, 20.2, 20.4]})
    assert (reads.events, reads.short) == (1, 1)
    assert reads.per_event == pytest.approx(12.0)


def test_reads_with_no_event_pending_past_its_burst_measure_nothing() -> None:
    with pytest.raises(RuntimeError, match="no event"):
        queue_reads({"vm-0": [20.0, 20.2, 20.4]})
