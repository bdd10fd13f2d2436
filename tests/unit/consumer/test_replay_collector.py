"""A history is read and replayed with Python's cycle collector paused (issue 40: its passes
over a million records held in memory were a quarter of the time), and the collector is
resumed after, even when the reading fails; one paused before stays paused."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.config import ConfigError, ConsumerSettings
from bridge.consumer.explain import records_in
from bridge.consumer.replay import collector_off, replay
from bridge.policy.file import loads
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
        def read_text(self, encoding: str | None = None, errors: str | None = None) -> str:
            seen.append(gc.isenabled())
            return str(super().read_text(encoding, errors))

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
