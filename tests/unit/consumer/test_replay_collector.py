"""A history is read and replayed with Python's cycle collector paused (issue 40: its passes
over a million records held in memory were a quarter of the time), and the collector is
resumed after, even when the reading fails; one paused before stays paused."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from bridge.config import ConfigError, ConsumerSettings
from bridge.consumer import replay as module
from bridge.consumer.explain import records_in
from bridge.consumer.replay import Replayer, collector_off, replay
from bridge.policy.file import loads
from bridge.records import parse_time
from tests.support.fleetrecords import FleetRecords
from tests.support.records import event_record

POLICY = """
version: 1
rules:
  - {name: user-initiated, match: {event_source: User}, action: approve}
"""


@pytest.fixture(autouse=True)
def _collector_running() -> Iterator[None]:
    running = gc.isenabled()
    gc.enable()
    yield
    if not running:
        gc.disable()


def test_a_replay_runs_with_the_collector_paused_and_resumes_it() -> None:
    seen: list[bool] = []

    def history() -> Iterator[dict[str, object]]:
        seen.append(gc.isenabled())  # as the replay reads the records
        yield event_record()

    done = replay(history(), loads(POLICY, "policy.yaml"), ConsumerSettings())
    assert len(done.events) == 1
    assert seen == [False]
    assert gc.isenabled()


def test_reading_a_file_pauses_the_collector_and_resumes_it_when_the_file_is_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(event_record()) + "\n", encoding="utf-8")
    seen: list[bool] = []

    class Watched(type(path)):  # type: ignore[misc]  # the running OS's Path
        def read_bytes(self) -> bytes:
            seen.append(gc.isenabled())
            return bytes(super().read_bytes())

    assert len(records_in(Watched(path))) == 1
    path.write_text("not json\n", encoding="utf-8")
    with pytest.raises(ConfigError):
        records_in(Watched(path))
    assert seen == [False, False]
    assert gc.isenabled()


def test_a_collector_paused_before_stays_paused() -> None:
    gc.disable()
    with collector_off():
        assert not gc.isenabled()
    assert not gc.isenabled()
    gc.enable()
    with pytest.raises(RuntimeError), collector_off():
        raise RuntimeError("the reading failed")
    assert gc.isenabled()


def test_a_replay_reads_each_record_s_time_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """History.of reads the agents' times; the replay's feed takes them from it rather than
    reading them again (issue 40: a million records)."""

    read: list[object] = []
    parse = parse_time

    def counted(text: object) -> object:
        read.append(text)
        return parse(text)

    monkeypatch.setattr(module, "parse_time", counted)
    fleet = FleetRecords(datetime(2026, 11, 21, tzinfo=timezone.utc))
    fleet.vm("web_0")
    records = []
    for _ in range(40):
        records.append(fleet.heartbeat("web_0"))
        fleet.advance(30)
    replay(records, loads(POLICY, "policy.yaml"), ConsumerSettings())
    stamps = {r["TimeGenerated"] for r in records}
    agents = [t for t in read if t in stamps]
    assert set(agents) == stamps
    # Once each in History.of, and the first and the last for the replay's span.
    assert len(agents) == len(records) + 2, len(agents)


def test_times_given_to_feed_are_one_a_record() -> None:
    from datetime import datetime, timezone

    start = datetime(2026, 11, 21, tzinfo=timezone.utc)
    replayer = Replayer(loads(POLICY, "policy.yaml"), ConsumerSettings(), start)
    with pytest.raises(ValueError, match="shorter"):
        replayer.feed([event_record(), event_record()], times=[start])
    replayer.close()
