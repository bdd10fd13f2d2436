"""A run's numbers (`summarize`) and the markdown report of a wave's runs (`render`).

The targets are the issue's and are printed beside the results, met or not; nothing here
lowers them. "The consumers keep up" is read as: during the wave, no record waits unhandled
in a hub longer than the decision target (p99 of the per-second samples of the oldest
waiting record <= 5 s), since a record that waits longer cannot be decided within it. With
the Event Hubs broker, "handled" can only be read from the checkpoints the consumers write,
at most every `checkpoint_interval` seconds per partition: a record handled at once still
shows as waiting until the next one, so there the bound is 5 s plus that interval. The
decision target, read from the Decision records' own times, is the same for both.
"""

from __future__ import annotations

import itertools
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass

from bridge.consumer.ledger import LOCKS, SHARDS
from bridge.consumer.state import MAX_VALUE_CHARS
from tests.benchmarks.loadgen import measure
from tests.benchmarks.loadgen.play import STATE_EVERY, TABLES_STATE_EVERY, RunConfig, RunResult

DECISION_P99_TARGET = 5.0
KEEP_UP_TARGET = 5.0  # seconds the oldest unhandled record may wait (p99 of samples)
SHOWN = 3  # violations and wrong approvals quoted in the notes
LEDGER_DOCUMENTS = SHARDS + LOCKS + 1  # the most a look at the ledger returns (the legacy one too)


@dataclass
class Summary:
    label: str
    result: RunResult
    steady: measure.Lag | None  # the lead-in: heartbeats only
    lag: measure.Lag
    peak_rate: float
    latencies: measure.Latencies
    violations: list[str]
    wrong: list[str]

    @property
    def keeps_up(self) -> bool:
        return self.lag.p99_age <= keep_up_target(self.result.config)

    @property
    def decision_met(self) -> bool:
        p99 = self.latencies.p("decision", 99)
        return p99 is not None and p99 <= DECISION_P99_TARGET and not self.latencies.undecided


def keep_up_target(config: RunConfig) -> float:
    """How long the oldest unhandled record may seem to wait (see the module's docstring)."""
    return KEEP_UP_TARGET + (config.checkpoint_interval if config.source == "broker" else 0.0)


def summarize(result: RunResult) -> Summary:
    config = result.config
    events = result.sim.events
    approvals = measure.approvals_of(result.decisions)
    settings = config.consumer_settings()
    lag = measure.lag(result.samples, result.wave_start, result.wave_end)
    try:
        steady: measure.Lag | None = measure.lag(
            result.samples, result.lead_start, result.wave_start
        )
    except ValueError:  # no lead-in to speak of
        steady = None
    window = [s for s in result.samples if result.wave_start <= s.wall <= result.wave_end]
    # A consumer hears a VM's last record when it reads it: up to the longest wait in a hub
    # after it was written (plus a sample's second): so long may it still count the VM alive.
    slack = max(s.oldest_age for s in result.samples) + 2 * measure_interval(result.samples)
    check = measure.BudgetCheck(
        result.fleet, result.stopped, alive_within=settings["alive_within"], slack=slack
    )
    count = config.consumers
    via = ", Event Hubs broker" if config.source == "broker" else ""
    via += ", group fan-out" if config.fan_out == "group" else ""
    return Summary(
        label=f"{count} consumer{'s' if count > 1 else ''}, {config.state_name}{via}",
        result=result,
        steady=steady,
        lag=lag,
        peak_rate=measure.peak_rate(window),
        latencies=measure.latencies(events.values(), result.decisions),
        violations=check.violations(events, approvals, result.samples),
        wrong=measure.wrong_approvals(result.fleet, events, approvals),
    )


