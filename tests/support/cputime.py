"""Where the test run's CPU goes: a pytest plugin, opt-in, that charges each test its CPU.

    .venv/bin/pytest -p tests.support.cputime --cputime-report cputime.txt -n 4 --dist loadscope

CI's machine has two cores and the suite keeps them busy, so what a test costs the run is its
CPU, not its wall time (a test that waits on a socket for ten seconds costs the others little).
For each test (set-up, call and tear-down together) this records the CPU of the worker process
(all its threads, `time.process_time`; of that, the test's own thread's, `time.thread_time`:
the rest is servers the test runs in threads, or threads an earlier test left running), the
CPU of the child processes it reaped (`getrusage(RUSAGE_CHILDREN)`: a child counts when it is
waited for, so one a test leaves running is charged to whichever test reaps it, and a
grandchild only once its parent reaped it) and the wall time. A session- or module-scoped
fixture is charged to the first test that uses it, its tear-down to the last.

Under xdist each worker appends its lines beside the report and the controller adds them up:
FILE lists the modules and the tests by CPU, most first; FILE.jsonl keeps every test's line,
in the order each worker ran them.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import time
from collections.abc import Generator
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Cost:
    """One test's cost in seconds: CPU of its process (`own`; `thread` of it in the test's
    thread), CPU of the children it reaped, the clock; and the xdist worker that ran it."""

    nodeid: str
    own: float
    thread: float
    children: float
    wall: float
    worker: str
    gc: float = 0.0  # of `own`, the CPU of the garbage collector's passes

    @property
    def cpu(self) -> float:
        return self.own + self.children

    @property
    def module(self) -> str:
        return self.nodeid.split("::", 1)[0]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cputime-report",
        metavar="FILE",
        help="write each test's CPU (its process, its reaped children) and wall time to FILE",
    )


def _report(config: pytest.Config) -> Path | None:
    report = config.getoption("cputime_report")
    return Path(report).resolve() if report else None


class _Collector:
    """The CPU the garbage collector spent, added up from its start and stop callbacks."""

    def __init__(self) -> None:
        self.total = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.total += time.process_time() - self._started


_COLLECTOR = _Collector()


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _parts(report: Path) -> list[Path]:
    # One file per process: each xdist worker's, or the one process's without xdist.
    return sorted(report.parent.glob(f"{report.name}.*.part"))


def pytest_configure(config: pytest.Config) -> None:
    report = _report(config)
    if report and not hasattr(config, "workerinput"):
        for stale in _parts(report):  # left by a run that was stopped
            stale.unlink()
    if report and _COLLECTOR not in gc.callbacks:
        gc.callbacks.append(_COLLECTOR)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    report = _report(item.config)
    if report is None:  # the plugin is loaded but not asked for
        yield
        return
    own, thread, children = time.process_time(), time.thread_time(), _children_cpu()
    wall, collected = time.perf_counter(), _COLLECTOR.total
    yield
    cost = Cost(
        item.nodeid,
        own=time.process_time() - own,
        thread=time.thread_time() - thread,
        children=_children_cpu() - children,
        wall=time.perf_counter() - wall,
        worker=os.environ.get("PYTEST_XDIST_WORKER", ""),
        gc=_COLLECTOR.total - collected,
    )
    part = report.with_name(f"{report.name}.{os.getpid()}.part")
    with part.open("a", encoding="utf-8") as out:
        out.write(json.dumps(asdict(cost)) + "\n")


def pytest_sessionfinish(session: pytest.Session) -> None:
    report = _report(session.config)
    if report is None or hasattr(session.config, "workerinput"):
        return  # not asked for, or an xdist worker: the controller writes the report
    lines: list[str] = []
    for part in _parts(report):
        lines += part.read_text("utf-8").splitlines()
        part.unlink()
    report.with_name(f"{report.name}.jsonl").write_text("".join(f"{x}\n" for x in lines), "utf-8")
    report.write_text(render([Cost(**json.loads(line)) for line in lines]), "utf-8")


def render(costs: list[Cost], top: int = 60) -> str:
    """The report: the totals, then the modules and the `top` tests by CPU, most first.
    `threads` is the CPU of the process's threads other than the test's; `gc` the garbage
    collector's, in whichever thread it ran."""
    modules: dict[str, list[Cost]] = {}
    for cost in costs:
        modules.setdefault(cost.module, []).append(cost)
    head = f"{'cpu s':>8} {'own s':>8} {'threads':>8} {'gc s':>8} {'child s':>8} {'wall s':>8}"

    def row(group: list[Cost]) -> str:
        own = sum(c.own for c in group)
        return (
            f"{sum(c.cpu for c in group):8.1f} {own:8.1f} {own - sum(c.thread for c in group):8.1f}"
            f" {sum(c.gc for c in group):8.1f} {sum(c.children for c in group):8.1f}"
            f" {sum(c.wall for c in group):8.1f}"
        )

    lines = [
        f"{len(costs)} tests: {sum(c.cpu for c in costs):.1f} s CPU"
        f" ({sum(c.own for c in costs):.1f} s in pytest's processes, of which"
        f" {sum(c.gc for c in costs):.1f} s collecting garbage,"
        f" {sum(c.children for c in costs):.1f} s in their children),"
        f" {sum(c.wall for c in costs):.1f} s wall summed over workers",
        "",
        f"{head} {'tests':>6}  module",
    ]
    for module, group in sorted(modules.items(), key=lambda m: -sum(c.cpu for c in m[1])):
        lines.append(f"{row(group)} {len(group):6d}  {module}")
    lines += ["", f"{head}  test (the {top} costliest)"]
    lines += [f"{row([c])}  {c.nodeid}" for c in sorted(costs, key=lambda c: -c.cpu)[:top]]
    return "\n".join(lines) + "\n"
