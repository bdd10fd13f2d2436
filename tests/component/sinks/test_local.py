"""The jsonl and stdout sinks against real files and streams."""

from __future__ import annotations

import errno
import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from bridge.retry import PermanentError, RetryableError
from bridge.sinks import Sink, SpooledRecord, build
from bridge.sinks.jsonl import JsonlSink
from bridge.sinks.stdout import StdoutSink


def record(seq: int, **fields: Any) -> SpooledRecord:
    body = json.dumps({"RecordId": f"r{seq}", "N": seq, **fields}, separators=(",", ":"))
    return SpooledRecord(seq, f"r{seq}", "Event", body)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "logs" / "se-bridge" / "events.jsonl"


@pytest.fixture
def jsonl(path: Path) -> Iterator[JsonlSink]:
    sink = JsonlSink(path)
    yield sink
    sink.close()


# --- jsonl --------------------------------------------------------------------------------


def test_jsonl_appends_one_line_per_record_creating_directories(
    jsonl: JsonlSink, path: Path
) -> None:
    batch = [record(1), record(2, Description="Maintenance ünder way")]
    jsonl.send(batch)
    jsonl.send([record(3)])

    assert path.read_bytes() == b"".join(
        r.body.encode("utf-8") + b"\n" for r in [*batch, record(3)]
    )
    assert jsonl.name == f"jsonl:{path}"


def test_jsonl_appends_to_what_is_already_there(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"earlier":true}\n')
    sink = JsonlSink(path)
    try:
        sink.send([record(1)])
    finally:
        sink.close()
    assert path.read_text(encoding="utf-8").splitlines() == ['{"earlier":true}', record(1).body]


def test_jsonl_fsyncs_every_batch(jsonl: JsonlSink, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    jsonl.send([record(1), record(2)])
    jsonl.send([record(3)])
    assert len(synced) == 2


def test_jsonl_follows_rotation_by_rename(jsonl: JsonlSink, path: Path) -> None:
    jsonl.send([record(1)])
    rotated = path.with_name("events.jsonl.1")
    jsonl.close()  # Windows cannot rename an open file; rotation tools there close it too
    path.rename(rotated)
    jsonl.send([record(2)])

    assert rotated.read_text(encoding="utf-8") == record(1).body + "\n"
    assert path.read_text(encoding="utf-8") == record(2).body + "\n"


@pytest.mark.skipif(sys.platform == "win32", reason="an open file cannot be renamed on Windows")
def test_jsonl_reopens_when_the_open_file_was_renamed_or_removed(
    jsonl: JsonlSink, path: Path
) -> None:
    jsonl.send([record(1)])
    path.rename(path.with_name("events.jsonl.1"))
    jsonl.send([record(2)])
    assert path.read_text(encoding="utf-8") == record(2).body + "\n"

    path.unlink()
    jsonl.send([record(3)])
    assert path.read_text(encoding="utf-8") == record(3).body + "\n"


def test_jsonl_write_error_is_retryable_and_names_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    sink = JsonlSink(blocker / "events.jsonl")
    try:
        with pytest.raises(RetryableError) as caught:
            sink.send([record(1)])
    finally:
        sink.close()
    assert str(blocker / "events.jsonl") in str(caught.value)


def test_jsonl_check_writes_nothing(jsonl: JsonlSink, path: Path, tmp_path: Path) -> None:
    said = jsonl.check()
    assert f"{tmp_path / 'logs'} does not exist yet" in said
    assert list(tmp_path.iterdir()) == []
    path.parent.mkdir(parents=True)
    path.write_bytes(b"kept\n")
    assert "can be appended to" in jsonl.check()
    assert path.read_bytes() == b"kept\n"


def test_jsonl_check_refuses_what_a_send_could_not_create(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(PermanentError, match="not a directory"):
        JsonlSink(blocker / "sub" / "events.jsonl").check()
    with pytest.raises(PermanentError, match="is a directory"):
        JsonlSink(tmp_path).check()
    assert blocker.read_text() == "x"


class _DiskFillsUp:
    """Wraps the sink's file: writes the start of a record, then fails like a full disk."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file

    def write(self, data: bytes) -> int:
        self._file.write(data[:10])
        self._file.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


def test_jsonl_never_glues_a_record_onto_a_torn_line(jsonl: JsonlSink, path: Path) -> None:
    jsonl.send([record(1)])
    assert jsonl._file is not None
    jsonl._file = _DiskFillsUp(jsonl._file)  # type: ignore[assignment]

    with pytest.raises(RetryableError, match="No space left on device") as caught:
        jsonl.send([record(2), record(3)])
    assert str(path) in str(caught.value)
    jsonl.send([record(2), record(3)])  # the delivery loop retries the same batch

    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == record(1).body
    assert lines[1] == record(2).body[:10]  # the fragment stands alone on its line
    assert lines[2:] == [record(2).body, record(3).body]


def test_jsonl_close_is_idempotent(jsonl: JsonlSink) -> None:
    jsonl.close()
    jsonl.close()


# --- stdout -------------------------------------------------------------------------------


def test_stdout_writes_one_line_per_record(capsys: pytest.CaptureFixture[str]) -> None:
    sink = StdoutSink()
    sink.send([record(1), record(2)])
    sink.close()
    assert capsys.readouterr().out == f"{record(1).body}\n{record(2).body}\n"
    assert sink.name == "stdout"


def test_stdout_closed_stream_is_retryable() -> None:
    stream = io.StringIO()
    stream.close()
    with pytest.raises(RetryableError, match="standard output"):
        StdoutSink(stream).send([record(1)])


def test_stdout_without_a_console_is_permanent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", None)
    with pytest.raises(PermanentError, match="jsonl:PATH"):
        StdoutSink().send([record(1)])


# --- build --------------------------------------------------------------------------------


def test_build_makes_the_named_sink(path: Path) -> None:
    sinks: list[Sink] = [build(f"jsonl:{path}"), build("stdout"), build(" STDOUT")]
    assert isinstance(sinks[0], JsonlSink)
    assert sinks[0].name == f"jsonl:{path}"
    assert isinstance(sinks[1], StdoutSink)
    assert sinks[2].name == "stdout"
    for sink in sinks:
        sink.close()


@pytest.mark.parametrize("spec", ["kafka:x", "jsonl:", "stdout:x"])
def test_build_refuses_a_bad_spec(spec: str) -> None:
    with pytest.raises(ValueError, match="sink"):
        build(spec)
