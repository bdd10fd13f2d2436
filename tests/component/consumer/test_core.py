"""The consumer core over a real SQLite fleet state, with an in-memory command sender."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer.core import Consumer
from bridge.consumer.ledger import read_ledger
from bridge.consumer.release import Pending
from bridge.consumer.state import Doc, Store
from bridge.consumer.state.sqlite import SqliteStore
from bridge.consumer.views import FleetCache
from bridge.policy.model import DEFAULT_POLICY, Action, Budget, Match, Policy, Rule
from bridge.retry import RetryableError
from tests.support.fleetrecords import SUBSCRIPTION, FleetRecords
from tests.support.records import Sender, assert_valid

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
E1 = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
E2 = "A1B2C3D4-0000-4000-8000-000000000002"


class Rig:
    def __init__(self, path: Path, policy: Policy = DEFAULT_POLICY, **settings: Any) -> None:
        self.fleet = FleetRecords(T0)
        self.store = SqliteStore(path)
        self.sender = Sender()
        self.decisions: list[Mapping[str, Any]] = []
        self.consumer = self.make(policy, **settings)

    def make(self, policy: Policy, *, store: Store | None = None, **settings: Any) -> Consumer:
        """A consumer of the rig's fleet state (`store`: through another store of it)."""
        return Consumer(
            store or self.store,
            self.sender,
            policy,
            self.decisions.extend,
            ConsumerSettings(**settings),
            now=lambda: self.fleet.now,
        )

    def actions(self) -> list[tuple[str, str]]:
        return [(d["DecisionAction"], d["DecisionRule"]) for d in self.decisions]

    def over(self, store: SqliteStore) -> None:
        """The rig's consumer on `store`, another store of the same file (one that counts)."""
        self.store.close()
        self.store = store
        self.consumer = self.make(DEFAULT_POLICY)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path / "fleet.db")
    yield made
    made.store.close()


def two_vms(rig: Rig) -> list[dict[str, Any]]:
    rig.fleet.vm("web_0", scale_set="web")
    rig.fleet.vm("web_1", scale_set="web")
    return [rig.fleet.heartbeat("web_0"), rig.fleet.heartbeat("web_1")]


def test_user_reboot_is_approved_once_through_an_affected_vm(rig: Rig) -> None:
    batch = two_vms(rig)
    batch += [
        rig.fleet.event("web_1", E1, resources=["web_1"]),
        rig.fleet.event("web_0", E1, resources=["web_1"]),
    ]
    rig.consumer.process(batch)
    assert [c.vm_id for c in rig.sender.sent] == [rig.fleet.vm_id("web_1")]
    assert rig.sender.sent[0].event_id == E1
    assert rig.actions() == [("Approve", "user-initiated")]
    for decision in rig.decisions:
        assert_valid(decision)
    # A replayed batch (not checkpointed before a crash) changes nothing.
    rig.consumer.process(batch)
    fresh = rig.make(DEFAULT_POLICY)
    fresh.process(batch)
    assert len(rig.sender.sent) == 1
    assert len(rig.decisions) == 1


def test_platform_reboot_is_held_and_said_once(rig: Rig) -> None:
    batch = [*two_vms(rig), rig.fleet.event("web_0", E1, source="Platform")]
    rig.consumer.process(batch)
    rig.consumer.tick()
    rig.fleet.advance(10)
    rig.consumer.process([rig.fleet.event("web_1", E1, source="Platform", resources=["web_0"])])
    assert rig.sender.sent == []
    assert rig.actions() == [("Hold", "everything-else")]


def test_refused_approval_falls_back_to_the_next_vm(rig: Rig) -> None:
    batch = two_vms(rig)
    batch += [
        rig.fleet.event("web_0", E1, resources=["web_0", "web_1"]),
        rig.fleet.event("web_1", E1, resources=["web_0", "web_1"]),
    ]
    rig.consumer.process(batch)
    first = rig.sender.sent[-1]
    assert first.vm_id == rig.fleet.vm_id("web_0")
    rig.fleet.advance(1)
    rig.consumer.process([rig.fleet.approval(first, "Refused")])
    second = rig.sender.sent[-1]
    assert second.vm_id == rig.fleet.vm_id("web_1")
    assert second.command_id != first.command_id
    assert [d["Attempt"] for d in rig.decisions] == [1, 2]


