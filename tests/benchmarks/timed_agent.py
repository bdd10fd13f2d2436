"""`python -m tests.benchmarks.timed_agent TIMELINE agent ARGS...`: the real `se-bridge agent`
command, in its own process as on a VM, with probes that note when things happen.

Benchmark 2 runs the agent this way so that nothing of the benchmark (the sink doubles, their
threads, their garbage) shares the agent's interpreter lock or its garbage collector. The
probes note, on the monotonic clock every process of the machine shares: each IMDS body as it
arrives, each spool commit as it returns (durable: synchronous=FULL), each batch a sink double
accepted, and each full garbage collection. Notes are written to TIMELINE as JSON lines, but
only after a commit or an accepted batch, so no file write falls between an IMDS answer and
the commit it leads to.
"""

from __future__ import annotations

import gc
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bridge import cli
from bridge.agent.loop import Agent
from bridge.sinks import Sink, SpooledRecord

FULL = 2  # the generation of a full garbage collection


class Notes:
    """Timestamped notes, held in memory and appended to a file when `flush` is called."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        self._held: list[dict[str, Any]] = []
        self._file = path.open("a", encoding="utf-8")

    def hold(self, kind: str, **fields: Any) -> None:
        at = time.monotonic()
        with self._lock:
            self._held.append({"kind": kind, "at": at, **fields})

    def flush(self) -> None:
        with self._lock:
            held, self._held = self._held, []
            self._file.writelines(json.dumps(note) + "\n" for note in held)
            self._file.flush()


def _probe_imds(agent: Agent, notes: Notes) -> None:
    original: Callable[[], bytes] = agent.imds.scheduled_events

    def scheduled_events() -> bytes:
        body = original()
        notes.hold("body", body=body.decode("utf-8", "replace"))
        return body

    vars(agent.imds)["scheduled_events"] = scheduled_events  # shadows the method


def _probe_spool(agent: Agent, notes: Notes) -> None:
    original: Callable[..., None] = agent.spool.commit

    def commit(records: Sequence[dict[str, Any]], **kwargs: Any) -> None:
        original(records, **kwargs)
        notes.hold("commit", ids=[str(r["EventId"]) for r in records if r.get("EventId")])
        notes.flush()

    vars(agent.spool)["commit"] = commit


def _probe_sink(sink: Sink, notes: Notes) -> None:
    original: Callable[[Sequence[SpooledRecord]], None] = sink.send

    def send(batch: Sequence[SpooledRecord]) -> None:
        original(batch)
        notes.hold("accept", sink=sink.name, bodies=[r.body for r in batch])
        notes.flush()

    vars(sink)["send"] = send


def _probe_gc(notes: Notes) -> None:
    began: list[float] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != FULL:
            return
        if phase == "start":
            began[:] = [time.perf_counter()]
        elif began:
            notes.hold("gc", seconds=time.perf_counter() - began[0])

    gc.callbacks.append(callback)


def instrument(notes: Notes) -> None:
    """Probe every Agent this process builds, right after it is built."""
    build = Agent.__init__

    def init(self: Agent, *args: Any, **kwargs: Any) -> None:
        build(self, *args, **kwargs)
        _probe_imds(self, notes)
        _probe_spool(self, notes)
        for sink in self.sinks:
            _probe_sink(sink, notes)

    Agent.__init__ = init  # type: ignore[method-assign]
    _probe_gc(notes)


def main(argv: Sequence[str]) -> int:
    timeline, *command = argv
    instrument(Notes(Path(timeline)))
    return cli.main(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
