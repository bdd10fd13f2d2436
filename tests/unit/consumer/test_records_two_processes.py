"""A large --records file is read by two processes (issue 40: `policy replay` of a million
records in under a minute, on the second core): what they read, the records, the lines set
aside and the errors, is what one process reads."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.config import ConfigError, ConsumerSettings
from bridge.consumer import explain
from bridge.consumer.explain import SetAside, _LineReader, chunked, records_in
from bridge.consumer.replay import History, Replayer
from bridge.policy.file import loads
from tests.benchmarks.bench_replay import POLICY, START, history
from tests.support.records import ORIGIN, T0, common_fields


def heartbeat(n: int) -> dict[str, object]:
    record = common_fields(ORIGIN, "Heartbeat", f"beat-{n}", T0)
    record.update(DocumentIncarnation=None, HeartbeatReason="Start", PendingEvents=n,
                  SpoolDepth=0, SpoolDroppedRecords=0, ImdsHealthy=False,
                  LastImdsSuccess=None, HasPrepareHook=False, Tags={"n": str(n)})  # fmt: skip
    return record


# Lines of each kind a file may hold: a record, a blank line, a line that is not JSON, one the
# record check refuses, one with an integral float (made whole), one with a lone surrogate.
KINDS: dict[str, Callable[[int], str]] = {
    "record": lambda n: json.dumps(heartbeat(n)),
    "blank": lambda n: "   ",
    "not json": lambda n: '{"RecordType": "Heartbeat", ',
    "refused": lambda n: json.dumps({**heartbeat(n), "SpoolDepth": "many"}),
    "lacking": lambda n: json.dumps({k: v for k, v in heartbeat(n).items() if k != "VmId"}),
    "float": lambda n: json.dumps({**heartbeat(n), "SpoolDepth": 3.0}),
    "surrogate": lambda n: json.dumps({**heartbeat(n), "VmName": "web_\ud800"}),
    "two values": lambda n: json.dumps(heartbeat(n)) + " 7",
    # Two records on a line as a person reads it, two lines as str.splitlines reads them.
    "separated": lambda n: json.dumps(heartbeat(n)) + "\u2028" + json.dumps(heartbeat(n + 100)),
    "carriage return": lambda n: json.dumps(heartbeat(n)) + "\r" + json.dumps(heartbeat(n + 100)),
}


def _file(tmp_path: Path, kinds: list[str]) -> Path:
    path = tmp_path / "records.jsonl"
    lines = [KINDS[kind](n) for n, kind in enumerate(kinds)]
    path.write_bytes("\r\n".join(lines).encode("utf-8", "surrogatepass") + b"\n")
    return path


def _read(path: Path, collect: bool) -> tuple[object, list[str], str | None]:
    """The records (as plain dicts), the lines set aside, the error (message and cause)."""
    aside: list[SetAside] | None = [] if collect else None
    try:
        records: object = [dict(r) for r in records_in(path, aside)]
    except ConfigError as err:
        return None, [str(a) for a in aside or []], f"{err} <- {err.__cause__!r}"
    return records, [str(a) for a in aside or []], None


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The lines this process decodes (a helper's are not counted here)."""
    lines: list[str] = []
    read = _LineReader.read

    def counting(self: _LineReader, line: str) -> tuple[object, bool]:
        lines.append(line)
        return read(self, line)

    monkeypatch.setattr(_LineReader, "read", counting)
    return lines


def test_a_large_file_is_read_half_by_a_helper_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: list[str]
) -> None:
    path = _file(tmp_path, ["record"] * 40)
    monkeypatch.setattr(explain, "SPLIT_CHARS", 10**9)
    alone = _read(path, collect=True)
    assert len(counted) == 40
    counted.clear()
    monkeypatch.setattr(explain, "SPLIT_CHARS", 10)
    assert _read(path, collect=True) == alone
    assert 0 < len(counted) < 40, len(counted)  # the helper read the others
    assert alone[0] == [heartbeat(n) for n in range(40)]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kinds=st.lists(st.sampled_from(sorted(KINDS)), min_size=2, max_size=14),
    collect=st.booleans(),
)
def test_what_two_processes_read_is_what_one_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kinds: list[str], collect: bool
) -> None:
    path = _file(tmp_path, kinds)
    monkeypatch.setattr(explain, "SPLIT_CHARS", 10**9)
    alone = _read(path, collect)
    monkeypatch.setattr(explain, "SPLIT_CHARS", 2)
    assert _read(path, collect) == alone


