"""`jsonl:PATH`: append each record as one line of a local file.

The file is flushed and fsynced after every batch before `send` returns, because the
spool forgets a record once every sink has acknowledged it: "acknowledged" has to mean
"on disk". Batches are rare (records only appear when something changed, plus a heartbeat
every few minutes), so the fsync costs nothing noticeable.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from bridge.retry import RetryableError
from bridge.sinks.base import BaseSink, SpooledRecord, could_write


class JsonlSink(BaseSink):
    """Appends records to a file, reopening it when it was rotated or removed."""

    def __init__(self, path: Path, *, fsync: bool = True, max_batch: int = 500) -> None:
        self.path = Path(path)
        self._fsync = fsync
        self._max_batch = max_batch
        self._file: BinaryIO | None = None
        # A write that failed midway, in this process or in one killed mid-write before it,
        # may have left half a line behind: look once at start and after every failure.
        self._torn = True

    @property
    def name(self) -> str:
        return f"jsonl:{self.path}"

    @property
    def max_batch(self) -> int:
        return self._max_batch

    def send(self, batch: Sequence[SpooledRecord]) -> None:
        data = "".join(f"{record.body}\n" for record in batch).encode("utf-8")
        try:
            file = self._current()
            if self._torn:
                self._end_torn_line(file)
            file.write(data)
            file.flush()
            if self._fsync:
                os.fsync(file.fileno())
        except OSError as err:
            self._torn = True
            self._drop()
            raise RetryableError(f"cannot write to {self.path}: {err.strerror or err}") from err
        self._torn = False

    def check(self) -> str:
        """Whether a send could append, found without writing: not even an empty file."""
        return could_write(self.path)

    def close(self) -> None:
        self._drop()

    def _current(self) -> BinaryIO:
        if self._file is not None and not self._still_at_path(self._file):
            self._drop()
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab")  # noqa: SIM115 - kept open across batches
        return self._file

    def _still_at_path(self, file: BinaryIO) -> bool:
        """False once log rotation renamed or removed the file we hold open."""
        try:
            return os.path.samestat(os.stat(self.path), os.fstat(file.fileno()))
        except FileNotFoundError:
            return False

    def _end_torn_line(self, file: BinaryIO) -> None:
        # Otherwise the next record would be glued onto the fragment and both lines lost.
        with open(self.path, "rb") as reader:
            if reader.seek(0, os.SEEK_END) == 0:
                return
            reader.seek(-1, os.SEEK_END)
            if reader.read(1) != b"\n":
                file.write(b"\n")

    def _drop(self) -> None:
        file, self._file = self._file, None
        if file is None:
            return
        # Whatever a failing close loses is written again: that batch was not acknowledged.
        with contextlib.suppress(OSError):
            file.close()
