"""7. Fleet scale (issue 15): the 20% Freeze wave through a real `se-bridge consume`.

The fleet load generator (tests/benchmarks/loadgen) plays the wave into a local hub for one
consumer process with SQLite state: 2,000 VMs at 30 times real time with --quick, 20,000 at 10
times by default, and the issue's target, 100,000 VMs in real time, with --long (about 50
minutes). Every wave, several consumers and the full tables: `python -m
tests.benchmarks.loadgen --help` (reports in benchmarks/fleet-*.md).
"""

from __future__ import annotations

from tests.benchmarks.loadgen.play import Run, RunConfig
from tests.benchmarks.loadgen.summary import DECISION_P99_TARGET, KEEP_UP_TARGET, summarize
from tests.benchmarks.report import Row
from tests.benchmarks.rig import Options, Result, say


def run(options: Options) -> Result:
    size = options.pick(quick=2_000, default=20_000, long=100_000)
    scale = float(options.pick(quick=30, default=10, long=1))
    config = RunConfig(size=size, wave="freeze", scale=scale, consumers=1)
    say(f"fleet: the freeze wave, {size:,} VMs, one consumer, {scale:g} times real time")
    summary = summarize(Run(config, say).go())
    lag, lat = summary.lag, summary.latencies
    p50, p99 = lat.p("decision", 50), lat.p("decision", 99)
    what = f"{size:,} VMs, freeze wave at {scale:g}x"
    rss = max(c.peak_rss_kb for c in summary.result.consumers) / 1024
    largest = max(summary.result.largest.items(), key=lambda item: item[1][1], default=None)
    rows = [
        Row("7a", f"Consumer keeps up, {what}: oldest unhandled record, p99 of samples",
            f"{lag.p99_age:.2f} s ({lag.consumed_rate:,.0f} records/s)",
            f"≤ {KEEP_UP_TARGET:g} s", summary.keeps_up),
        Row("7b", f"First record → Decision, {what}",
            f"p50 {p50 or 0:.2f} s, p99 {p99 or 0:.2f} s",
            f"p99 ≤ {DECISION_P99_TARGET:g} s", summary.decision_met),
        Row("7c", "Budget violations (independent check)", str(len(summary.violations)), "0",
            not summary.violations),
        Row("7d", "Approvals no rule allowed (independent check)", str(len(summary.wrong)), "0",
            not summary.wrong),
        Row("7e", f"Consumer peak memory, {what}", f"{rss:,.0f} MB", "", None),
        Row("7f", "Largest state document during the wave",
            f"{largest[0]}/{largest[1][0][:12]}… {largest[1][1] / 1024:,.1f} KB"
            if largest else "none", "", None),
    ]  # fmt: skip
    notes = [
        f"7: {summary.result.plan.description}; full table: python -m tests.benchmarks.loadgen"
    ]
    return Result(rows, notes)