def test_silent_approver_is_replaced_after_the_timeout(rig: Rig) -> None:
    batch = two_vms(rig)
    batch += [rig.fleet.event(n, E1, resources=["web_0", "web_1"]) for n in ("web_0", "web_1")]
    rig.consumer.process(batch)
    rig.fleet.advance(29)
    rig.consumer.tick()
    assert len(rig.sender.sent) == 1
    rig.fleet.advance(2)
    rig.consumer.tick()
    assert [c.vm_id for c in rig.sender.sent] == [rig.fleet.vm_id(n) for n in ("web_0", "web_1")]
    # A confirmation ends the search: no third VM is ever asked.
    rig.consumer.process([rig.fleet.approval(rig.sender.sent[-1])])
    rig.fleet.advance(60)
    rig.consumer.tick()
    assert len(rig.sender.sent) == 2


def test_dead_vm_is_not_asked(rig: Rig) -> None:
    batch = two_vms(rig)
    rig.consumer.process(batch)
    rig.fleet.advance(700)  # web_0's last heartbeat is now older than alive_within
    rig.consumer.process([rig.fleet.heartbeat("web_1")])
    events = [rig.fleet.event(n, E1, resources=["web_0", "web_1"]) for n in ("web_0", "web_1")]
    rig.consumer.process([events[1]])
    assert [c.vm_id for c in rig.sender.sent] == [rig.fleet.vm_id("web_1")]


def test_send_failure_is_retried_with_the_same_command(rig: Rig) -> None:
    batch = [*two_vms(rig), rig.fleet.event("web_0", E1)]
    rig.sender.failures = 1
    with pytest.raises(RetryableError):
        rig.consumer.process(batch)
    assert rig.sender.sent == []
    rig.consumer.process(batch)  # the batch comes back: it was not checkpointed
    assert len(rig.sender.sent) == 1
    assert len({d["RecordId"] for d in rig.decisions}) == 1


def test_budget_defers_until_the_first_event_completes(tmp_path: Path) -> None:
    policy = Policy(
        rules=(Rule("all", Match(), Action("approve")),),
        budgets=(Budget("one-web", "scale_set", max_vms=1),),
    )
    rig = Rig(tmp_path / "fleet.db", policy)
    batch = two_vms(rig)
    batch.append(rig.fleet.event("web_0", E1))
    rig.fleet.advance(1)
    batch.append(rig.fleet.event("web_1", E2))
    rig.consumer.process(batch)
    assert [c.event_id for c in rig.sender.sent] == [E1]
    assert rig.actions() == [("Approve", "all"), ("Defer", "all")]
    rig.fleet.advance(5)
    rig.consumer.process([rig.fleet.event("web_0", E1, transition="Started")])
    rig.consumer.tick()
    assert len(rig.sender.sent) == 1
    rig.fleet.advance(60)
    rig.consumer.process([rig.fleet.event("web_0", E1, transition="Completed")])
    rig.consumer.tick()
    assert [c.event_id for c in rig.sender.sent] == [E1, E2]


def test_started_event_counts_against_the_budget(tmp_path: Path) -> None:
    policy = Policy(
        rules=(Rule("all", Match(), Action("approve")),),
        budgets=(Budget("one-web", "scale_set", max_vms=1),),
    )
    rig = Rig(tmp_path / "fleet.db", policy)
    batch = two_vms(rig)
    batch += [rig.fleet.event("web_0", E1, transition="Started", source="Platform")]
    batch += [rig.fleet.event("web_1", E2)]
    rig.consumer.process(batch)
    assert rig.sender.sent == []
    assert rig.actions() == [("Defer", "all")]


def test_two_consumers_sharing_state_spend_one_budget_slot(tmp_path: Path) -> None:
    policy = Policy(
        rules=(Rule("all", Match(), Action("approve")),),
        budgets=(Budget("one-web", "scale_set", max_vms=1),),
    )
    rig = Rig(tmp_path / "fleet.db", policy)
    other = rig.make(policy)
    rig.consumer.process(two_vms(rig))
    rig.consumer.process([rig.fleet.event("web_0", E1)])
    other.process([rig.fleet.event("web_1", E2)])
    assert [c.event_id for c in rig.sender.sent] == [E1]


