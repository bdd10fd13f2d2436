"""1. The idle agent against the seeds' sample loop: CPU per poll and resident memory.

Both poll the same simulator (each its own VM) every second, at the same time, for the whole
run, so machine noise hits both alike. CPU is read in consecutive windows; each window gives
one agent/sample ratio of CPU per poll, and the table quotes the median. The agent ships to
Event Hubs and Log Analytics (the doubles) with a managed identity from the simulator.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import requests

from bridge import schema
from tests.benchmarks import procstat
from tests.benchmarks.report import Row, median, slope_per_minute, window_medians
from tests.benchmarks.rig import ROOT, Options, Result, agent_options, say, scratch
from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.doubles.logs_ingestion import LogsIngestionDouble
from tests.support.cloud import RULE, cloud_env
from tests.support.processes import PROBES, PYTHON, Proc, Simulator
from tests.support.wait import eventually

WARM_UP = 15.0  # the first token fetch and SDK imports are start-up, not idle cost
RSS_EVERY = 5.0
RSS_TARGET_MB = 50.0
FLAT_KB_PER_MIN = 100.0  # "flat": under 1 MB of growth in 10 minutes
RATIO_TARGET = 0.45
SCRAPE_EVERY = 15.0  # Prometheus' default scrape interval


@dataclass
class Window:
    agent_cpu: float
    sample_cpu: float
    agent_polls: int
    sample_polls: int

    @property
    def ratio(self) -> float:
        return (self.agent_cpu / self.agent_polls) / (self.sample_cpu / self.sample_polls)


def run(options: Options) -> Result:
    duration = options.pick(quick=30, default=120, long=600)
    windows = 3 if options.quick else 6
    broker = EventHubsBroker(hub="records", partitions=4)
    logs = LogsIngestionDouble(RULE, schema.DCR_STREAM, schema.dcr_stream_declaration())
    with broker, logs, scratch("footprint") as procs:
        sim = Simulator.launch(procs, "sim", "--vms", "2")
        agent = procs.bridge(
            "agent",
            "agent",
            *agent_options(sim, "vm-0", procs.workdir / "agent", "eventhubs", "loganalytics"),
            "--metrics-address",
            "0",
            env=cloud_env(broker, logs, sim.vm_url("vm-0")),
        )
        sample = procs.start(
            "sample",
            [PYTHON, str(ROOT / "tests" / "benchmarks" / "sample_loop.py")],
            env={"SAMPLE_IMDS_BASE": sim.vm_url("vm-1"), "NO_PROXY": "127.0.0.1,localhost"},
        )
        eventually(lambda: " polling http" in agent.stderr(), what="the agent to poll", timeout=60)
        # Metrics on, scraped as Prometheus would (every 15 s): the footprint includes them.
        scraper = Scraper(agent)
        say(f"footprint: warming up {WARM_UP:g} s, then {duration} s measured")
        time.sleep(WARM_UP)
        measured = _measure(sim, agent, sample, duration=duration, windows=windows)
        scraper.stop()
        for proc in (agent, sample):
            if not proc.alive:
                raise RuntimeError(f"{proc.name} died during the run\n{proc.output()}")
        assert agent.stop() == 0, agent.output()
    return _result(measured, duration)


class Scraper:
    """GET /metrics every SCRAPE_EVERY seconds from the address the agent's log names."""

    def __init__(self, agent: Proc) -> None:
        found = eventually(
            lambda: PROBES.search(agent.stderr()), what="the metrics address", timeout=30
        )
        self.url = f"{found.group(1)}/metrics"
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SCRAPE_EVERY):
            requests.get(self.url, timeout=5).raise_for_status()
            self.scrapes += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Measured:
    windows: list[Window]
    rss: dict[str, list[tuple[float, float]]]
    whole_run_ticks: dict[str, float]
    whole_run_polls: dict[str, int]


