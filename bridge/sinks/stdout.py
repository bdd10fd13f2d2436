"""`stdout`: one line per record on standard output, for pipes and container logs."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import TextIO

from bridge.retry import PermanentError, RetryableError
from bridge.sinks.base import BaseSink, SpooledRecord


class StdoutSink(BaseSink):
    """Writes record bodies to standard output and flushes after every batch."""

    def __init__(self, stream: TextIO | None = None, *, max_batch: int = 500) -> None:
        # None means "sys.stdout at the time of writing", which may be replaced after start.
        self._stream = stream
        self._max_batch = max_batch

    @property
    def name(self) -> str:
        return "stdout"

    @property
    def max_batch(self) -> int:
        return self._max_batch

    def send(self, batch: Sequence[SpooledRecord]) -> None:
        stream = self._stream or sys.stdout
        if stream is None:
            raise PermanentError(
                "there is no standard output (running without a console?); "
                "use a jsonl:PATH sink instead of stdout"
            )
        try:
            stream.write("".join(f"{record.body}\n" for record in batch))
            stream.flush()
        except (OSError, ValueError) as err:  # ValueError: the stream was closed
            raise RetryableError(f"cannot write to standard output: {err}") from err

    def check(self) -> str:
        return "standard output is open" if not (self._stream or sys.stdout).closed else ""

    def close(self) -> None:
        stream = self._stream or sys.stdout
        # Every batch was flushed when sent; this only tidies up, so a failure loses nothing.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