class QueriedFeed(SqliteStore):
    """A fleet state whose looks are queries to a service (as Table Storage's): event
    scans and looks counted, full (None) or since a mark."""

    feed_interval = 15.0

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.event_scans = 0
        self.event_looks: list[int | None] = []
        self.ledger_looks = 0
        self.event_reads = 0  # documents asked for by key, one at a time or many
        self.ledger_reads = 0

    def scan(self, collection: str) -> list[Doc]:
        self.event_scans += collection == fs.EVENT
        return super().scan(collection)

    def read(self, collection: str, key: str) -> Doc | None:
        self.event_reads += collection == fs.EVENT
        self.ledger_reads += collection == fs.LEDGER
        return super().read(collection, key)

    def read_many(self, collection: str, keys: Sequence[str]) -> dict[str, Doc]:
        self.event_reads += len(keys) if collection == fs.EVENT else 0
        self.ledger_reads += len(keys) if collection == fs.LEDGER else 0
        return super().read_many(collection, keys)

    def scan_changes(
        self, collection: str, since: int | None, known: Mapping[str, Doc] | None = None
    ) -> tuple[list[Doc], int]:
        if collection == fs.EVENT:
            self.event_looks.append(since)
        self.ledger_looks += collection == fs.LEDGER
        return super().scan_changes(collection, since, known)


def test_the_tick_reads_the_events_written_since_and_all_of_them_every_5_minutes(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path / "fleet.db")
    rig.store.close()
    rig.store = ours = QueriedFeed(tmp_path / "fleet.db")
    rig.consumer = rig.make(DEFAULT_POLICY)
    other = Rig(tmp_path / "fleet.db")
    other.fleet, other.sender = rig.fleet, rig.sender
    other.consumer = other.make(DEFAULT_POLICY)
    rig.consumer.tick()  # nothing yet: the first look reads everything
    # Another consumer hears of a user reboot and asks web_0, which never answers: this
    # consumer's tick finds the event through the feed and asks web_1 after the timeout.
    batch = two_vms(rig)
    batch += [rig.fleet.event(n, E1, resources=["web_0", "web_1"]) for n in ("web_0", "web_1")]
    other.consumer.process(batch)
    assert len(rig.sender.sent) == 1
    rig.fleet.advance(31)
    rig.consumer.tick()
    assert [c.vm_id for c in rig.sender.sent] == [rig.fleet.vm_id(n) for n in ("web_0", "web_1")]
    assert ours.event_scans == 0
    assert ours.event_looks[0] is None
    assert all(mark is not None for mark in ours.event_looks[1:])
    rig.fleet.advance(300)
    rig.consumer.tick()
    assert ours.event_looks[-1] is None  # five minutes on: everything again
    ours.close()
    other.store.close()


