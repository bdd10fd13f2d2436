"""What an idle fleet and the read marks (bridge/consumer/reading.py) cost the fleet state
(issue 35).

A mark per partition says how far the consumer has read it, so that the release rule takes a
VM as silent only as far as its partition was read. Written and read per batch, the marks
made an idle heartbeat cost about 21 Table Storage requests instead of 5 (benchmark 8). Here
a recording store counts every request the real consumer core makes, on a state whose looks
cost a query (Table Storage's pace, `feed_interval`), with the clock moved by hand.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from bridge.config import ConsumerSettings
from bridge.consumer.core import Consumer
from bridge.consumer.reading import PARTITION, Position, mark_pace
from bridge.consumer.state import Doc
from bridge.consumer.state.sqlite import SqliteStore
from bridge.policy.model import DEFAULT_POLICY
from tests.component.consumer.test_core import E1, Rig
from tests.component.consumer.test_lagging import (
    ONE_PER_SET,
    minutes_reading_b,
    preempt_web_0,
    released,
    web_set,
)

A, B = "hub/a", "hub/b"
BEAT = 30  # seconds between one VM's heartbeats (benchmark 8's idle run)
TICK = 5  # consumer.reevaluate_interval's default


class Recording(SqliteStore):
    """A fleet state that counts every request by (call, collection), as Table Storage
    would bill it; a look for changes costs a query there, so it is paced (`feed_interval`)."""

    feed_interval = 15.0

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.requests: Counter[tuple[str, str]] = Counter()
        self._inner = 0  # write() is write_many() of one: counted once

    def read(self, collection: str, key: str) -> Doc | None:
        self.requests["read", collection] += 1
        return super().read(collection, key)

    def read_many(self, collection: str, keys: Sequence[str]) -> dict[str, Doc]:
        self.requests["read", collection] += 1
        return super().read_many(collection, keys)

    def write(self, collection: str, doc: Doc) -> Doc:
        self.requests["write", collection] += 1
        self._inner += 1
        try:
            return super().write(collection, doc)
        finally:
            self._inner -= 1

    def write_many(self, collection: str, docs: Sequence[Doc]) -> tuple[list[Doc], list[str]]:
        if not self._inner:
            self.requests["write", collection] += 1
        return super().write_many(collection, docs)

    def delete(self, collection: str, doc: Doc) -> None:
        self.requests["delete", collection] += 1
        super().delete(collection, doc)

    def scan(self, collection: str) -> list[Doc]:
        self.requests["read", collection] += 1
        return super().scan(collection)

    def scan_changes(
        self, collection: str, since: int | None, known: Mapping[str, Doc] | None = None
    ) -> tuple[list[Doc], int]:
        self.requests["read", collection] += 1
        return super().scan_changes(collection, since, known)

    @contextmanager
    def counting(self) -> Iterator[Counter[tuple[str, str]]]:
        """The requests made inside the block."""
        before = Counter(self.requests)
        found: Counter[tuple[str, str]] = Counter()
        yield found
        found.update(self.requests - before)


def on_partitions(requests: Counter[tuple[str, str]]) -> Counter[str]:
    return Counter(
        {call: n for (call, collection), n in requests.items() if collection == PARTITION}
    )


def idle_consumer(tmp_path: Path) -> tuple[Rig, Recording, Consumer]:
    rig = Rig(tmp_path / "rig.db")
    store = Recording(tmp_path / "fleet.db")
    consumer = rig.make(DEFAULT_POLICY, store=store)
    rig.fleet.vm("web_0", scale_set="web")
    rig.fleet.vm("web_1", scale_set="web")
    return rig, store, consumer


def test_an_idle_heartbeat_costs_one_request_and_none_on_a_partition_document(
    tmp_path: Path,
) -> None:
    rig, store, consumer = idle_consumer(tmp_path)
    consumer.process([rig.fleet.heartbeat("web_0")], Position(A, rig.fleet.now))
    consumer.tick()
    # Ten minutes of heartbeats, each handed over as its partition was read to its end, and
    # between them the empty batches a source hands over to say an idle partition is read
    # to its end, and the re-evaluation passes.
    beats: list[Counter[tuple[str, str]]] = []
    for second in range(TICK, 600 + TICK, TICK):
        rig.fleet.advance(TICK)
        if second % BEAT == 0:
            with store.counting() as one:
                consumer.process([rig.fleet.heartbeat("web_0")], Position(A, rig.fleet.now))
            beats.append(one)
        else:
            with store.counting() as empty:
                consumer.process([], Position(B, rig.fleet.now))
            # An empty batch only says B is read to its end: at most its mark, now and then.
            assert set(empty) <= {("write", PARTITION)}, dict(empty)
        consumer.tick()
    assert len(beats) == 20
    for one in beats:
        assert on_partitions(one)["read"] == 0, dict(one)
    # The VM's document, written; A's mark now and then (at its pace, not at every batch).
    assert max(sum(one.values()) for one in beats) <= 2
    pace = mark_pace(ConsumerSettings().alive_within).total_seconds()
    assert sum(sum(one.values()) for one in beats) <= len(beats) + 600 / pace + 1


def test_an_idle_fleet_costs_the_state_at_most_5_requests_a_heartbeat(tmp_path: Path) -> None:
    # Benchmark 8's idle run: three VMs heartbeating every 30 s, their partition and an idle
    # one read to the end, and the re-evaluation passes every 5 s, with nothing open. On
    # Table Storage the passes' looks (the ledger's and the events' change feeds), not the
    # heartbeats, were most of it: 2 requests every 5 s (issue 35).
    rig, store, consumer = idle_consumer(tmp_path)
    rig.fleet.vm("web_2", scale_set="web")
    names = ("web_0", "web_1", "web_2")
    consumer.process([rig.fleet.heartbeat(name) for name in names], Position(A, rig.fleet.now))
    consumer.tick()
    beats = 0
    with store.counting() as idle:
        for second in range(TICK, 600 + TICK, TICK):
            rig.fleet.advance(TICK)
            for i, name in enumerate(names):
                if second % BEAT == i * 10:
                    consumer.process([rig.fleet.heartbeat(name)], Position(A, rig.fleet.now))
                    beats += 1
            consumer.process([], Position(B, rig.fleet.now))
            consumer.tick()
    assert beats == 60
    assert sum(idle.values()) <= 5 * beats, dict(idle)


def test_read_marks_are_written_at_a_pace_with_no_read_and_read_back_only_when_asked(
    tmp_path: Path,
) -> None:
    rig, store, consumer = idle_consumer(tmp_path)
    pace = mark_pace(ConsumerSettings().alive_within).total_seconds()
    assert 30 <= pace <= ConsumerSettings().alive_within / 5  # slower than every batch; a
    # consumer that reads no partition of a VM releases its event at most 2 paces later
    with store.counting() as marks:
        # Ten minutes of both partitions read to their end every 0.2 s would be 6,000
        # batches: one a second here, and the passes every 5 s.
        for second in range(1, 601):
            rig.fleet.advance(1)
            consumer.process([], Position(A, rig.fleet.now))
            consumer.process([], Position(B, rig.fleet.now))
            if second % TICK == 0:
                consumer.tick()
    written = on_partitions(marks)
    # Each partition's mark at most once per pace (the first write of each reads what is
    # there, perhaps another consumer's further mark; then its ETag is kept).
    assert written["write"] <= 2 * (600 / pace + 1)
    assert written["write"] >= 2 * (600 / pace - 1)  # the marks do move
    assert written["read"] <= 2
    # No event asked the release rule about a VM: the others' marks were never read back.
    assert store.requests["read", PARTITION] <= 2


def test_another_consumers_marks_are_read_back_by_the_pass_at_a_pace_never_by_a_batch(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path / "fleet.db", ONE_PER_SET)
    store = Recording(tmp_path / "fleet.db")
    consumer = rig.consumer = rig.make(ONE_PER_SET, store=store)
    reader = rig.make(ONE_PER_SET)  # reads A (web_0's), writes its marks to the state
    web_set(rig, reader)
    preempt_web_0(rig, reader)
    pace = mark_pace(ConsumerSettings().alive_within).total_seconds()
    batches: Counter[tuple[str, str]] = Counter()
    ticks: list[int] = []
    real_process = consumer.process

    def counted_process(records: Sequence[Mapping[str, object]], position: Position | None = None,
                        ) -> None:  # fmt: skip
        with store.counting() as one:
            real_process(records, position)
        batches.update(one)

    consumer.process = counted_process  # type: ignore[method-assign]
    real_tick = consumer.tick

    def counted_tick() -> None:
        with store.counting() as one:
            real_tick()
        ticks.append(on_partitions(one)["read"])

    consumer.tick = counted_tick  # type: ignore[method-assign]
    minutes_reading_b(rig, 13, also=reader.tick)  # the reader of A is held back
    assert released(rig, E1) == []
    # A is read to its end, and its reader's pass writes the mark; the other consumer's
    # passes read it back within a pace, and release the slot.
    for _ in range(int(2 * pace / TICK) + 2):
        rig.fleet.advance(TICK)
        reader.process([], Position(A, rig.fleet.now))
        reader.tick()
        rig.consumer.tick()
    assert len(released(rig, E1)) == 1
    assert on_partitions(batches)["read"] == 0  # no batch read a mark
    assert sum(ticks) <= (13 * 60 + 2 * pace) / pace + 2  # the passes: at the pace
