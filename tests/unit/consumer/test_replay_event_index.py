"""A replay's consumer keeps its events from the change feed alone (issue 40): its in-memory
state has no other client, so no event leaves it but those the consumer forgets itself, and
the full read of every event document each RESCAN_EVENTS (a fifth of a million-record replay,
re-reading ~500 documents at each idle pass) finds nothing the feed has not said."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer.replay import History, Replayer, replay
from bridge.consumer.state import Doc
from bridge.consumer.state.memory import MemoryStore
from bridge.consumer.views import EventIndex
from bridge.policy.file import loads
from tests.benchmarks.bench_replay import POLICY, START, history

T = datetime(2026, 11, 21, tzinfo=timezone.utc)


def _full_scans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry for each read of every event document."""
    full: list[int] = []
    scan = MemoryStore.scan_changes

    def counted(self: MemoryStore, collection: str, since: int | None, known: object = None):  # type: ignore[no-untyped-def]
        if collection == fs.EVENT and since is None:
            full.append(1)
        return scan(self, collection, since, known)  # type: ignore[arg-type]

    monkeypatch.setattr(MemoryStore, "scan_changes", counted)
    return full


def test_an_index_not_rescanned_holds_what_a_full_scan_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore()
    clock = [T]
    index = EventIndex(store, now=lambda: clock[0])
    index.rescan = None
    full = _full_scans(monkeypatch)
    written = {}
    for n in range(6):
        written[f"e{n}"] = store.write(fs.EVENT, Doc(f"e{n}", {"n": n}, None))
    assert [d.value for d in index.scan()] == [{"n": n} for n in range(6)]
    for step in range(1, 5):
        clock[0] = T + timedelta(minutes=10 * step)
        key = f"e{step}"
        written[key] = store.write(fs.EVENT, Doc(key, {"n": step, "step": step}, written[key].etag))
        gone = f"e{6 - step}" if step % 2 else None
        if gone:  # forgotten by this consumer: deleted, and dropped from the index
            store.delete(fs.EVENT, written.pop(gone))
            index.drop(gone)
        assert [(d.key, d.value) for d in index.scan()] == [
            (d.key, d.value) for d in store.scan(fs.EVENT)
        ]
    assert len(full) == 1 + 4  # the index's first, and the test's own


def test_a_replay_reads_every_event_document_once(monkeypatch: pytest.MonkeyPatch) -> None:
    agents = history(6000)  # 100 minutes of 1,000 VMs, with their reboots
    policy, settings = loads(POLICY, "policy.yaml"), ConsumerSettings()
    recorder = Replayer(policy, settings, START)
    recorder.feed(History.of(agents).agents)
    recorder.close()
    full = _full_scans(monkeypatch)
    done = replay([*agents, *recorder.decisions], policy, settings)
    assert done.decisions > 0
    assert not done.differing
    assert not done.marked
    assert len(full) == 1, len(full)