class DecodeCount(SqliteStore):
    """A local fleet state (feed_interval 0) counting the event documents its scans and
    looks hand out, each decoded from its JSON for the caller."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.events_handed = 0

    def scan(self, collection: str) -> list[Doc]:
        docs = super().scan(collection)
        self.events_handed += len(docs) if collection == fs.EVENT else 0
        return docs

    def scan_changes(
        self, collection: str, since: int | None, known: Mapping[str, Doc] | None = None
    ) -> tuple[list[Doc], int]:
        docs, mark = super().scan_changes(collection, since, known)
        self.events_handed += len(docs) if collection == fs.EVENT else 0
        return docs, mark


def test_a_tick_on_a_local_state_decodes_only_the_events_written_since(tmp_path: Path) -> None:
    # On SQLite every tick decoded every event document of the last stale_after (6 h): a
    # fifth of the consumer's CPU late in the 100,000-VM freeze wave, 14,819 documents every
    # 5 s (py-spy, issue 35). The tick keeps them as it does on Table Storage.
    rig = Rig(tmp_path / "fleet.db")
    rig.over(ours := DecodeCount(tmp_path / "fleet.db"))
    batch = two_vms(rig)
    held = [f"A1B2C3D4-0000-4000-8000-{n:012d}" for n in range(40)]
    batch += [rig.fleet.event("web_0", e, event_type="Reboot", source="Platform") for e in held]
    rig.consumer.process(batch)
    rig.consumer.tick()
    rig.fleet.advance(5)
    before = ours.events_handed
    rig.consumer.tick()  # nothing written since: nothing to decode
    assert ours.events_handed - before == 0
    rig.consumer.process([rig.fleet.event("web_1", E1, resources=["web_1"])])
    rig.fleet.advance(5)
    before = ours.events_handed
    rig.consumer.tick()
    assert ours.events_handed - before <= 1  # the one written since, at most
    assert rig.actions().count(("Hold", "everything-else")) == 40
    ours.close()


def test_an_event_another_consumer_forgot_leaves_the_tick_of_a_local_state(
    tmp_path: Path,
) -> None:
    # Forgetting (6 h without a report) is the only deletion of an event document: a copy
    # the tick kept is as silent, so the tick finds it stale, reads it again, and drops it.
    rig = Rig(tmp_path / "fleet.db")
    batch = two_vms(rig)
    batch += [rig.fleet.event("web_0", E1, event_type="Reboot", source="Platform")]
    rig.consumer.process(batch)
    rig.consumer.tick()
    other = Rig(tmp_path / "fleet.db")
    other.fleet, other.sender = rig.fleet, rig.sender
    other.consumer = other.make(DEFAULT_POLICY)
    rig.fleet.advance(6 * 3600 + 60)
    other.consumer.tick()  # forgets E1 and deletes its document
    assert rig.store.read(fs.EVENT, fs.event_key(E1)) is None
    rig.consumer.tick()
    assert rig.consumer.pending.scheduled == rig.consumer.pending.started == 0
    assert rig.store.read(fs.EVENT, fs.event_key(E1)) is None
    assert rig.sender.sent == []
    assert fs.event_key(E1) not in {d.key for d in rig.consumer.fleet.events.scan()}
    rig.store.close()
    other.store.close()


def test_a_pass_reads_the_ledger_once_not_once_per_open_event(tmp_path: Path) -> None:
    # On Table Storage each read is a query, and the pass holds the consumer's lock: a read
    # per open event kept two consumers 60 s behind at the 100,000-VM freeze wave (issue 15).
    rig = Rig(tmp_path / "fleet.db", DEFAULT_POLICY)
    rig.over(ours := QueriedFeed(tmp_path / "fleet.db"))
    batch = two_vms(rig)
    events = [f"C7061BAC-AFDC-4513-B24B-AA5F13A1612{n}" for n in range(6)]
    batch += [rig.fleet.event("web_0", e, event_type="Reboot", source="Platform") for e in events]
    rig.consumer.process(batch)
    assert rig.actions() == [("Hold", "everything-else")] * 6
    before = ours.ledger_looks
    rig.fleet.advance(5)
    rig.consumer.tick()  # six held events looked at again
    assert ours.ledger_looks - before <= 2  # the tick's own look, and the pass's
    ours.close()


class ReadHook(SqliteStore):
    """Runs `hook` once, just before the first single read of event `key`'s document."""

    def __init__(self, path: Path, key: str, hook: Callable[[], None]) -> None:
        super().__init__(path)
        self.key, self.hook = key.lower(), [hook]

    def read(self, collection: str, key: str) -> Doc | None:
        if collection == fs.EVENT and key.lower() == self.key and self.hook:
            self.hook.pop()()
        return super().read(collection, key)


def test_an_unsent_approval_is_resent_only_from_a_ledger_read_for_it(tmp_path: Path) -> None:
    # Another consumer approved the event, failed to send it, and sends it while this
    # consumer's pass runs on the ledger it read at the start: resending from that older
    # state would put the approval out again, after the other may have moved on to another
    # VM (found in review of issue 15's pass that reads the ledger once).
    other = Rig(tmp_path / "fleet.db")
    batch = two_vms(other)
    batch += [other.fleet.event(n, E1, resources=["web_0", "web_1"]) for n in ("web_0", "web_1")]
    other.sender.failures = 1
    with pytest.raises(RetryableError):
        other.consumer.process(batch)
    assert other.sender.sent == []
    other.fleet.advance(11)  # past the wait before another consumer's unsent approval is resent
    rig = Rig(tmp_path / "fleet.db")
    rig.store.close()
    rig.store = ReadHook(tmp_path / "fleet.db", E1, other.consumer.tick)
    rig.fleet, rig.sender = other.fleet, other.sender
    rig.consumer = rig.make(DEFAULT_POLICY)
    rig.consumer.tick()
    assert len(other.sender.sent) == 1  # by the consumer that approved it, once
    rig.store.close()
    other.store.close()


