"""`python -m tests.benchmarks.loadgen`: play a fleet wave into real consumers and report.

Examples:

    # the issue's target run: 100,000 VMs, the 20% Freeze wave, real time, 1 then 2 consumers
    python -m tests.benchmarks.loadgen --wave freeze --vms 100000 --scale 1 --consumers 1 2
    # every wave on 20,000 VMs, ten times faster than real time
    python -m tests.benchmarks.loadgen --wave steady freeze spot-storm rolling-reboot scale-in \\
        --vms 20000 --scale 10
    # the same with the fleet state in Table Storage (Azurite), beside SQLite in one report
    python -m tests.benchmarks.loadgen --wave freeze --vms 10000 --scale 4 --state sqlite tables
    # through the Event Hubs test broker (the consumers' Event Hubs source, blob checkpoints
    # in Azurite), beside the local hubs in one report
    python -m tests.benchmarks.loadgen --wave freeze --vms 20000 --scale 4 --consumers 2 \
        --source local broker
    # the record stream alone (no consumer; no approvals, so events start at NotBefore)
    python -m tests.benchmarks.loadgen --wave freeze --vms 300 --records /tmp/freeze.jsonl

Each wave's table goes to stdout and to benchmarks/fleet-<wave>.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from tests.benchmarks.loadgen import waves
from tests.benchmarks.loadgen.fleet import build
from tests.benchmarks.loadgen.play import RESULT, SOURCES, STATES, Run, RunConfig, load
from tests.benchmarks.loadgen.sim import FAN_OUTS, FleetClock, Sim
from tests.benchmarks.loadgen.summary import render, summarize
from tests.benchmarks.rig import ROOT, say


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.loadgen",
        description="The fleet load generator (issue 15): N model agents' exact record stream "
        "(real schema, RecordIds, per-VM order), heartbeats every 300 fleet seconds and a named, "
        "seeded wave, played at a time scale into local hubs or the Event Hubs test broker, "
        "read by real `se-bridge consume` processes (SQLite or Tables state, local command "
        "directory, a policy with budgets). "
        "Model agents "
        "answer the consumers' commands with Approval records and the platform then starts and "
        "completes the events. Reports the consumers' throughput and lag, first record to "
        "Decision (p50, p99), budget violations and wrong approvals (independent checks), state "
        "size and writes per record, and the consumers' peak memory.",
        epilog=__doc__.split("Examples:", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--wave",
        nargs="+",
        choices=sorted(waves.WAVES),
        default=["freeze"],
        help="the waves to play, each in its own runs (default: freeze)",
    )
    p.add_argument("--vms", type=int, default=100_000, help="fleet size (default 100000)")
    p.add_argument("--seed", type=int, default=1, help="fleet and wave seed (default 1)")
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="fleet seconds per wall second (default 1: real time); the consumers' "
        "alive_within, approval_timeout and stale_after are divided by it",
    )
    p.add_argument(
        "--consumers",
        type=int,
        nargs="+",
        default=[1],
        help="consumer process counts, one run each (default 1)",
    )
    p.add_argument(
        "--state",
        nargs="+",
        choices=sorted(STATES),
        default=["sqlite"],
        help="the consumers' fleet state, one run each: sqlite (one file) or tables (a table "
        "in Azurite, started for the run as the test suite starts it) (default sqlite)",
    )
    p.add_argument(
        "--source",
        nargs="+",
        choices=sorted(SOURCES),
        default=["local"],
        help="where the records go, one run each: local (a local hub per consumer, read with "
        "--hub) or broker (the Event Hubs test broker, read by the consumers' Event Hubs "
        "source with blob checkpoints in Azurite, which the run starts) (default local)",
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=4,
        help="broker: the event hub's partitions (default 4, infra/'s eventHubPartitionCount)",
    )
    p.add_argument(
        "--checkpoint-interval",
        type=float,
        default=5.0,
        help="broker: the consumers' consumer.checkpoint_interval (default 5, its default)",
    )
    p.add_argument(
        "--fan-out",
        nargs="+",
        choices=FAN_OUTS,
        default=["named"],
        help="who sees an event, one run each: named (the VMs its Resources name) or group "
        "(every VM of their placement groups and availability sets, as Microsoft documents "
        "delivery; the others report it with AffectsThisVm false) (default named)",
    )
    p.add_argument(
        "--lead-in",
        type=float,
        default=300.0,
        help="fleet seconds of steady state before the wave (default 300)",
    )
    p.add_argument(
        "--tail",
        type=float,
        default=60.0,
        help="fleet seconds of steady state after the wave (default 60)",
    )
    p.add_argument(
        "--share",
        type=float,
        help="freeze: share of the fleet frozen (0.2); rolling-reboot: share of the "
        "fleet in the scale sets rebooted (0.1)",
    )
    p.add_argument(
        "--window",
        type=float,
        help="fleet seconds over which the wave's events appear (freeze 1800, "
        "spot-storm 120, rolling-reboot 300, scale-in 600)",
    )
    p.add_argument("--count", type=int, default=5000, help="spot-storm: evictions (5000)")
    p.add_argument(
        "--steady", type=float, default=900.0, help="steady: fleet seconds of heartbeats (900)"
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=900.0,
        help="wall seconds to wait for the consumers to catch up (900)",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        help="keep hubs, state, logs and decisions here (emptied first); default: "
        "a temporary directory, removed",
    )
    p.add_argument(
        "--out-dir",
        type=Path,
        default=ROOT / "benchmarks",
        help="where the reports go (default benchmarks/)",
    )
    p.add_argument(
        "--records",
        type=Path,
        metavar="FILE",
        help="write the record stream of the (first) wave to FILE as JSONL, with no "
        "consumer, and stop",
    )
    p.add_argument("--log-level", default="INFO", help="the consumers' log level (INFO)")
    p.add_argument(
        "--report-from",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="play nothing: make the report again from runs kept with --workdir "
        f"(each DIR holds a {RESULT}), one column each",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # A run started in the background ignores SIGINT: SIGTERM must also unwind it, so that
    # the consumer processes it started are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    options = waves.WaveOptions(
        share=args.share, window=args.window, count=args.count, steady=args.steady
    )
    if args.report_from:
        return report_again(args.report_from, args.out_dir)
    if args.records is not None:
        return write_records(
            args.wave[0], args.vms, args.seed, options, args.records, fan_out=args.fan_out[0]
        )
    command = "python -m tests.benchmarks.loadgen " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    for wave in args.wave:
        summaries = []
        out = args.out_dir / f"fleet-{wave}.md"
        runs = itertools.product(args.fan_out, args.source, args.state, args.consumers)
        for fan_out, source, state, count in runs:
            # A SQLite run on local hubs keeps the directory name it always had.
            name = "-".join(
                [
                    wave,
                    *([fan_out] if fan_out != "named" else []),
                    *([source] if source != "local" else []),
                    *([state] if state != "sqlite" else []),
                    str(count),
                ]
            )
            config = RunConfig(
                size=args.vms,
                seed=args.seed,
                wave=wave,
                options=options,
                scale=args.scale,
                consumers=count,
                lead_in=args.lead_in,
                tail=args.tail,
                drain_timeout=args.drain_timeout,
                workdir=None if args.workdir is None else args.workdir / name,
                log_level=args.log_level,
                state=state,
                source=source,
                partitions=args.partitions,
                checkpoint_interval=args.checkpoint_interval,
                fan_out=fan_out,
            )
            say(
                f"{wave}: {args.vms:,} VMs, {count} consumer(s), {STATES[state]}, "
                f"{SOURCES[source]}, fan-out {fan_out}, scale {args.scale:g}"
            )
            summaries.append(summarize(Run(config, say).go()))
            # Written after every run, so a long series keeps what it measured so far.
            text = render(wave, summaries, command.strip(), time.strftime("%Y-%m-%d %H:%M %Z"))
            args.out_dir.mkdir(parents=True, exist_ok=True)
            out.write_text(text, encoding="utf-8")
            say(f"written to {out}")
        print(text)
    return 0


def report_again(directories: list[Path], out_dir: Path) -> int:
    results = [load(d / RESULT) for d in directories]
    summaries = [summarize(r) for r in results]
    first = results[0].config
    text = render(
        first.wave,
        summaries,
        "python -m tests.benchmarks.loadgen (runs of "
        + ", ".join(str(d) for d in directories)
        + ")",
        time.strftime("%Y-%m-%d %H:%M %Z"),
    )
    print(text)
    out = out_dir / f"fleet-{first.wave}.md"
    out.write_text(text, encoding="utf-8")
    say(f"written to {out}")
    return 0


def write_records(
    wave: str,
    size: int,
    seed: int,
    options: waves.WaveOptions,
    path: Path,
    *,
    fan_out: str = "named",
) -> int:
    """The stream alone, stamped in fleet time from now, until the wave is over."""
    fleet = build(size, seed)
    plan = waves.plan(wave, fleet, seed, options)
    sim = Sim(fleet, plan, FleetClock(datetime.now(timezone.utc)), seed=seed, fan_out=fan_out)
    with path.open("w", encoding="utf-8") as out:
        for chunk in sim.warm_up():
            out.writelines(json.dumps(r, separators=(",", ":")) + "\n" for _, r in chunk)
        now = 0.0
        while not sim.finished(now):
            now += 10.0
            out.writelines(json.dumps(r, separators=(",", ":")) + "\n" for _, r in sim.advance(now))
    say(f"{sim.counts['records']:,} records of {size:,} VMs ({plan.description}) in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