def measure_interval(samples: Sequence[measure.LagSample]) -> float:
    """The longest gap between two samples."""
    return max((b.wall - a.wall for a, b in itertools.pairwise(samples)), default=1.0)


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else (f"{value:.2f} s" if value < 10 else f"{value:.0f} s")


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _cells(s: Summary) -> dict[str, str]:
    r, lag, lat = s.result, s.lag, s.latencies
    sim = r.sim
    started = [e for e in sim.events.values() if e.started is not None]
    by_approval = sum(1 for e in started if e.started_by == "approval")
    consumed_total = r.samples[-1].consumed - _at(r.samples, r.wave_start).consumed
    if r.writes is None:
        writes = (
            "n/a: Table Storage keeps no count of writes (bench_quota counts the "
            "requests, through a proxy)"
        )
    else:
        writes = ", ".join(
            f"{c} {n / max(1, consumed_total):.2f}" for c, n in sorted(r.writes.items())
        )
    largest = ", ".join(
        f"{c}/{k[:36]} {n / 1024:,.1f} KB" for c, (k, n) in sorted(r.largest.items())
    )
    documents = ", ".join(f"{c} {n:,}" for c, n in sorted(r.documents.items()))
    drained = (
        f"{r.drained_at - r.wave_end:.0f} s after the wave"
        if r.drained_at is not None
        else "**not within the drain timeout**"
    )
    rss = ", ".join(f"{c.peak_rss_kb / 1024:,.0f} MB" for c in r.consumers)
    cpu = sum(c.cpu_seconds for c in r.consumers)
    trouble = ", ".join(
        f"{c.warnings} warnings, {c.errors} errors, {c.poison} poison" for c in r.consumers
    )
    trouble += f" — {_met(not any(c.errors or c.poison for c in r.consumers))}"
    actions = ", ".join(f"{a} {n:,}" for a, n in sorted(lat.actions.items()))
    reasons = ", ".join(f"{why} ({n:,})" for why, n in lat.waits.most_common(3))
    answers = ", ".join(f"{o} {n:,}" for o, n in sorted(sim.outcomes.items()))
    twice = sum(1 for n in sim.approved.values() if n > 1)
    p50, p99 = lat.p("decision", 50), lat.p("decision", 99)
    a50, a99 = lat.p("approval", 50), lat.p("approval", 99)
    return {
        "warm": f"{r.warm_records:,} in {r.warm_seconds:.1f} s "
        f"({r.warm_records / max(r.warm_seconds, 1e-9):,.0f}/s)",
        "steady": _steady(s.steady, keep_up_target(r.config)),
        "offered": f"{lag.offered:,} in {lag.seconds:,.0f} s ({lag.offered_rate:,.0f}/s)",
        "consumed": f"{lag.consumed_rate:,.0f}/s"
        + (f" (peak 10 s: {s.peak_rate:,.0f}/s)" if s.peak_rate else ""),
        "keep": f"p99 {_seconds(lag.p99_age)}, max {_seconds(lag.max_age)}, backlog max "
        f"{lag.max_backlog:,} records; drained {drained} — {_met(s.keeps_up)}",
        "decision": f"p50 {_seconds(p50)}, p99 {_seconds(p99)} ({len(lat.to_decision):,} events"
        f", {len(lat.undecided)} undecided) — {_met(s.decision_met)}",
        "approval": f"p50 {_seconds(a50)}, p99 {_seconds(a99)} ({len(lat.to_approval):,} events)",
        "actions": actions or "none",
        "waits": reasons or "none",
        "answers": f"{answers or 'none'}; events approved by two agents: {twice} — "
        f"{_met(twice == 0)}",
        "started": f"{by_approval:,} by approval, {len(started) - by_approval:,} at NotBefore; "
        f"{len(sim.deleted):,} VMs deleted, {len(sim.silent):,} agents silent",
        "violations": f"{len(s.violations)} — {_met(not s.violations)}",
        "wrong": f"{len(s.wrong)} — {_met(not s.wrong)}",
        "largest": largest or "none",
        "documents": documents or "none",
        "writes": writes or "none",
        "size": _size(r),
        "rss": rss,
        "cpu": f"{cpu:,.1f} s ({cpu * 1000 / max(1, consumed_total):.2f} ms per record)",
        "busiest": _busiest(r),
        "azurite": _azurite(r),
        "trouble": trouble,
        "generator": f"{r.generator_cpu:,.0f} s CPU, {r.generator_rss_kb / 1024:,.0f} MB peak; "
        f"load average max {r.load_max:.1f}",
        "commands": f"{r.commands:,} read",
        "ledger": _ledger(r, lat.actions.get("Approve", 0)),
    }


def _ledger(r: RunResult, approvals: int) -> str:
    """The consumers' approval-ledger counters over the wave, per approval, and what they
    would cost Table Storage's one `ledger` partition (a look returns up to 97 entities)."""
    counted = [c.ledger for c in r.consumers if c.ledger is not None]
    if not counted or len(counted) < len(r.consumers):
        return "n/a (a consumer's metrics were not read)"
    looks, conflicts, fetched = (sum(c[i] for c in counted) for i in range(3))
    end = r.drained_at if r.drained_at is not None else r.samples[-1].wall
    seconds = max(1e-9, end - r.wave_start)
    per = max(1, approvals)
    return (
        f"{looks:,} looks, {conflicts:,} conflicts, {fetched:,} documents by key for "
        f"{approvals:,} approvals ({looks / per:.2f}, {conflicts / per:.2f}, "
        f"{fetched / per:.2f} each); on Table Storage at most "
        f"{(looks * LEDGER_DOCUMENTS + fetched) / seconds:,.0f} entities/s on the ledger "
        f"partition over {seconds:,.0f} s"
    )