class FrozenFeed(SqliteStore):
    """A costly change feed whose looks after the first miss every write (as a look over
    Table Storage's pages might): the tick's copies of the events grow old."""

    feed_interval = 15.0
    looked = False

    def scan_changes(
        self, collection: str, since: int | None, known: Mapping[str, Doc] | None = None
    ) -> tuple[list[Doc], int]:
        docs, mark = super().scan_changes(collection, since, known)
        if collection == fs.EVENT and since is not None:
            return [], mark
        return docs, mark


def test_an_event_is_forgotten_only_if_it_is_stale_as_stored_not_as_kept(tmp_path: Path) -> None:
    # The tick keeps the events between passes (issue 15): a kept copy older than a report
    # that keeps the event alive must not release its approval from the ledger.
    rig = Rig(tmp_path / "fleet.db", stale_after=120)
    other = Rig(tmp_path / "fleet.db", stale_after=120)
    other.fleet = rig.fleet
    other.consumer = other.make(DEFAULT_POLICY, stale_after=120)
    rig.store.close()
    rig.store = FrozenFeed(tmp_path / "fleet.db")
    rig.consumer = rig.make(DEFAULT_POLICY, stale_after=120)
    batch = two_vms(rig)
    batch += [rig.fleet.event(n, E1, resources=["web_0", "web_1"]) for n in ("web_0", "web_1")]
    other.consumer.process(batch)
    rig.consumer.tick()  # the first look: the event as approved
    rig.fleet.advance(100)
    other.consumer.process([rig.fleet.event("web_0", E1, transition="Started",
                                            resources=["web_0", "web_1"])])  # fmt: skip
    rig.fleet.advance(30)  # stale as kept (130 s), alive as stored (30 s)
    rig.consumer.tick()
    assert E1.lower() in {key.lower() for key in read_ledger(rig.store).events}
    rig.store.close()
    other.store.close()


def queried(tmp_path: Path, policy: Policy = DEFAULT_POLICY) -> tuple[Rig, QueriedFeed]:
    """A rig whose fleet state is a QueriedFeed (looks are queries, as on Table Storage)."""
    rig = Rig(tmp_path / "fleet.db", policy)
    rig.store.close()
    rig.store = ours = QueriedFeed(tmp_path / "fleet.db")
    rig.consumer = rig.make(policy)
    return rig, ours


def test_a_sighting_that_changes_no_decision_reads_the_event_only_to_fold_it(
    tmp_path: Path,
) -> None:
    # Every VM of a placement group reports each event of the group (issue 15): at a Spot
    # eviction storm a hundred sightings of each event, most of them saying what is known.
    # Each one read the event twice more for a decision that did nothing.
    rig, ours = queried(tmp_path)
    batch = two_vms(rig)
    batch += [rig.fleet.event(n, E1, resources=["web_1"]) for n in ("web_1", "web_0")]
    rig.consumer.process(batch)
    assert rig.actions() == [("Approve", "user-initiated")]
    # The fold's read and the one before acting; the Decision is written over that version.
    assert ours.event_reads == 2
    rig.fleet.advance(1)
    before = ours.event_reads
    rig.consumer.process([rig.fleet.event("web_0", E1, resources=["web_1"])])
    assert ours.event_reads - before == 1  # the fold's read; nothing to decide
    # What a decision does need is still decided at once: the event starts.
    rig.fleet.advance(1)
    rig.consumer.process([rig.fleet.event("web_1", E1, resources=["web_1"], transition="Started")])
    assert E1.lower() in read_ledger(ours).events
    assert len(rig.sender.sent) == 1
    ours.close()


