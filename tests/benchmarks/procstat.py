"""What Linux says about a process: CPU time and resident memory, from /proc.

CPU comes from each thread's schedstat (nanoseconds on the CPU) because utime+stime in
/proc/PID/stat count in clock ticks (10 ms): an idle agent spends about 1.5 ms per poll, so
a 30-poll window would be four ticks. A thread that ends within a window takes its time
with it; `ticks_seconds` (which keeps it) cross-checks the whole run.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu_ns(pid: int) -> dict[int, int]:
    """Nanoseconds each live thread of `pid` has spent on a CPU."""
    out: dict[int, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended while we looked
    return out


def cpu_delta_seconds(before: dict[int, int], after: dict[int, int]) -> float:
    """CPU seconds between two `thread_cpu_ns` readings (threads born since count in full)."""
    return sum(ns - before.get(tid, 0) for tid, ns in after.items()) / 1e9


def ticks_seconds(pid: int) -> float:
    """utime + stime of the whole process (ended threads included), in seconds."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"process {pid} reports no VmRSS")
