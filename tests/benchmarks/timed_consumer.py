"""`python -m tests.benchmarks.timed_consumer TIMELINE consumer ARGS...`: the real
`se-bridge consume` command, in its own process as in production, with probes that note
where a record's time goes between the event hub and the consumer's Decision.

Benchmark 3 runs the consumer this way to split its record → decision stage: when the source
handed each batch over (and how long its callback took), how long a batch waited for the
consumer's lock (held by the re-evaluation tick or another partition's batch), how long the
Event Hubs source's questions to an idle partition held its one receive thread, and the
fleet state requests each part made. Notes are on the wall clock (records' TimeGenerated and
the broker's enqueued times are too: all on this machine's one clock), appended to TIMELINE as
JSON lines as each call returns.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bridge import cli
from bridge.consumer import core
from bridge.consumer.sources import eventhubs

_local = threading.local()


class Notes:
    """Timestamped notes appended to a file, one JSON line each."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        self._file = path.open("a", encoding="utf-8")

    def write(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"kind": kind, "thread": threading.current_thread().name, **fields})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()


class TimedLock:
    """The consumer's lock, noting how long each outermost acquire waited."""

    def __init__(self, inner: Any, notes: Notes) -> None:
        self._inner, self._notes = inner, notes
        self._depth = threading.local()

    def __enter__(self) -> bool:
        began = time.time()
        self._inner.acquire()
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        if depth == 0:
            self._notes.write(
                "lock", began=began, waited=time.time() - began, holder=getattr(_local, "what", "?")
            )
        return True

    def __exit__(self, *exc: object) -> None:
        self._depth.n -= 1
        self._inner.release()


Fields = Callable[..., Mapping[str, Any]]


def _timed(
    notes: Notes, kind: str, original: Callable[..., Any], fields: Fields | None = None
) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        before = getattr(_local, "what", None)
        _local.what = kind
        began = time.time()
        try:
            return original(*args, **kwargs)
        finally:
            _local.what = before
            extra = fields(*args, **kwargs) if fields is not None else {}
            notes.write(kind, began=began, ended=time.time(), **extra)

    return call


def _batch_fields(
    self: Any, records: Sequence[Mapping[str, Any]], position: Any = None
) -> dict[str, Any]:
    events = sorted({str(r["EventId"]) for r in records if r.get("RecordType") == "Event"})
    return {
        "records": len(records),
        "events": events,
        "partition": getattr(position, "partition", None),
    }


def _callback_fields(self: Any, context: Any, events: Sequence[Any]) -> dict[str, Any]:
    return {"partition": context.partition_id, "events": len(events)}


def instrument(notes: Notes) -> None:
    """Probe every Consumer this process builds, and the Event Hubs source's callbacks."""
    build = core.Consumer.__init__

    def init(self: core.Consumer, *args: Any, **kwargs: Any) -> None:
        build(self, *args, **kwargs)
        self._lock = TimedLock(self._lock, notes)  # type: ignore[assignment]
        store = self.store
        for name in (
            "read",
            "read_many",
            "write",
            "write_many",
            "write_all",
            "delete",
            "scan",
            "scan_changes",
            "flush",
        ):
            method = getattr(store, name, None)
            if method is not None:
                vars(store)[name] = _counted(notes, name, method)

    core.Consumer.__init__ = init  # type: ignore[method-assign]
    core.Consumer.process = _timed(notes, "process", core.Consumer.process, _batch_fields)  # type: ignore[method-assign]
    core.Consumer.tick = _timed(notes, "tick", core.Consumer.tick)  # type: ignore[method-assign]
    on_batch = eventhubs._OnBatch
    on_batch.__call__ = _timed(notes, "callback", on_batch.__call__, _callback_fields)  # type: ignore[method-assign]
    on_batch._read_to_end = _timed(notes, "probe", on_batch._read_to_end)  # type: ignore[method-assign]


def _counted(notes: Notes, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        began = time.time()
        try:
            return method(*args, **kwargs)
        finally:
            collection = args[0] if args and isinstance(args[0], str) else None
            notes.write(
                "store",
                op=name,
                collection=collection,
                began=began,
                ended=time.time(),
                within=getattr(_local, "what", None),
            )

    return call


def main(argv: Sequence[str]) -> int:
    timeline, *command = argv
    instrument(Notes(Path(timeline)))
    return cli.main(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
