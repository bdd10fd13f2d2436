"""`se-bridge status --consumer`: what people have done to the fleet, read from a consumer's
fleet state (read only), as a monitoring check.

It shows the pauses in force (scope, until when, by whom, why), the asks pending with how long
each has waited, the Update Manager patch runs a person is asked about (with [patchruns] on:
configuration, window, cut-off, the budgets they would break), the budget overrides of the
last 24 hours, and, where the week ahead is read (weekahead.enabled), the planned runs of the
next 14 days that would break a budget, from the newest pass's summary
(bridge.consumer.weekaheadpass). What people decided is in the
state's `operator` documents, and only those signed with the consumer's own key count
(bridge.consumer.people.operatorlog): the check verifies them with the same key, from the same
setting (commands.signing_key), so it shows exactly what the consumer applies; a document that
does not verify is counted and left out. The asks are what the consumer's own code decides now
of each open event (`PeopleDesk.open_events`, as the approval page lists them).

The exit code follows `se-bridge status` (the monitoring-plugin convention):

- 0 OK;
- 1 WARNING: a pause holds (early approvals wait), an ask has been pending longer than
  `--ask-age`, operator documents do not verify (written by hand, or the key rotated), or a
  planned run of the days ahead would break a budget;
- 3 UNKNOWN: whatever stops the check from looking (a bad setting or policy, no signing key to
  verify with, a state that does not answer); with `--json` still one object.

Nothing here is CRITICAL: a pause or an unanswered ask never stops maintenance, which starts at
NotBefore (default-proceed, docs/people.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from bridge.commands.signing import Signer
from bridge.config import Config, ConfigError, WeekAheadSettings, given
from bridge.consumer import wiring
from bridge.consumer.command import LOOK_FLAGS
from bridge.consumer.core import Consumer
from bridge.consumer.explain import NoCommands, ignore_decisions
from bridge.consumer.patchruns import asks_in, rule_of
from bridge.consumer.people.desk import OpenEvent, PatchAsk
from bridge.consumer.people.operatorlog import OperatorAction
from bridge.consumer.weekaheadpass import read_summary
from bridge.monitoring import LEVELS, WARNING, CheckReport, emit, said, unknown
from bridge.policy.model import Pause
from bridge.records import iso, parse_time, utc_now
from bridge.redact import describe, printable

OVERRIDES_WITHIN = timedelta(hours=24)  # the overrides listed: the last day's, as the issue asks
STALE_MARGIN = timedelta(minutes=30)  # a week-ahead read this late past two intervals is overdue


@dataclass
class Report(CheckReport):
    state: str = ""
    pauses: list[dict[str, Any]] = field(default_factory=list)
    asks: list[dict[str, Any]] = field(default_factory=list)
    # Spot rebalance recommendations open: never asks, never approved; what the policy did.
    advisories: list[dict[str, Any]] = field(default_factory=list)
    overrides: list[dict[str, Any]] = field(default_factory=list)
    # Update Manager's patch runs a person is asked about (issue 40): apart from event asks.
    patch_runs: list[dict[str, Any]] = field(default_factory=list)
    forged: int = 0
    on_previous_key: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # operator documents refused, by why
    # The newest week-ahead pass's summary (weekaheadpass.summarize); None: never read.
    week_ahead: dict[str, Any] | None = None


def run(args: argparse.Namespace) -> int:
    spec = args.state or ""
    try:
        config = wiring.load_config(args.config, flags=given(args, *LOOK_FLAGS))
        spec = wiring.state_spec(config)
        report = _look(config, spec, timedelta(seconds=args.ask_age))
    except ConfigError as err:
        return _unknown(args, spec, str(err))
    except Exception as err:  # a check that cannot look says UNKNOWN, never a traceback and 1
        return _unknown(args, spec, f"cannot read the fleet state: {describe(err, with_type=True)}")
    emit(_said(args, report))
    return report.level


def _look(config: Config, spec: str, ask_age: timedelta) -> Report:
    policy = wiring.load_policy(config.consumer.policy)
    signer = _verifier(config)
    store = wiring.build_store(spec, config)
    # Read-only: what a previous key signed is shown as the consumer applies it, not rewritten.
    consumer = Consumer(
        store,
        NoCommands(),
        policy,
        ignore_decisions,
        config.consumer,
        signer=signer,
        trusted=wiring.load_previous_keys(config),
        sign_again=False,
    )
    try:
        now, desk = utc_now(), consumer.desk
        pauses, events = desk.pauses(now), desk.open_events(now)
        actions = desk.actions(now - OVERRIDES_WITHIN)
        counts = desk.counts()  # after the reads: what they found forged or refused
        report = assess(
            spec,
            pauses=pauses,
            events=events,
            actions=actions,
            forged=counts.forged,
            on_previous_key=counts.on_previous_key,
            refused=counts.refused,
            now=now,
            ask_age=ask_age,
        )
        if config.patchruns.enabled:
            add_patch_asks(report, asks_in(store, rule_of(config.patchruns)))
        week_ahead(report, read_summary(store), config.weekahead, now)
        return report
    finally:
        consumer.close()


def _verifier(config: Config) -> Signer:
    signer = wiring.load_signer(config)
    if signer is None:
        raise ConfigError(
            "what people decided is verified with the consumer's key: set "
            "commands.signing_key (SE_BRIDGE_COMMANDS_SIGNING_KEY)"
        )
    return signer


def assess(
    state: str,
    *,
    pauses: Sequence[Pause],
    events: Sequence[OpenEvent],
    actions: Sequence[OperatorAction],
    forged: int,
    now: datetime,
    on_previous_key: int = 0,
    refused: Mapping[str, int] | None = None,
    ask_age: timedelta,
) -> Report:
    """What people have done, and whether it warns; pure."""
    report = Report(state=state)
    for pause in pauses:
        report.pauses.append(
            {
                "scope": pause.scope or "fleet",
                "until": iso(pause.until) if pause.until else None,
                "by": pause.by.name,
                "by_object_id": pause.by.object_id,
                "reason": pause.reason,
                "at": iso(pause.at),
            }
        )
        until = f"until {iso(pause.until)}" if pause.until else "until resumed"
        report.flag(
            WARNING,
            f"{pause.scope or 'the fleet'} is paused {until} by "
            f"{pause.by.name}: early approvals wait",
        )
    for event in events:
        if event.advisory:
            report.advisories.append(
                {
                    "event_id": event.event_id,
                    "event_type": event.event_type,
                    "vms": list(event.vms),
                    "action": event.action,
                    "reason": event.reason,
                }
            )
            continue
        if event.asked is None:
            continue
        waited = (now - event.asked.since) if event.asked.since else timedelta(0)
        report.asks.append(
            {
                "event_id": event.event_id,
                "event_type": event.event_type,
                "vms": list(event.vms),
                "target": event.asked.target,
                "since": iso(event.asked.since) if event.asked.since else None,
                "age_seconds": int(waited.total_seconds()),
                "deadline": iso(event.asked.deadline) if event.asked.deadline else None,
                "not_before": iso(event.not_before) if event.not_before else None,
            }
        )
        if waited > ask_age:
            report.flag(
                WARNING,
                f"an ask about {event.event_id} ({event.asked.target}) is "
                f"pending for {_age(waited)}",
            )
    report.overrides = [
        {
            "event_id": a.event_id,
            "by": a.by.name,
            "by_object_id": a.by.object_id,
            "reason": a.reason,
            "at": iso(a.at),
        }
        for a in actions
        if a.kind == "approve" and a.override_budget
    ]
    report.forged = forged
    report.on_previous_key = on_previous_key
    if on_previous_key:
        report.flag(
            WARNING,
            f"{on_previous_key} operator actions are signed with a previous key "
            "only: keep it in commands.verify_key until the consumer has signed "
            "them again",
        )
    if forged:
        report.flag(
            WARNING,
            f"{forged} operator documents do not verify with the consumer's "
            "key and are ignored (written by hand? the key rotated?)",
        )
    report.refused = dict(refused or {})
    if report.refused:
        whys = ", ".join(f"{why} {count}" for why, count in sorted(report.refused.items()))
        report.flag(
            WARNING,
            f"{sum(report.refused.values())} operator documents in the state "
            f"are refused ({whys}): someone who can write the fleet state is at "
            "work (docs/people.md#what-is-kept)",
        )
    return report


def add_patch_asks(report: Report, asks: Sequence[PatchAsk]) -> None:
    """The patch runs a person is asked about, as the approval page lists them; pure. They
    change no level: a run nobody answers gets patchruns.on_deadline at its deadline."""
    report.patch_runs += [
        {
            "run": ask.subject,
            "configuration": ask.configuration,
            "start": iso(ask.start),
            "end": iso(ask.end),
            "cutoff": iso(ask.cutoff) if ask.cutoff else None,
            "target": ask.target,
            "deadline": iso(ask.deadline) if ask.deadline else None,
            "on_deadline": ask.on_deadline,
            "vms": ask.vms,
            "breaches": list(ask.breaches),
        }
        for ask in asks
    ]


def _patch_lines(report: Report) -> list[str]:
    lines = [f"patch runs asked about: {len(report.patch_runs)}"]
    for run in report.patch_runs:
        budgets = sorted({b.split(":", 1)[0].removeprefix("budget ") for b in run["breaches"]})
        lines.append(
            f"  {run['run']} {run['start']} to {run['end']}, cut-off {run['cutoff'] or 'none'}: "
            f"asked {run['target']} until {run['deadline'] or 'the cut-off'}, then "
            f"{run['on_deadline']}; {run['vms']} VMs; breaks budget {', '.join(budgets)}"
        )
    return lines


def week_ahead(
    report: Report, summary: dict[str, Any] | None, settings: WeekAheadSettings, now: datetime
) -> None:
    """The week ahead's runs that would break a budget, and a read overdue, each a WARNING;
    pure."""
    report.week_ahead = summary
    if not summary:
        return
    count = int(summary.get("breaking_total", 0))
    if count:
        report.flag(
            WARNING,
            f"{count} planned runs of the next 14 days would break a budget (read at "
            f"{summary.get('at')}): split or move them before they run "
            "(docs/planned-disruptions.md)",
        )
    read = parse_time(summary.get("at"))
    overdue = timedelta(seconds=2 * settings.interval) + STALE_MARGIN
    if settings.enabled and read is not None and now - read > overdue:
        report.flag(
            WARNING,
            f"the week ahead was last read at {summary.get('at')}, more than two "
            f"weekahead.intervals ago: see the consumer's log (its failures are counted in "
            'se_bridge_consumer_failures_total{activity="weekahead"})',
        )


def week_ahead_lines(summary: dict[str, Any] | None) -> list[str]:
    """What render says of the week ahead: a line per break of each listed run."""
    if not summary:
        return []
    lines = [
        f"week ahead: {summary.get('breaking_total', 0)} runs would break a budget, "
        f"{summary.get('others', 0)} others (read at {summary.get('at')}; "
        f"{summary.get('problems', 0)} not readable)"
    ]
    for run in summary.get("breaking") or ():
        lines += [f"  break: {line}" for line in run.get("breaks") or ()]
    unlisted = int(summary.get("breaking_total", 0)) - len(summary.get("breaking") or ())
    if unlisted > 0:
        lines.append(f"  and {unlisted} more runs that would break a budget")
    return lines


def render(report: Report) -> str:
    lines = [f"{LEVELS[report.level]}: se-bridge consumer state {report.state}"]
    lines += [f"  {problem}" for problem in report.problems]
    lines.append(f"pauses in force: {len(report.pauses)}")
    lines += [
        f"  paused: {p['scope']} {'until ' + p['until'] if p['until'] else 'until resumed'}"
        f" by {p['by']}: {p['reason']}"
        for p in report.pauses
    ]
    lines.append(f"asks pending: {len(report.asks)}")
    lines += [
        f"  {a['event_id']} {a['event_type']} on {', '.join(a['vms'])}: asked {a['target']}"
        f" {_age(timedelta(seconds=a['age_seconds']))} ago, NotBefore {a['not_before']}"
        for a in report.asks
    ]
    lines += _patch_lines(report)
    lines.append(f"advisories open (never approved): {len(report.advisories)}")
    lines += [
        f"  {a['event_id']} {a['event_type']} on {', '.join(a['vms'])}: "
        f"{a['action']}: {a['reason']}"
        for a in report.advisories
    ]
    lines.append(
        f"budget overrides in the last {OVERRIDES_WITHIN.total_seconds() / 3600:g} h: "
        f"{len(report.overrides)}"
    )
    lines += [
        f"  override: {o['event_id']} by {o['by']} ({o['by_object_id']}) at {o['at']}: "
        f"{o['reason']}"
        for o in report.overrides
    ]
    lines += week_ahead_lines(report.week_ahead)
    return "\n".join(printable(line) for line in lines)


def _age(waited: timedelta) -> str:
    minutes = int(waited.total_seconds() // 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60} min"


def _unknown(args: argparse.Namespace, state: str, problem: str) -> int:
    return unknown(Report(state=state), problem, args.json, render)


def _said(args: argparse.Namespace, report: Report) -> str:
    return said(report, args.json, render)
