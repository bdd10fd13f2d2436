"""The Event Hubs callback writes a partition's checkpoint at most once per interval, and says
how far each partition has been read (bridge/consumer/reading.py).

Fakes stand in for the SDK's PartitionContext and EventData (the real ones, against the
test broker and Azurite, are in tests/integration/consumer/test_eventhubs_source.py); the clock is
moved by hand.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from bridge.config import Config
from bridge.consumer.reading import Position
from bridge.consumer.sources import eventhubs as eventhubs_source
from bridge.consumer.sources.batches import BatchRetry
from tests.support.wait import eventually

Handled = list[list[dict[str, Any]]]
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)


@dataclass
class Event:
    """What _OnBatch reads of an EventData (a DATA body, as the agent's sink sends)."""

    offset: int
    partition_key: bytes = b"vm-1"
    sequence_number: int = 0
    enqueued_time: datetime = T0
    body_type: Any = None
    body: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        from azure.eventhub.amqp import AmqpMessageBodyType

        self.body_type = AmqpMessageBodyType.DATA
        self.body = [json.dumps({"RecordId": f"r{self.offset}", "VmId": "vm-1"}).encode()]
        self.sequence_number = self.sequence_number or self.offset


@dataclass
class Context:
    partition_id: str = "0"
    eventhub_name: str = "records"
    fully_qualified_namespace: str = "ns.servicebus.windows.net"
    written: list[int] = field(default_factory=list)
    fail: bool = False

    def update_checkpoint(self, event: Event) -> None:
        if self.fail:
            raise OSError("storage unreachable")
        self.written.append(event.offset)


class Reason:
    def __init__(self, name: str) -> None:
        self.name = name


@pytest.fixture
def clock() -> list[float]:
    return [1000.0]


def on_batch(handled: Handled, interval: float, clock: list[float], *,
             positions: list[Position] | None = None,
             probe: Any = None) -> Any:  # fmt: skip
    def handle(records: list[dict[str, Any]], position: Position) -> None:
        if records:
            handled.append(records)
        if positions is not None:
            positions.append(position)

    retry = BatchRetry(handle, lambda *_: None, threading.Event(), "event hub test")
    return eventhubs_source._OnBatch(
        Config(), retry, retry.backoff, interval=interval, clock=lambda: clock[0], probe=probe
    )


def test_the_first_batch_is_checkpointed_the_next_ones_once_the_interval_passed(
    clock: list[float],
) -> None:
    handled: Handled = []
    callback, context = on_batch(handled, 5.0, clock), Context()
    callback(context, [Event(1), Event(2)])
    clock[0] += 1
    callback(context, [Event(3)])
    clock[0] += 1
    callback(context, [])  # the SDK's call once max_wait_time passed with nothing new
    assert context.written == [2]
    clock[0] += 3
    callback(context, [])
    assert context.written == [2, 3]
    callback(context, [])
    assert context.written == [2, 3]  # nothing held: nothing written again
    assert [[r["RecordId"] for r in batch] for batch in handled] == [["r1", "r2"], ["r3"]]


def test_an_interval_of_zero_checkpoints_every_batch(clock: list[float]) -> None:
    callback, context = on_batch([], 0.0, clock), Context()
    for offset in (1, 2, 3):
        callback(context, [Event(offset)])
    assert context.written == [1, 2, 3]


def test_partitions_have_their_own_interval(clock: list[float]) -> None:
    callback = on_batch([], 5.0, clock)
    zero, one = Context("0"), Context("1")
    callback(zero, [Event(1)])
    callback(one, [Event(7)])
    assert (zero.written, one.written) == ([1], [7])


def test_a_held_checkpoint_is_written_at_shutdown_not_when_ownership_is_lost(
    clock: list[float],
) -> None:
    callback, context = on_batch([], 5.0, clock), Context()
    callback(context, [Event(1)])
    callback(context, [Event(2)])
    callback.closed(context, Reason("SHUTDOWN"))
    assert context.written == [1, 2]

    lost = Context("1")
    callback(lost, [Event(1)])
    callback(lost, [Event(2)])
    callback.closed(lost, Reason("OWNERSHIP_LOST"))
    assert lost.written == [1]  # the new owner reads offset 2 again; deduplicated downstream


def test_a_failed_checkpoint_at_shutdown_is_said_and_does_not_raise(
    clock: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="bridge.consumer.sources.eventhubs")
    callback, context = on_batch([], 5.0, clock), Context()
    callback(context, [Event(1)])
    callback(context, [Event(2)])
    context.fail = True
    callback.closed(context, Reason("SHUTDOWN"))
    assert "reads its last records again" in caplog.text


class Partition:
    """The service's answer about a partition (get_partition_properties), counting questions."""

    def __init__(self, last: int) -> None:
        self.last, self.asked = last, 0

    def __call__(self, partition_id: str) -> Mapping[str, Any]:
        self.asked += 1
        return {"last_enqueued_sequence_number": self.last, "is_empty": self.last < 0}


def idle_rounds(callback: Any, context: Context, service: Partition, asked: int) -> None:
    """The SDK's empty callbacks for an idle partition until `service` was asked `asked`
    times in all, and one more: the one that takes the answer."""
    eventually(lambda: callback(context, []) or service.asked >= asked,
               what=f"question {asked} to the partition", timeout=30)  # fmt: skip
    callback(context, [])


def test_a_batch_is_read_up_to_its_newest_event_and_an_idle_partition_to_its_end(
    clock: list[float],
) -> None:
    positions: list[Position] = []
    service = Partition(last=3)
    callback = on_batch([], 5.0, clock, positions=positions, probe=service)
    context = Context()
    newest = T0 + timedelta(seconds=2)
    callback(context, [Event(1), Event(2, enqueued_time=newest), Event(3, enqueued_time=T0)])
    where = "ns.servicebus.windows.net/records/0"
    assert positions == [Position(where, newest)]
    # Idle: asked once per PROBE_EVERY; event 3 was the last and was handled.
    before = datetime.now(timezone.utc)
    idle_rounds(callback, context, service, 1)
    callback(context, [])
    assert service.asked == 1
    [idle] = positions[1:]
    assert idle.partition == where
    assert idle.caught_up is not None
    assert idle.caught_up >= before
    # More came than was handled (the link is slow or down): no mark.
    service.last = 9
    clock[0] += eventhubs_source.PROBE_EVERY
    idle_rounds(callback, context, service, 2)
    assert service.asked == 2
    assert len(positions) == 2


def test_a_partition_with_nothing_handled_since_it_was_taken_over_is_read_to_no_known_end(
    clock: list[float],
) -> None:
    positions: list[Position] = []
    service = Partition(last=3)
    callback = on_batch([], 5.0, clock, positions=positions, probe=service)
    idle_rounds(callback, Context(), service, 1)
    assert (service.asked, positions) == (1, [])
    service.last = -1  # an empty partition is read to its end
    clock[0] += eventhubs_source.PROBE_EVERY
    idle_rounds(callback, Context(), service, 2)
    assert [p.caught_up is not None for p in positions] == [True]


def test_a_question_to_an_idle_partition_holds_no_other_partitions_batch_back(
    clock: list[float],
) -> None:
    # The SDK serves every partition in one thread. A question to an idle partition opens a
    # management link (about 0.5 s); asked in that thread, it held every other partition's
    # batches back meanwhile: an approval's Event record waited for it (issue 35).
    handled: Handled = []
    positions: list[Position] = []
    asking, answer = threading.Event(), threading.Event()

    def slow(partition_id: str) -> Mapping[str, Any]:
        asking.set()
        answer.wait(60)
        return {"last_enqueued_sequence_number": 1, "is_empty": False}

    callback = on_batch(handled, 5.0, clock, positions=positions, probe=slow)
    idle, busy = Context("0"), Context("1")
    callback(idle, [Event(1)])
    receive = threading.Thread(target=lambda: (callback(idle, []), callback(busy, [Event(7)])))
    receive.start()  # the receive thread: the idle partition's turn, then the busy one's
    try:
        eventually(lambda: asking.is_set() and len(handled) == 2, timeout=30,
                   what="the busy partition's batch handed over during the question",
                   details=lambda: f"asked {asking.is_set()}, batches {len(handled)}")  # fmt: skip
    finally:
        answer.set()
        receive.join()

    # The answer is taken at the idle partition's next empty round: read to its end.
    def read_to_end() -> bool:
        callback(idle, [])
        return len([p for p in positions if p.partition.endswith("/0")]) == 2

    eventually(read_to_end, timeout=30, what="the idle partition read to its end")


def test_a_record_waits_at_most_a_tenth_of_a_second_for_the_sdk_to_hand_it_over() -> None:
    # The SDK serves the partitions in turn, each turn waiting up to the socket timeout for
    # frames, and hands a partition's batch over once the batch wait has passed since its
    # last callback: a record enqueued just after its partition's turn waits a round of the
    # others' turns and the batch wait. At 0.05 s and 0.1 s that was up to 0.3 s on the
    # default 4 partitions, most of benchmark 3's record → decision tail (issue 35).
    assert eventhubs_source.handover_wait(partitions=4) <= 0.1
    # ... at the price of more wake-ups of an idle consumer (docs/capacity.md), bounded:
    assert eventhubs_source.SOCKET_TIMEOUT >= 0.01
