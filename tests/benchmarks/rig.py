"""What every benchmark shares: its options, its result, a scratch directory with processes."""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.benchmarks.report import Row
from tests.support.processes import Processes, Simulator

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Options:
    quick: bool = False  # a smoke run: few samples, numbers not worth quoting
    long: bool = False  # the full 10-minute memory run

    def pick(self, *, quick: int, default: int, long: int | None = None) -> int:
        if self.quick:
            return quick
        return long if (self.long and long is not None) else default


@dataclass
class Result:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@contextlib.contextmanager
def scratch(name: str) -> Iterator[Processes]:
    """A temporary directory and the processes started in it (killed at the end)."""
    with tempfile.TemporaryDirectory(prefix=f"se-bench-{name}-") as tmp:
        procs = Processes(Path(tmp))
        try:
            yield procs
        finally:
            procs.close()


def say(message: str) -> None:
    """Progress on stderr: the table goes to stdout."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def agent_options(sim: Simulator, vm: str, state_dir: Path, *sinks: str) -> list[str]:
    """A benchmark agent's options: the simulator's `vm`, polled once a second, its state in
    `state_dir`, and a --sink for each of `sinks`."""
    options = ["--imds-url", sim.vm_url(vm), "--poll-interval", "1", "--state-dir", str(state_dir)]
    return options + [word for sink in sinks for word in ("--sink", sink)]


def consumer_options(workdir: Path, decisions: Path) -> list[str]:
    """A benchmark consumer's options: its fleet state in Table Storage, its commands on
    Storage queues, its Decision records in `decisions`."""
    state = ["--state", "tables", "--state-dir", str(workdir / "consumer")]
    return ["--commands", "storagequeue", *state, "--sink", f"jsonl:{decisions}"]
