"""The local hub: the hub sink writing, LocalHub reading, and run_local handing batches over."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge import localhub
from bridge.consumer.reading import Position, local_partition
from bridge.consumer.sources.hub import run_local
from bridge.localhub import NOTHING, PARTITIONS, LocalHub, partition_for
from bridge.records import utc_now
from bridge.retry import Backoff, RetryableError, ThrottledError
from bridge.sinks import KINDS, SpooledRecord, build
from bridge.sinks.hub import HubSink
from tests.support.wait import eventually

ROOT = Path(__file__).resolve().parents[2]
FAST = {"poll_interval": 0.02, "backoff_factory": lambda: Backoff(initial=0.01, maximum=0.02)}


def spooled(seq: int, vm: str) -> SpooledRecord:
    body = json.dumps({"RecordId": f"{vm}-{seq}", "VmId": vm, "N": seq})
    return SpooledRecord(seq, f"{vm}-{seq}", "Event", body)


@pytest.fixture
def hub_dir(tmp_path: Path) -> Path:
    return tmp_path / "hub"


@pytest.fixture
def sink(hub_dir: Path) -> Iterator[HubSink]:
    built = build(f"hub:{hub_dir}")
    assert isinstance(built, HubSink)
    yield built
    built.close()


@pytest.fixture
def hub(hub_dir: Path) -> Iterator[LocalHub]:
    with LocalHub(hub_dir) as opened:
        yield opened


def everything(hub: LocalHub) -> dict[int, list[tuple[int, dict[str, Any]]]]:
    return {
        p: [(offset, json.loads(body)) for offset, body in hub.read(p, NOTHING, 10**6)]
        for p in range(PARTITIONS)
    }


class Consumer:
    """run_local in a thread, recording what it hands over."""

    def __init__(
        self, hub_dir: Path, handler: Callable[[list[dict[str, Any]]], None] | None = None
    ):
        self.batches: list[list[dict[str, Any]]] = []
        self.positions: list[Position] = []
        self.poisoned: list[tuple[str, str, str, str]] = []
        self.stop = threading.Event()
        self._handler = handler
        self.thread = threading.Thread(
            target=run_local,
            args=(hub_dir, self._handle, self.stop),
            kwargs={"poison": lambda *args: self.poisoned.append(args), **FAST},
        )

    def _handle(self, records: list[dict[str, Any]], position: Position) -> None:
        self.positions.append(position)
        if not records:
            return  # only how far a partition was read
        self.batches.append(records)
        if self._handler is not None:
            self._handler(records)

    @property
    def records(self) -> list[dict[str, Any]]:
        return [record for batch in self.batches for record in batch]

    def __enter__(self) -> Consumer:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(5)
        assert not self.thread.is_alive(), "run_local did not stop"


# --- the sink and the reader ----------------------------------------------------------------


def test_the_spec_takes_a_directory() -> None:
    kind, argument = KINDS.parse("hub:/var/lib/se-bridge/hub")
    assert (kind.name, argument) == ("hub", "/var/lib/se-bridge/hub")
    with pytest.raises(ValueError, match="needs a directory"):
        KINDS.parse("hub:")


def test_each_vm_keeps_its_order_in_one_of_four_partitions(sink: HubSink, hub: LocalHub) -> None:
    vms = [f"vm-{n}" for n in range(12)]
    batch = [spooled(seq, vms[seq % len(vms)]) for seq in range(1, 61)]
    sink.send(batch[:25])
    sink.send(batch[25:])

    stored = everything(hub)
    assert {p for p, rows in stored.items() if rows} == set(range(PARTITIONS))
    for partition, rows in stored.items():
        assert [offset for offset, _ in rows] == list(range(len(rows)))  # dense, from 0
        assert all(partition_for(record["VmId"]) == partition for _, record in rows)
    for vm in vms:
        mine = [r["N"] for _, r in stored[partition_for(vm)] if r["VmId"] == vm]
        assert mine == [s.seq for s in batch if json.loads(s.body)["VmId"] == vm]


def test_the_partition_of_a_key_is_pinned() -> None:
    # crc32, not hash(): Python salts str hashes per process, which would scatter a VM's
    # records, and a change of function would reorder what a hub already holds.
    assert partition_for("02aab8a4-74ef-476e-8182-f6d2ba4166a6") == 1
    assert [partition_for(f"vm-{n}") for n in range(4)] == [0, 2, 0, 2]


def test_checkpoints_survive_reopening_and_are_per_group(hub_dir: Path) -> None:
    with LocalHub(hub_dir) as hub:
        assert hub.checkpoints("$Default") == dict.fromkeys(range(PARTITIONS), NOTHING)
        hub.checkpoint("$Default", 2, 5)
        hub.checkpoint("$Default", 2, 7)
        hub.checkpoint("audit", 0, 1)
    with LocalHub(hub_dir) as hub:
        assert hub.checkpoints("$Default") == {0: NOTHING, 1: NOTHING, 2: 7, 3: NOTHING}
        assert hub.checkpoints("audit") == {0: 1, 1: NOTHING, 2: NOTHING, 3: NOTHING}


_WRITER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from bridge.retry import RetryableError
    from bridge.sinks import SpooledRecord
    from bridge.sinks.hub import HubSink

    hub_dir, name, batches = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    sink = HubSink(hub_dir)
    while not (hub_dir / "go").exists():
        time.sleep(0.005)
    seq = 0
    for _ in range(batches):
        batch = []
        for _ in range(5):
            seq += 1
            vm = f"{name}-vm{seq % 7}"
            body = json.dumps({"RecordId": f"{name}-{seq}", "VmId": vm, "N": seq})
            batch.append(SpooledRecord(seq, f"{name}-{seq}", "Event", body))
        while True:
            try:
                sink.send(batch)
                break
            except RetryableError as err:  # as the delivery loop would
                print(err, file=sys.stderr)
                time.sleep(0.01)
    sink.close()
    """
)