def test_a_tick_reads_no_event_it_has_nothing_to_do_for(tmp_path: Path) -> None:
    # At the 100,000-VM freeze wave 14,819 events were open, each read twice a tick (5 s)
    # on Table Storage: 6,000 entities a second per consumer, past a partition's 2,000.
    rig, ours = queried(tmp_path)
    batch = two_vms(rig)
    events = [f"C7061BAC-AFDC-4513-B24B-AA5F13A1612{n}" for n in range(6)]
    batch += [rig.fleet.event("web_0", e, event_type="Reboot", source="Platform") for e in events]
    batch += [rig.fleet.event("web_1", E2, resources=["web_1"])]  # approved, then waiting
    rig.consumer.process(batch)
    assert (
        sorted(rig.actions()) == [("Approve", "user-initiated")] + [("Hold", "everything-else")] * 6
    )
    rig.consumer.process([rig.fleet.approval(rig.sender.sent[0])])
    rig.consumer.tick()
    before = ours.event_reads
    rig.fleet.advance(5)
    rig.consumer.tick()
    assert ours.event_reads == before
    # An event that needs something is read and acted on: web_1's event ends.
    rig.fleet.advance(60)
    completed = rig.fleet.event("web_1", E2, resources=["web_1"], transition="Completed")
    rig.consumer.process([completed])
    rig.consumer.tick()
    assert E2.lower() not in read_ledger(ours).events
    ours.close()


def test_on_a_queried_store_a_batch_decides_on_the_ledger_it_keeps(tmp_path: Path) -> None:
    # A look at the ledger's changes returns every shard and lock written in the last 10 s:
    # in a storm all 96 of them, for each batch (issue 15). The state kept is safe to decide
    # on: an approval over a budget lock changed since conflicts, and reads again.
    policy = Policy(
        rules=(Rule("all", Match(), Action("approve")),),
        budgets=(Budget("one-a-set", "scale_set", max_vms=1),),
    )
    rig, ours = queried(tmp_path, policy)
    other = rig.make(policy)
    webs = [f"web_{n}" for n in range(5)]
    for name in webs:
        rig.fleet.vm(name, scale_set="web")
    rig.fleet.vm("api_0", scale_set="api")
    rig.fleet.vm("api_1", scale_set="api")
    rig.consumer.process([rig.fleet.heartbeat(name) for name in (*webs, "api_0", "api_1")])
    before = ours.ledger_looks
    freezes = [f"{E1[:-1]}{n}" for n in range(5)]
    for name, event_id in zip(webs, freezes, strict=True):
        rig.consumer.process([rig.fleet.event(name, event_id, event_type="Freeze")])
    assert ours.ledger_looks - before == 1  # the first (nothing kept yet), none after it
    assert [c.event_id for c in rig.sender.sent] == freezes[:1]
    # Another consumer spends api's only slot meanwhile: on the state it keeps ours would
    # approve; before it does, it reads the group's lock, the event's shard and the shard the
    # lock's new write stored (not the ledger), finds the slot taken, and defers.
    mid = ours.ledger_looks
    other.process([rig.fleet.event("api_0", E2)])
    theirs, shards = ours.ledger_looks - mid, ours.ledger_reads
    rig.consumer.process([rig.fleet.event("api_1", "A1B2C3D4-0000-4000-8000-000000000003")])
    assert [c.event_id for c in rig.sender.sent] == [freezes[0], E2]
    assert rig.actions()[-1] == ("Defer", "all")
    assert ours.ledger_looks - before - theirs == 1
    assert rig.consumer.ledger.conflicts == 0  # what the metrics show
    assert ours.ledger_reads - shards <= 3  # the lock, the event's shard, E2's shard
    rig.fleet.advance(5)
    rig.consumer.tick()  # the re-evaluation pass reads it every time
    assert ours.ledger_looks - before - theirs == 2
    ours.close()


def test_a_release_or_an_answer_reads_the_shard_it_changes_not_the_ledger(tmp_path: Path) -> None:
    rig, ours = queried(tmp_path)
    batch = two_vms(rig)
    batch += [rig.fleet.event("web_1", E1, resources=["web_1"])]
    rig.consumer.process(batch)
    # The agent's answer: the entry is in the ledger as this consumer keeps it, so only its
    # shard is read.
    before, shards = ours.ledger_looks, ours.ledger_reads
    rig.consumer.process([rig.fleet.approval(rig.sender.sent[0])])
    assert read_ledger(ours).events[E1.lower()].get("confirmed")
    assert (ours.ledger_looks - before, ours.ledger_reads - shards) == (0, 1)
    rig.fleet.advance(60)
    before, shards = ours.ledger_looks, ours.ledger_reads
    completed = rig.fleet.event("web_1", E1, resources=["web_1"], transition="Completed")
    rig.consumer.process([completed])
    assert E1.lower() not in read_ledger(ours).events
    assert ours.ledger_looks - before == 0
    assert ours.ledger_reads - shards == 1  # the entry's shard, to release it
    ours.close()


