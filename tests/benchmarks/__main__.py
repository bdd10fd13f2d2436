"""`python -m tests.benchmarks [--quick | --long] [--only N ...] [--out FILE]` (`./dev bench`).

Runs the measurements of issue 6 in order, prints one markdown table (and the notes that
explain it) and writes them to benchmarks/latest.md, with the command and the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.benchmarks import (
    bench_approval,
    bench_arm_ack,
    bench_consumer,
    bench_cost,
    bench_detection,
    bench_drain,
    bench_eventgrid,
    bench_fleet,
    bench_footprint,
    bench_node_drain,
    bench_quota,
    bench_reconciler,
    bench_replay,
)
from tests.benchmarks.report import render_table
from tests.benchmarks.rig import ROOT, Options, Result, say

BENCHES: dict[str, Callable[[Options], Result]] = {
    "1": bench_footprint.run,
    "2": bench_detection.run,
    "3": bench_approval.run,
    "4": bench_drain.run,
    "5": bench_consumer.run,
    "6": bench_cost.run,
    "7": bench_fleet.run,
    "8": bench_quota.run,
    "9": bench_node_drain.run,
    "10": bench_eventgrid.run,
    "11": bench_arm_ack.run,
    "12": bench_reconciler.run,
    "13": bench_replay.run,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev bench", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="smoke run: few samples")
    mode.add_argument("--long", action="store_true", help="the full 10-minute memory run")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHES), help="these measurements")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "latest.md")
    args = parser.parse_args(argv)
    options = Options(quick=args.quick, long=args.long)
    began = time.monotonic()
    rows, notes = [], []
    for number in args.only or sorted(BENCHES):
        say(f"measurement {number}")
        result = BENCHES[number](options)
        rows += result.rows
        notes += result.notes
    command = "./dev bench " + " ".join(sys.argv[1:] if argv is None else argv)
    text = _report(command.strip(), render_table(rows), notes, time.monotonic() - began)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    say(f"written to {args.out}")
    return 0


def _report(command: str, table: str, notes: list[str], seconds: float) -> str:
    machine = (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}"
    )
    lines = [
        "# Benchmarks",
        "",
        f"`{command}` on {time.strftime('%Y-%m-%d %H:%M %Z')}, {machine}; took "
        f"{seconds / 60:.1f} min. Machine shared with other work: compare ratios, not "
        "absolute times.",
        "",
        table,
        "",
        "Notes:",
        "",
        *(f"- {note}" for note in notes),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
