"""A large --records file is read by two processes (issue 40: `policy replay` of a million
records in under a minute, on the second core): what they read, the records, the lines set
aside and the errors, is what one process reads."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.config import ConfigError
from bridge.consumer import explain
from bridge.consumer.explain import SetAside, _LineReader, records_in
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