def test_a_helper_that_fails_leaves_its_lines_to_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: list[str]
) -> None:
    def broken(*args: object) -> bytes:
        raise MemoryError("the helper ran out of memory")

    path = _file(tmp_path, ["record", "refused", "record", "not json"] * 10)
    monkeypatch.setattr(explain, "SPLIT_CHARS", 10**9)
    alone = _read(path, collect=True)
    counted.clear()
    monkeypatch.setattr(explain, "SPLIT_CHARS", 10)
    monkeypatch.setattr(explain, "_helped", broken)
    assert _read(path, collect=True) == alone
    assert len(counted) == 40  # all of them here
    assert alone[1][:2] == [f"{path}: line 2 is refused: SpoolDepth must be integer, got 'many'",
                            f"{path}: line 4 is not JSON: Expecting property name enclosed in "
                            "double quotes: line 1 column 29 (char 28)"]  # fmt: skip


@pytest.mark.parametrize("split", [10**9, 10])
def test_records_share_their_field_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: int
) -> None:
    """One string of each field name, not one a record: half a million records' memory."""
    path = _file(tmp_path, ["record", "float", "record"] * 4)
    monkeypatch.setattr(explain, "SPLIT_CHARS", split)
    records = records_in(path)
    assert len(records) == 12
    for record in records:
        assert list(record) == list(heartbeat(0))
        assert all(a is b for a, b in zip(record, records[0], strict=True))


# --- read as it is replayed (`chunked`: policy replay of a large file) ----------------------


@cache
def a_decision() -> dict[str, Any]:
    """A Decision record as a consumer writes it."""
    agents = history(300)
    recorder = Replayer(loads(POLICY, "policy.yaml"), ConsumerSettings(), START)
    recorder.feed(History.of(agents).agents)
    recorder.close()
    return dict(recorder.decisions[0])


DECIDED: dict[str, Callable[[int], str]] = {
    "decision": lambda n: json.dumps({**a_decision(), "RecordId": f"d-{n}"}),
    # What reading ahead cannot see (a letter escaped): the replay checks, and reads again.
    "escaped decision": lambda n: json.dumps({**a_decision(), "RecordId": f"d-{n}"}).replace(
        "Decision", "\\u0044ecision"
    ),
    "decision in a text": lambda n: json.dumps({**heartbeat(n), "VmName": "Decision"}),
}


def _chunked(path: Path) -> tuple[object, list[str], list[dict[str, Any]], str | None]:
    """What `chunked` reads: the records of every chunk, the lines set aside, the Decision
    records read ahead, the error (message and cause)."""
    aside: list[SetAside] = []
    large = chunked(path, aside)
    assert large is not None
    ahead = [dict(r) for r in large.decisions]
    try:
        records: object = [dict(r) for chunk in large.chunks() for r in chunk]
    except ConfigError as err:
        return None, [str(a) for a in aside], ahead, f"{err} <- {err.__cause__!r}"
    return records, [str(a) for a in aside], ahead, None


def _lines_file(tmp_path: Path, kinds: list[str]) -> Path:
    every = {**KINDS, **DECIDED}
    path = tmp_path / "records.jsonl"
    lines = [every[kind](n) for n, kind in enumerate(kinds)]
    path.write_bytes("\r\n".join(lines).encode("utf-8", "surrogatepass") + b"\n")
    return path


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kinds=st.lists(st.sampled_from(sorted({**KINDS, **DECIDED})), min_size=2, max_size=14),
    chars=st.integers(1, 3_000),
)
def test_what_is_read_as_it_is_replayed_is_what_one_process_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kinds: list[str], chars: int
) -> None:
    path = _lines_file(tmp_path, kinds)
    monkeypatch.setattr(explain, "SPLIT_CHARS", 10**9)
    records, aside, error = _read(path, collect=True)
    monkeypatch.setattr(explain, "SPLIT_CHARS", 2)
    monkeypatch.setattr(explain, "CHUNK_CHARS", chars)
    if chunked(path, []) is None:  # its first line is not one JSON value: read whole
        return
    got, got_aside, ahead, got_error = _chunked(path)
    assert (got, got_aside, got_error) == (records, aside, error)
    if isinstance(records, list):
        found = [r for r in records if r["RecordType"] == "Decision"]
        seen = [r for r, kind in zip(found, [k for k in kinds if "decision" in k and
                                             "text" not in k], strict=True)
                if kind == "decision"]  # fmt: skip
        assert ahead == seen