def _size(r: RunResult) -> str:
    text = f"; the documents' JSON {r.state_chars / 1e6:,.1f} MB" if r.state_chars else ""
    if r.state_bytes is not None:
        return f"{r.state_bytes / 1e6:,.1f} MB file with its WAL" + text
    return f"no file: Azurite holds it in memory{text}"


def _busiest(r: RunResult) -> str:
    """Each process's highest CPU share over 10 s, the warm-up's burst included: a process
    near 100% of a core is what held the rest back."""
    if not r.cpu:
        return "n/a"
    top = measure.busiest(r.cpu)
    shares = [f"consumer-{i} {share:.0%}" for i, share in enumerate(top.consumers)]
    if top.azurite is not None:
        shares.append(f"Azurite {top.azurite:.0%}")
    return ", ".join(shares)


def _azurite(r: RunResult) -> str:
    if not r.config.azurite:
        return "n/a (no Azurite)"
    wave = measure.cpu_between(
        r.cpu, r.wave_start, r.drained_at if r.drained_at is not None else r.samples[-1].wall
    )
    warm = measure.cpu_between(r.cpu, r.lead_start - r.warm_seconds, r.lead_start)
    parts = []
    for name, spent in (("warm-up", warm), ("wave start to drained", wave)):
        if spent is not None and spent.azurite is not None:
            parts.append(
                f"{name} {spent.azurite:,.1f} s ({spent.azurite / spent.wall:.0%} of "
                f"a core; consumers {sum(spent.consumers) / spent.wall:.0%})"
            )
    parts.append(f"peak memory {r.azurite_rss_kb / 1024:,.0f} MB")
    return "; ".join(parts)


def _steady(lag: measure.Lag | None, target: float) -> str:
    if lag is None:
        return "n/a (no lead-in)"
    return (
        f"{lag.offered_rate:,.0f} records/s written, {lag.consumed_rate:,.0f}/s handled; "
        f"oldest unhandled p99 {_seconds(lag.p99_age)}, max {_seconds(lag.max_age)} — "
        f"{_met(lag.p99_age <= target)}"
    )


def _at(samples: Sequence[measure.LagSample], wall: float) -> measure.LagSample:
    return next((s for s in samples if s.wall >= wall), samples[-1])


ROWS = (
    ("warm", "Warm-up: every VM's Start heartbeat handled", ""),
    ("steady", "Steady state before the wave (heartbeats only)",
     f"keep up: p99 ≤ {KEEP_UP_TARGET:g} s"),
    ("offered", "Records written to the hubs during the wave", ""),
    ("consumed", "Records handled per second during the wave", ""),
    ("keep", "Lag: oldest unhandled record's wait (samples each second)",
     f"keep up: p99 ≤ {KEEP_UP_TARGET:g} s"),
    ("decision", "Event's first record in a hub → its first Decision",
     f"p99 ≤ {DECISION_P99_TARGET:g} s"),
    ("approval", "Event's first record → its Approve Decision", ""),
    ("actions", "Decision records", ""),
    ("waits", "Why events waited (Defer and Hold reasons, most frequent)", ""),
    ("answers", "Model agents' Approval records (one approval per event)", "0 twice"),
    ("started", "Events started; VMs gone", ""),
    ("violations", "Budget violations (independent check)", "0"),
    ("wrong", "Approvals no rule allowed (independent check)", "0"),
    ("largest", "Largest state document per collection (during the run)",
     f"≤ {MAX_VALUE_CHARS / 1024:,.0f} KB (Table Storage's 1 MiB entity)"),
    ("documents", "State documents at the end", ""),
    ("writes", "State write transactions per record handled, by collection", ""),
    ("size", "State at the end", ""),
    ("rss", "Consumer peak resident memory (VmHWM)", ""),
    ("cpu", "Consumer CPU (all processes), wave start to drained", ""),
    ("busiest", "Busiest 10 s per process, share of one core (warm-up included)", ""),
    ("azurite", "Azurite (the Tables state, the broker's checkpoints) CPU and memory", ""),
    ("ledger", "Approval ledger, wave start to drained: looks, conflicts, documents read by key",
     "≤ 2,000 entities/s (a table partition)"),
    ("trouble", "Consumer log and dead letters", "0 errors, 0 poison"),
    ("commands", "Commands the model agents read", ""),
    ("generator", "Load generator itself", ""),
)  # fmt: skip