def test_two_writer_processes_at_once_lose_nothing(hub_dir: Path, hub: LocalHub) -> None:
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(hub_dir), name, "100"],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    (hub_dir / "go").touch()  # both start appending at the same moment
    for writer in writers:
        _, errors = writer.communicate(timeout=120)
        assert writer.returncode == 0, errors

    stored = everything(hub)
    for rows in stored.values():
        assert [offset for offset, _ in rows] == list(range(len(rows)))
    records = [record for rows in stored.values() for _, record in rows]
    assert sorted(r["RecordId"] for r in records) == sorted(
        f"{name}-{n}" for name in ("a", "b") for n in range(1, 501)
    )
    for name in ("a", "b"):
        for vm in range(7):
            mine = [r["N"] for r in records if r["VmId"] == f"{name}-vm{vm}"]
            assert mine == sorted(mine)


def test_a_hub_locked_past_the_busy_timeout_is_a_retryable_failure(
    sink: HubSink, hub_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(localhub, "BUSY_TIMEOUT_MS", 50)
    sink.send([spooled(1, "vm-1")])  # creates the hub
    sink.close()
    blocker = sqlite3.connect(hub_dir / "hub.db", isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(RetryableError, match="database is locked"):
            sink.send([spooled(2, "vm-1")])
        blocker.execute("ROLLBACK")
    finally:
        blocker.close()
    sink.send([spooled(2, "vm-1")])
    with LocalHub(hub_dir) as hub:
        assert [json.loads(body)["N"] for _, body in hub.read(partition_for("vm-1"), -1, 10)] == [
            1,
            2,
        ]


def test_check_writes_nothing_not_even_the_hub(sink: HubSink, hub_dir: Path) -> None:
    assert f"{hub_dir} does not exist yet" in sink.check()
    assert not hub_dir.exists()
    with LocalHub(hub_dir) as hub:
        assert everything(hub) == {p: [] for p in range(PARTITIONS)}
    before = sorted(p.name for p in hub_dir.iterdir())
    assert "can be appended to" in sink.check()
    assert sorted(p.name for p in hub_dir.iterdir()) == before


# --- run_local ------------------------------------------------------------------------------


def test_every_record_is_handed_over_in_partition_order_and_checkpointed(
    sink: HubSink, hub: LocalHub, hub_dir: Path
) -> None:
    sink.send([spooled(seq, f"vm-{seq % 5}") for seq in range(1, 251)])
    with Consumer(hub_dir) as consumer:
        eventually(lambda: len(consumer.records) == 250)
        eventually(lambda: sum(hub.checkpoints("$Default").values()) == 250 - PARTITIONS)

    assert all(len(batch) <= 100 for batch in consumer.batches)
    for vm in range(5):
        mine = [r["N"] for r in consumer.records if r["VmId"] == f"vm-{vm}"]
        assert mine == [n for n in range(1, 251) if n % 5 == vm]
    assert consumer.poisoned == []


def test_a_partition_is_read_to_its_end_when_a_read_returns_less_than_it_asked_for(
    hub: LocalHub, hub_dir: Path
) -> None:
    # 150 records of one VM: a full batch of 100 (more may follow), then 50 (the end).
    partition = partition_for("vm-1")
    hub.append([("vm-1", json.dumps({"RecordId": f"r{n}", "VmId": "vm-1"})) for n in range(150)])
    before = utc_now()
    with Consumer(hub_dir) as consumer:
        eventually(lambda: len(consumer.records) == 150)
        eventually(lambda: len({p.partition for p in consumer.positions}) == PARTITIONS)
    name = local_partition(str(hub_dir.resolve()), partition)
    mine = [p for p in consumer.positions if p.partition == name]
    assert mine[0].caught_up is None  # the full batch
    assert all(p.caught_up is not None and p.caught_up >= before for p in mine[1:])
    others = {p.partition for p in consumer.positions if p.caught_up is not None} - {name}
    assert others == {local_partition(str(hub_dir.resolve()), p) for p in range(PARTITIONS)
                      if p != partition}  # fmt: skip


def test_a_second_run_resumes_after_the_checkpoint(sink: HubSink, hub_dir: Path) -> None:
    sink.send([spooled(seq, f"vm-{seq % 3}") for seq in range(1, 11)])
    with Consumer(hub_dir) as first:
        eventually(lambda: len(first.records) == 10)
    sink.send([spooled(seq, f"vm-{seq % 3}") for seq in range(11, 16)])
    with Consumer(hub_dir) as second:
        eventually(lambda: len(second.records) == 5)
        time.sleep(0.1)  # anything handed over twice would show up by now
    assert sorted(r["N"] for r in second.records) == list(range(11, 16))


def test_a_body_that_is_not_a_record_goes_to_the_poison_callback_and_is_skipped(
    hub: LocalHub, hub_dir: Path
) -> None:
    good = [json.dumps({"RecordId": f"r{n}", "VmId": "vm-1"}) for n in range(3)]
    hub.append([("vm-1", good[0]), ("vm-1", "not json {"), ("vm-1", good[1]), ("vm-1", "[1, 2]")])
    hub.append([("vm-1", good[2])])
    partition = str(partition_for("vm-1"))
    with Consumer(hub_dir) as consumer:
        eventually(lambda: len(consumer.records) == 3)
        eventually(lambda: hub.checkpoints("$Default")[int(partition)] == 4)

    assert [r["RecordId"] for r in consumer.records] == ["r0", "r1", "r2"]
    assert [p[:3] for p in consumer.poisoned] == [
        (partition, "1", "not json {"),
        (partition, "3", "[1, 2]"),
    ]
    assert "not JSON" in consumer.poisoned[0][3]
    assert "list, not an object" in consumer.poisoned[1][3]


def test_a_failing_batch_is_retried_and_checkpointed_only_after_success(
    hub: LocalHub, hub_dir: Path
) -> None:
    hub.append([("vm-1", json.dumps({"RecordId": f"r{n}", "VmId": "vm-1"})) for n in range(3)])
    partition = partition_for("vm-1")
    seen_checkpoints: list[int] = []

    def fail_twice(_records: list[dict[str, Any]]) -> None:
        with LocalHub(hub_dir) as other:  # as another process would see it
            seen_checkpoints.append(other.checkpoints("$Default")[partition])
        if len(seen_checkpoints) <= 2:
            raise (RetryableError if len(seen_checkpoints) == 1 else ThrottledError)("busy")

    with Consumer(hub_dir, fail_twice) as consumer:
        eventually(lambda: hub.checkpoints("$Default")[partition] == 2)
        time.sleep(0.1)

    assert len(consumer.batches) == 3
    assert all([r["RecordId"] for r in b] == ["r0", "r1", "r2"] for b in consumer.batches)
    assert seen_checkpoints == [NOTHING] * 3


def test_an_unexpected_handler_error_does_not_end_the_loop(hub: LocalHub, hub_dir: Path) -> None:
    hub.append([("vm-1", json.dumps({"RecordId": "r0", "VmId": "vm-1"}))])
    calls: list[int] = []

    def buggy(_records: list[dict[str, Any]]) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("a bug in the handler")

    with Consumer(hub_dir, buggy):
        eventually(lambda: hub.checkpoints("$Default")[partition_for("vm-1")] == 0)
    assert len(calls) == 2


def test_stop_interrupts_a_backoff_at_once(hub: LocalHub, hub_dir: Path) -> None:
    hub.append([("vm-1", json.dumps({"RecordId": "r0", "VmId": "vm-1"}))])

    calls: list[int] = []

    def throttled(records: list[dict[str, Any]], _position: Position) -> None:
        if not records:
            return  # a partition with nothing to read
        calls.append(1)
        raise ThrottledError("slow down", retry_after=30)

    stop = threading.Event()
    slow = {"poll_interval": 0.02, "backoff_factory": lambda: Backoff(initial=30, maximum=60)}
    thread = threading.Thread(target=run_local, args=(hub_dir, throttled, stop), kwargs=slow)
    thread.start()
    eventually(lambda: len(calls) == 1)
    time.sleep(0.05)  # well inside the 30 s wait
    started = time.monotonic()
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - started < 0.5
    assert calls == [1]
    assert hub.checkpoints("$Default")[partition_for("vm-1")] == NOTHING


def test_a_hub_that_cannot_be_opened_is_retried_until_it_can(tmp_path: Path) -> None:
    hub_dir = tmp_path / "hub"
    hub_dir.write_text("a file where the directory should be")
    with Consumer(hub_dir) as consumer:
        time.sleep(0.1)  # failing and backing off, not dead
        assert consumer.thread.is_alive()
        hub_dir.unlink()
        with LocalHub(hub_dir) as hub:
            hub.append([("vm-1", json.dumps({"RecordId": "r0", "VmId": "vm-1"}))])
        eventually(lambda: len(consumer.records) == 1)


def test_a_record_in_another_vms_name_goes_to_the_poison_callback(
    hub: LocalHub, hub_dir: Path
) -> None:
    mine = json.dumps({"RecordId": "r0", "VmId": "vm-1"})
    forged = json.dumps({"RecordId": "r1", "VmId": "vm-2"})
    hub.append([("vm-1", mine), ("vm-1", forged)])
    with Consumer(hub_dir) as consumer:
        eventually(lambda: len(consumer.poisoned) == 1)
        eventually(lambda: len(consumer.records) == 1)
    assert [r["RecordId"] for r in consumer.records] == ["r0"]
    assert consumer.poisoned[0][2] == forged
    assert "does not match the sender's partition key 'vm-1'" in consumer.poisoned[0][3]