def test_read_as_it_is_replayed_the_helper_sends_chunk_after_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: list[str]
) -> None:
    path = _lines_file(tmp_path, ["record", "decision", "not json", "record"] * 50)
    monkeypatch.setattr(explain, "SPLIT_CHARS", 10**9)
    alone = _read(path, collect=True)
    counted.clear()
    monkeypatch.setattr(explain, "SPLIT_CHARS", 10)
    monkeypatch.setattr(explain, "CHUNK_CHARS", 5_000)
    aside: list[SetAside] = []
    large = chunked(path, aside)
    assert large is not None
    ahead = len(counted)
    assert ahead == 50  # the lines that say "Decision", here
    chunks = [[dict(r) for r in chunk] for chunk in large.chunks()]
    assert len(chunks) > 5
    assert len(counted) == ahead  # every line read by the helper
    assert ([r for chunk in chunks for r in chunk], [str(a) for a in aside], None) == alone


def test_a_helper_that_dies_midway_leaves_the_rest_to_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted: list[str]
) -> None:
    path = _lines_file(tmp_path, ["record", "refused", "record", "not json"] * 50)
    monkeypatch.setattr(explain, "SPLIT_CHARS", 10**9)
    alone = _read(path, collect=True)
    monkeypatch.setattr(explain, "SPLIT_CHARS", 10)
    monkeypatch.setattr(explain, "CHUNK_CHARS", 5_000)
    packed = explain._packed
    sent: list[int] = []

    def dying(found: Any) -> bytes:
        if sent:  # in the helper: its second chunk is never sent
            os._exit(1)
        sent.append(1)
        return packed(found)

    monkeypatch.setattr(explain, "_packed", dying)
    counted.clear()
    got = _chunked(path)
    assert (got[0], got[1], got[3]) == alone
    assert 0 < len(counted) < 200, len(counted)  # the lines after the first chunk, here


@pytest.mark.parametrize("at", ["first line", "a later line"])
def test_a_file_that_is_not_utf8_is_refused_naming_its_first_bad_byte_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    path = _lines_file(tmp_path, ["record"] * 30)
    data = bytearray(path.read_bytes())
    bad = data.index(b"Heartbeat", 2_000 if at == "a later line" else 0)
    data[bad] = 0xFF
    path.write_bytes(bytes(data))
    said = f"--records {path} is not UTF-8 text (JSON's encoding): byte 0xff at offset {bad} "
    for split in (10**9, 10):
        monkeypatch.setattr(explain, "SPLIT_CHARS", split)
        monkeypatch.setattr(explain, "CHUNK_CHARS", 1_000)
        large = chunked(path, [])
        assert (large is None) == (split > 10 or at == "first line")
        with pytest.raises(ConfigError) as refused:
            _all_of(path, large)
        assert str(refused.value).startswith(said), refused.value


def _all_of(path: Path, large: explain.Chunked | None) -> object:
    return records_in(path, []) if large is None else list(large.chunks())


def test_a_file_whose_first_line_is_not_a_value_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _lines_file(tmp_path, ["not json"] * 30)
    monkeypatch.setattr(explain, "SPLIT_CHARS", 10)
    assert chunked(path, []) is None
    path.write_text(json.dumps([heartbeat(n) for n in range(3)], indent=2), "utf-8")
    assert chunked(path, []) is None  # a value over several lines: json.loads reads it


@pytest.mark.parametrize("text", ["[{}, {}]", ' \n {"a": 1}\n ', "x" * 50])
def test_a_json_value_or_a_small_file_is_not_read_as_it_is_replayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    path = tmp_path / "records.json"
    path.write_text(text, "utf-8")
    monkeypatch.setattr(explain, "SPLIT_CHARS", 40)
    assert chunked(path, []) is None if text.startswith(("[", " ")) else True
    monkeypatch.setattr(explain, "SPLIT_CHARS", 10**9)
    assert chunked(path, []) is None