def test_approve_when_ready_waits_for_every_prepare_hook(tmp_path: Path) -> None:
    policy = Policy(rules=(Rule("drain", Match(), Action("approve_when_ready")),))
    rig = Rig(tmp_path / "fleet.db", policy)
    rig.consumer.process(two_vms(rig))
    both = ["web_0", "web_1"]
    rig.consumer.process([rig.fleet.event(n, E1, resources=both) for n in both])
    rig.consumer.process([rig.fleet.hook_ready("web_0", E1)])
    assert rig.sender.sent == []
    rig.consumer.process([rig.fleet.hook_ready("web_1", E1)])
    assert len(rig.sender.sent) == 1


class InterleavingStore(SqliteStore):
    """Runs `between` once, just before the first read of the ledger: another consumer's
    whole batch lands after this one took its view of the VMs and before it sees the ledger."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.between: list[Callable[[], None]] = []

    def scan(self, collection: str) -> list[Doc]:
        if collection == fs.LEDGER and self.between:
            self.between.pop()()
        return super().scan(collection)

    def scan_changes(
        self, collection: str, since: int | None, known: Mapping[str, Doc] | None = None
    ) -> tuple[list[Doc], int]:
        if collection == fs.LEDGER and self.between:  # how the ledger is read with SQLite
            self.between.pop()()
        return super().scan_changes(collection, since, known)


def late_consumer(tmp_path: Path) -> tuple[Rig, Consumer, InterleavingStore]:
    """A rig whose consumer can act between a second consumer's scan of the VMs and its
    read of the ledger; a budget of one VM per scale set; web_0 and web_1 in one set."""
    policy = Policy(
        rules=(Rule("all", Match(), Action("approve")),),
        budgets=(Budget("one-web", "scale_set", max_vms=1),),
    )
    rig = Rig(tmp_path / "fleet.db", policy)
    store = InterleavingStore(tmp_path / "fleet.db")
    late = rig.make(policy, store=store)
    rig.fleet.vm("web_0", scale_set="web")
    rig.fleet.vm("web_1", scale_set="web")
    return rig, late, store


def test_a_vm_reported_after_our_view_of_the_fleet_still_counts_against_its_budget(
    tmp_path: Path,
) -> None:
    rig, late, store = late_consumer(tmp_path)
    first = [rig.fleet.heartbeat("web_0"), rig.fleet.event("web_0", E1)]
    store.between.append(lambda: rig.consumer.process(first))
    late.process([rig.fleet.heartbeat("web_1"), rig.fleet.event("web_1", E2)])
    assert [c.event_id for c in rig.sender.sent] == [E1]
    assert rig.actions() == [("Approve", "all"), ("Defer", "all")]
    store.close()


def test_a_resource_reported_after_our_view_of_the_fleet_counts_in_its_group(
    tmp_path: Path,
) -> None:
    rig, late, store = late_consumer(tmp_path)
    store.between.append(lambda: rig.consumer.process([rig.fleet.heartbeat("web_0")]))
    both = ["web_0", "web_1"]
    late.process([rig.fleet.heartbeat("web_1"), rig.fleet.event("web_1", E2, resources=both)])
    assert rig.sender.sent == []
    assert rig.actions() == [("Hold", "all")]
    store.close()


def test_the_fleet_cache_reads_what_changed_and_sees_what_a_scan_sees(tmp_path: Path) -> None:
    """The consumer keeps the VMs between batches: each load equals a scan at that moment,
    VMs another consumer stored included, and only the changed documents are read."""
    ours, theirs = SqliteStore(tmp_path / "fleet.db"), SqliteStore(tmp_path / "fleet.db")
    fleet = FleetRecords(T0)
    for name in ("web_0", "web_1", "web_2"):
        fleet.vm(name, scale_set="web")
    mine = Consumer(ours, Sender(), DEFAULT_POLICY, lambda _: None, ConsumerSettings())
    other = Consumer(theirs, Sender(), DEFAULT_POLICY, lambda _: None, ConsumerSettings())
    mine.process([fleet.heartbeat("web_0"), fleet.heartbeat("web_1")])
    cache = FleetCache(ours)

    def scanned() -> dict[str, object]:
        return {d.key: fs.vm_view(d.key, fs.vm_document(d)) for d in ours.scan(fs.VM)}

    assert cache.load() == scanned()
    fleet.advance(5)
    fleet.vm("web_0", scale_set="web", tags={"tier": "db"})  # its agent was re-tagged
    other.process([fleet.heartbeat("web_2"), fleet.heartbeat("web_0")])
    reads: list[str] = []
    ours._conn.set_trace_callback(reads.append)
    loaded = cache.load()
    ours._conn.set_trace_callback(None)
    assert loaded == scanned()
    assert loaded[fleet.vm_id("web_0")].tags == {"tier": "db"}
    names, _ = cache.index()
    assert names.index[((SUBSCRIPTION, "rg-app", "web"), "web_2")] == fleet.vm_id("web_2")
    assert [q for q in reads if q.startswith("SELECT key")] == [
        "SELECT key, etag, value FROM docs WHERE collection = 'vm' AND rev > 1"
    ]
    mine.close()
    other.close()


def test_only_the_vm_a_command_went_to_can_answer_it(rig: Rig) -> None:
    batch = two_vms(rig)
    batch += [rig.fleet.event(n, E1, resources=["web_0", "web_1"]) for n in ("web_0", "web_1")]
    rig.consumer.process(batch)
    first = rig.sender.sent[-1]
    forged = {**rig.fleet.approval(first, "Refused"), "RecordId": "forged"}
    other = next(n for n in ("web_0", "web_1") if rig.fleet.vm_id(n) != first.vm_id)
    forged["VmId"] = rig.fleet.vm_id(other)
    rig.fleet.advance(1)
    rig.consumer.process([forged])
    assert rig.sender.sent == [first]  # no fallback: the refusal did not come from the target
    rig.consumer.process([rig.fleet.approval(first, "Refused")])
    assert len(rig.sender.sent) == 2


def test_a_2017_name_with_a_leading_underscore_names_the_same_vm(rig: Rig) -> None:
    """api-version 2017-03-01 lists a scale-set instance as "_web_1"; the agent has always
    read it as web_1 (AffectsThisVm), and the consumer must resolve it the same way."""
    batch = two_vms(rig)
    batch += [
        rig.fleet.event("web_0", E1, resources=["_WEB_1"]),
        rig.fleet.event("web_1", E1, resources=["_WEB_1"]),
    ]
    rig.consumer.process(batch)
    assert [c.vm_id for c in rig.sender.sent] == [rig.fleet.vm_id("web_1")]
    assert rig.actions() == [("Approve", "user-initiated")]
    [decision] = rig.decisions
    assert decision["VmId"] == rig.fleet.vm_id("web_1")


def test_each_tick_counts_the_open_events_and_finds_the_next_start(rig: Rig) -> None:
    assert rig.consumer.pending == Pending()  # before the first tick: nothing known
    soon, later = T0 + timedelta(minutes=5), T0 + timedelta(minutes=20)
    batch = [
        *two_vms(rig),
        rig.fleet.event("web_0", E1, source="Platform", not_before=later),
        rig.fleet.event("web_1", E2, source="Platform", resources=["web_1"], not_before=soon),
    ]
    rig.consumer.process(batch)
    rig.consumer.tick()
    assert rig.consumer.pending == Pending(scheduled=2, started=0, next_start=soon)
    rig.fleet.advance(300)
    started = rig.fleet.event("web_1", E2, source="Platform", resources=["web_1"],
                              not_before=soon, transition="Started")  # fmt: skip
    rig.consumer.process([started])
    rig.consumer.tick()
    assert rig.consumer.pending == Pending(scheduled=1, started=1, next_start=later)
    for event, vm in ((E1, "web_0"), (E2, "web_1")):
        over = rig.fleet.event(vm, event, source="Platform", resources=[vm], transition="Completed")
        rig.consumer.process([over])
    rig.consumer.tick()
    assert rig.consumer.pending == Pending()