TABLES_NOTE = (
    "- Tables on Azurite: the consumers keep the fleet state in a table of their own "
    "(bridge.consumer.state.tables, as against Azure) in Azurite, the emulator the test suite "
    "runs: in memory, one node process on this machine, started for the run. What it shows "
    "is the consumer's Tables code path and one local emulator's limits, not Table Storage's "
    "latency or scalability targets. Its documents are read for their size every "
    f"{TABLES_STATE_EVERY:g} s (SQLite's every {STATE_EVERY:g} s), since those reads go through "
    "the same process."
)


FAN_OUT_TEXT = {
    "named": "the VMs its Resources name",
    "group": "every VM of their placement groups and availability sets, as Microsoft "
    "documents delivery (the others report it with AffectsThisVm false)",
}
BROKER_NOTE = (
    "the Event Hubs test broker's one event hub ({partitions} partitions, AMQP, in the load "
    "generator's process; the records sent through the real azure-eventhub producer, each "
    "with its VM's partition key), read by its Event Hubs source: the consumers share the "
    "partitions through ownership blobs and checkpoint each at most every {interval:g} s to a "
    "blob container in Azurite, whose checkpoints are what the lag rows read"
)


def render(wave: str, summaries: Sequence[Summary], command: str, when: str) -> str:
    first = summaries[0].result
    config = first.config
    machine = (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}"
    )
    settings = ", ".join(f"{k} {v:g} s" for k, v in config.consumer_settings().items())
    names = list(dict.fromkeys(s.result.config.state_name for s in summaries))
    sources = {s.result.config.source for s in summaries}
    fan_outs = {s.result.config.fan_out: s.result.sim.counts["events"] for s in summaries}
    broker = next((s.result.config for s in summaries if s.result.config.source == "broker"), None)
    reads = []  # what the consumers read, for each kind of run in the report
    if "local" in sources:
        reads.append(
            "its own local hub (the VMs spread over them by VmId, as Event Hubs partitions are)"
        )
    if broker is not None:
        reads.append(
            BROKER_NOTE.format(partitions=broker.partitions, interval=broker.checkpoint_interval)
        )
    lines = [
        f"# Fleet load: {wave}",
        "",
        f"`{command}` on {when}, {machine}. Machine shared with other work.",
        "",
        "- Code: "
        + ", ".join(f"{s.result.revision or 'unknown'} ({s.label})" for s in summaries)
        + ".",
        f"- Fleet: {first.fleet.summary()}.",
        f"- Wave: {first.plan.description}. Who sees an event: "
        + "; or ".join(f"{FAN_OUT_TEXT[f]} ({n:,} Event records)" for f, n in fan_outs.items())
        + ".",
        f"- Time scale {config.scale:g} fleet seconds per wall second; {config.lead_in:g} fleet "
        f"seconds of heartbeats (every 300 s per VM) before the wave, {config.tail:g} after. "
        f"Consumer settings scaled with it: {settings}.",
        "- Each consumer is a `se-bridge consume` process with "
        + " or ".join(reads)
        + ", one shared fleet state ("
        + " or ".join(names)
        + "), one local command directory; the policy is "
        "tests/benchmarks/loadgen/policy.py (max_percent 20 per scale set, max_vms 2 per "
        "availability set).",
        *([] if "tables" not in {s.result.config.state for s in summaries} else [TABLES_NOTE]),
        "",
        "| Measurement | " + " | ".join(s.label for s in summaries) + " | Target |",
        "|---|" + "---|" * len(summaries) + "---|",
    ]
    cells = [_cells(s) for s in summaries]
    for key, name, target in ROWS:
        shown = target
        if target.startswith("keep up") and broker is not None:
            shown += f" ({keep_up_target(broker):g} s read from the broker's checkpoints)"
        row = [name, *(c[key] for c in cells), shown]
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in row) + " |")
    notes = []
    for s in summaries:
        for text in s.violations[:SHOWN]:
            notes.append(f"{s.label}: budget violation: {text}")
        for text in s.wrong[:SHOWN]:
            notes.append(f"{s.label}: wrong approval: {text}")
        for c in s.result.consumers:
            notes += [f"{s.label}, {c.name}: {line}" for line in c.samples]
        if s.latencies.undecided:
            notes.append(f"{s.label}: undecided events, such as {s.latencies.undecided[:3]}")
    if notes:
        lines += ["", "Notes:", "", *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n"
