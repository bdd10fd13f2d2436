"""The Event Hubs callback writes a partition's checkpoint at most once per interval.

Fakes stand in for the SDK's PartitionContext and EventData (the real ones, against the
test broker and Azurite, are in tests/integration/consumer/test_eventhubs_source.py); the clock is
moved by hand.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from bridge.config import Config
from bridge.consumer.sources import eventhubs as eventhubs_source
from bridge.consumer.sources.batches import BatchRetry

Handled = list[list[dict[str, Any]]]


@dataclass
class Event:
    """What _OnBatch reads of an EventData (a DATA body, as the agent's sink sends)."""

    offset: int
    partition_key: bytes = b"vm-1"
    body_type: Any = None
    body: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        from azure.eventhub.amqp import AmqpMessageBodyType

        self.body_type = AmqpMessageBodyType.DATA
        self.body = [json.dumps({"RecordId": f"r{self.offset}", "VmId": "vm-1"}).encode()]


@dataclass
class Context:
    partition_id: str = "0"
    eventhub_name: str = "records"
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


def on_batch(handled: Handled, interval: float, clock: list[float]) -> Any:
    retry = BatchRetry(handled.append, lambda *_: None, threading.Event(), "event hub test")
    return eventhubs_source._OnBatch(
        Config(), retry, retry.backoff, interval=interval, clock=lambda: clock[0]
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
