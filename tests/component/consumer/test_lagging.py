"""A consumer behind on a partition releases nothing there (issue 27, item 5).

The release rule frees the slot of an event whose VMs have all been silent for
`consumer.alive_within`. A consumer that is behind on the partition carrying a VM's records
has not read what the VM said meanwhile: for it the VM is silent only as far as it has read
the partition to its end. Each test drives the real consumer core over a real SQLite state,
handing it batches as a source does: with the partition they were read from and how far
that partition had been read (`Position`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bridge.config import ConsumerSettings
from bridge.consumer.core import Consumer
from bridge.consumer.reading import Position, mark_pace
from bridge.policy.model import Action, Budget, Match, Policy, Rule
from tests.component.consumer.test_core import E1, E2, Rig

ONE_PER_SET = Policy(
    rules=(Rule("all", Match(), Action("approve")),),
    budgets=(Budget("one", "scale_set", max_vms=1),),
)
A, B = "hub/a", "hub/b"  # web_0's records come on A, web_1's on B


def feed(consumer: Consumer, rig: Rig, partition: str, records: list[dict[str, Any]],
         *, caught_up: bool = True) -> None:  # fmt: skip
    """Hand over a batch of `partition`; `caught_up`: the source has read it to its end now."""
    consumer.process(records, Position(partition, rig.fleet.now if caught_up else None))


def web_set(rig: Rig, reader: Consumer | None = None, *, caught_up: bool = True) -> None:
    """web_0 and web_1 of scale set web, heard; `reader` reads A (default: the rig's consumer)."""
    rig.fleet.vm("web_0", scale_set="web")
    rig.fleet.vm("web_1", scale_set="web")
    feed(reader or rig.consumer, rig, A, [rig.fleet.heartbeat("web_0")], caught_up=caught_up)
    feed(rig.consumer, rig, B, [rig.fleet.heartbeat("web_1")])


def preempt_web_0(rig: Rig, reader: Consumer | None = None, *, caught_up: bool = True) -> None:
    """web_0 is evicted (its Preempt Started is read) and deleted: it never speaks again."""
    preempt = rig.fleet.event("web_0", E1, transition="Started", event_type="Preempt",
                              source="Platform")  # fmt: skip
    feed(reader or rig.consumer, rig, A, [preempt], caught_up=caught_up)


def minutes_reading_b(rig: Rig, minutes: int, *, also: Callable[[], None] = lambda: None) -> None:
    """`minutes` of web_1's heartbeats, read from B, and the consumer's passes; then web_1's
    own event appears. `also`: what else happens each minute."""
    for _ in range(minutes):
        rig.fleet.advance(60)
        also()
        feed(rig.consumer, rig, B, [rig.fleet.heartbeat("web_1")])
        rig.consumer.tick()
    feed(rig.consumer, rig, B, [rig.fleet.event("web_1", E2)])


def released(rig: Rig, event_id: str) -> list[str]:
    return [d["DecisionReason"] for d in rig.decisions
            if d["EventId"] == event_id and d["DecisionAction"] == "Release"]  # fmt: skip


def test_a_consumer_behind_on_a_vms_partition_keeps_its_slot(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db", ONE_PER_SET)
    web_set(rig)
    feed(rig.consumer, rig, A, [rig.fleet.event("web_0", E1, transition="Started",
                                                source="Platform")])  # fmt: skip
    # web_0 goes on speaking (heartbeats) into partition A, but this consumer is held back
    # there: for thirteen minutes it reads only B, where web_1 heartbeats.
    unread: list[dict[str, Any]] = []
    minutes_reading_b(rig, 13, also=lambda: unread.append(rig.fleet.heartbeat("web_0")))
    assert released(rig, E1) == []
    assert rig.sender.sent == []  # web_0 may still be down: web_1 waits
    # It catches up with A: web_0 was alive all along. Only once its event is over does
    # web_1's turn come.
    feed(rig.consumer, rig, A, unread)
    rig.consumer.tick()
    assert rig.sender.sent == []
    rig.fleet.advance(5)
    feed(rig.consumer, rig, A, [rig.fleet.event("web_0", E1, transition="Completed")])
    rig.consumer.tick()
    assert [c.event_id for c in rig.sender.sent] == [E2]
    assert released(rig, E1) == []


def test_the_slot_of_a_deleted_vm_is_released_once_its_partition_is_read_to_the_end(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path / "fleet.db", ONE_PER_SET)
    web_set(rig)
    preempt_web_0(rig)
    # Held back on A: whether web_0 spoke meanwhile is not known.
    minutes_reading_b(rig, 13, also=lambda: feed(rig.consumer, rig, A, [], caught_up=False))
    assert released(rig, E1) == []
    assert rig.sender.sent == []
    # A is read to its end: nothing from web_0 since the Preempt, thirteen minutes ago.
    feed(rig.consumer, rig, A, [])
    rig.consumer.tick()
    [why] = released(rig, E1)
    assert "no VM" in why
    assert [c.event_id for c in rig.sender.sent] == [E2]


def test_a_vm_of_a_partition_no_source_says_it_read_to_the_end_is_never_taken_as_silent(
    tmp_path: Path,
) -> None:
    # A source that cannot say how far it has read (`caught_up` None): silence there proves
    # nothing, and the event waits for its VMs' own word (or consumer.stale_after).
    rig = Rig(tmp_path / "fleet.db", ONE_PER_SET)
    web_set(rig, caught_up=False)
    preempt_web_0(rig, caught_up=False)
    minutes_reading_b(rig, 30)
    assert released(rig, E1) == []
    assert rig.sender.sent == []


def test_a_consumer_releases_a_vm_of_another_consumers_partition_only_as_that_one_read_it(
    tmp_path: Path,
) -> None:
    # Two consumers share the state: `reader` owns A (web_0's), `rig.consumer` owns B. The
    # one that does not read A vouches for web_0's silence only as far as the state says A
    # was read, by whoever reads it.
    rig = Rig(tmp_path / "fleet.db", ONE_PER_SET)
    reader = rig.make(ONE_PER_SET)
    web_set(rig, reader)
    preempt_web_0(rig, reader)
    minutes_reading_b(rig, 13)  # the reader of A is held back; the other one goes on
    assert released(rig, E1) == []
    assert rig.sender.sent == []
    feed(reader, rig, A, [])  # the reader of A has read it to its end
    # The other consumer reads the marks back at their pace (issue 35).
    rig.fleet.advance(mark_pace(ConsumerSettings().alive_within).total_seconds())
    rig.consumer.tick()
    assert len(released(rig, E1)) == 1
    assert [c.event_id for c in rig.sender.sent] == [E2]