def _measure(sim: Simulator, agent: Proc, sample: Proc, *, duration: int, windows: int) -> Measured:
    pids = {"agent": agent.popen.pid, "sample": sample.popen.pid}
    vms = {"agent": "vm-0", "sample": "vm-1"}
    rss: dict[str, list[tuple[float, float]]] = {name: [] for name in pids}
    start = time.monotonic()
    ticks0 = {n: procstat.ticks_seconds(p) for n, p in pids.items()}
    polls0 = {n: sim.polls(vm) for n, vm in vms.items()}
    found: list[Window] = []
    span = duration / windows
    for _ in range(windows):
        cpu0 = {n: procstat.thread_cpu_ns(p) for n, p in pids.items()}
        polls = {n: sim.polls(vm) for n, vm in vms.items()}
        end = time.monotonic() + span
        while time.monotonic() < end:
            for name, pid in pids.items():
                rss[name].append((time.monotonic() - start, procstat.rss_kb(pid) / 1024))
            time.sleep(min(RSS_EVERY, max(0.0, end - time.monotonic())))
        cpu = {
            n: procstat.cpu_delta_seconds(cpu0[n], procstat.thread_cpu_ns(p))
            for n, p in pids.items()
        }
        now = {n: sim.polls(vm) for n, vm in vms.items()}
        found.append(
            Window(
                cpu["agent"],
                cpu["sample"],
                now["agent"] - polls["agent"],
                now["sample"] - polls["sample"],
            )
        )
        say(f"footprint window: ratio {found[-1].ratio:.2f}")
    ticks = {n: procstat.ticks_seconds(p) - ticks0[n] for n, p in pids.items()}
    total = {n: sim.polls(vm) - polls0[n] for n, vm in vms.items()}
    return Measured(found, rss, ticks, total)


def _result(m: Measured, duration: int) -> Result:
    ratio = median([w.ratio for w in m.windows])
    agent_ms = median([w.agent_cpu / w.agent_polls * 1000 for w in m.windows])
    sample_ms = median([w.sample_cpu / w.sample_polls * 1000 for w in m.windows])
    ticks_ratio = (m.whole_run_ticks["agent"] / m.whole_run_polls["agent"]) / (
        m.whole_run_ticks["sample"] / m.whole_run_polls["sample"]
    )
    peak = max(v for _, v in m.rss["agent"])
    slope_kb = slope_per_minute(m.rss["agent"]) * 1024
    sample_peak = max(v for _, v in m.rss["sample"])
    rows = [
        Row("1a", "Idle CPU per poll, agent / seeds' sample (median of "
            f"{len(m.windows)} paired windows)",
            f"{ratio:.2f} ({agent_ms:.2f} ms vs {sample_ms:.2f} ms)", f"≤ {RATIO_TARGET}",
            ratio <= RATIO_TARGET),
        Row("1b", "Agent resident memory, EH + LA + identity + metrics configured (peak)",
            f"{peak:.1f} MB (sample: {sample_peak:.1f} MB)", f"≤ {RSS_TARGET_MB:g} MB",
            peak <= RSS_TARGET_MB),
        Row("1c", f"Agent memory growth over {duration / 60:g} min (least-squares slope)",
            f"{slope_kb:+.0f} KB/min", f"≤ {FLAT_KB_PER_MIN:g} KB/min",
            slope_kb <= FLAT_KB_PER_MIN),
    ]  # fmt: skip
    notes = [
        "1: with metrics on (--metrics-address), scraped every 15 s during the run.",
        f"1: whole-run cross-check from utime+stime (10 ms ticks, ended threads included): "
        f"agent/sample = {ticks_ratio:.2f} over {m.whole_run_polls['agent']} and "
        f"{m.whole_run_polls['sample']} polls.",
        "1: per-window ratios: " + ", ".join(f"{w.ratio:.2f}" for w in m.windows) + ".",
        "1: agent resident memory, median of each window (growth or settling): "
        + ", ".join(f"{v:.2f}" for v in window_medians(m.rss["agent"], len(m.windows)))
        + " MB.",
    ]
    return Result(rows, notes)
