"""`se-bridge status`: what an agent holds, read from its state directory (no IMDS call).

What an operator asks first: who the agent reports as, the last Scheduled Events document
it acted on and its events, how IMDS answered at the last heartbeat, what each sink still
has to take (and since when), dead letters and shed records, hooks still running, the drains
of its Kubernetes node (running, and blocked by what), and the approvals it remembers.
`--json` prints the same as one object for a script.

The exit code follows the monitoring-plugin convention (Nagios, Icinga, Sensu, a Zabbix
external check), so `se-bridge status` is a ready-made check:

- 0 OK;
- 1 WARNING: dead letters, shed records, a sink whose oldest waiting record is older
  than `--backlog-age`, a sink failing for good (its last error is shown), IMDS not yet
  answered since the agent started, or a drain of the node blocked now;
- 2 CRITICAL: no heartbeat for two heartbeat intervals and a minute (the agent is not
  running, or stuck), the agent stopped, or IMDS unanswered at the last heartbeat for longer
  than `--imds-age`;
- 3 UNKNOWN: whatever stops the check from looking (no spool in that directory, a bad
  setting or option, an unreadable spool): never 1 or 2, which a monitoring system would
  take for the agent's state.

What the spool holds came from IMDS, sinks and hooks: the text form shows control and
format characters escaped, so none of it can drive the terminal or forge a line.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bridge.agent.drains import is_drain_job
from bridge.config import ConfigError, add_flags, given, load
from bridge.monitoring import (
    CRITICAL,
    LEVELS,
    UNKNOWN,
    WARNING,
    CheckReport,
    emit,
    said,
    unknown,
)
from bridge.outbox.inspect import SpoolStatus, inspect
from bridge.outbox.spool import SpoolError, StateKey
from bridge.records import VmIdentity, parse_time, utc_now
from bridge.redact import describe, printable

EXAMPLES = """\
examples:
  se-bridge status                                   # the default state directory
  se-bridge status --state-dir /var/lib/se-bridge --json
  se-bridge status --backlog-age 300 --imds-age 600  # as a monitoring check: exit 0, 1, 2 or 3
  se-bridge status --consumer --config consumer.toml --ask-age 900  # pauses, asks, overrides
"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "status",
        help="what an agent holds: identity, IMDS, spool per sink, hooks, approvals",
        description="Read an agent's state directory (no IMDS call) and say what it holds; "
        "with --consumer, a consumer's fleet state (what people paused, asked, overrode). "
        "Exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN, as a monitoring check expects.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML settings file (the agent's; with --consumer, the consumer's)",
    )
    add_flags(p, "agent.state_dir")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--backlog-age",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="WARNING when a sink's oldest waiting record is older (default 900)",
    )
    p.add_argument(
        "--imds-age",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="CRITICAL when IMDS last answered longer ago, as of the last heartbeat (default 900)",
    )
    p.set_defaults(func=run, usage_status=UNKNOWN)


@dataclass
class Report(CheckReport):
    state_dir: str = ""
    identity: dict[str, Any] = field(default_factory=dict)
    heartbeat: dict[str, Any] = field(default_factory=dict)
    document: dict[str, Any] = field(default_factory=dict)
    spool: dict[str, Any] = field(default_factory=dict)
    hooks: list[dict[str, Any]] = field(default_factory=list)
    drain: dict[str, Any] = field(default_factory=dict)  # [kubernetes]: the node's drains
    approvals: dict[str, Any] = field(default_factory=dict)


def run(args: argparse.Namespace) -> int:
    state_dir: Path | None = args.state_dir
    try:
        config = load(args.config, flags=given(args, "agent.state_dir"))
        state_dir = Path(os.path.abspath(config.agent.state_dir))
        status = inspect(state_dir / "spool.db")
        report = assess(
            status, utc_now(), timedelta(seconds=args.backlog_age), timedelta(seconds=args.imds_age)
        )
        report.state_dir = str(state_dir)
        said = _said(args, report)
    except (ConfigError, SpoolError) as err:
        return _unknown(args, state_dir, str(err))
    except Exception as err:  # a check that cannot look says UNKNOWN, never a traceback and 1
        return _unknown(
            args, state_dir, f"cannot read the agent's state: {describe(err, with_type=True)}"
        )
    emit(said)
    return report.level


def _unknown(args: argparse.Namespace, state_dir: Path | None, problem: str) -> int:
    return unknown(Report(state_dir=str(state_dir or "")), problem, args.json, render)


def _said(args: argparse.Namespace, report: Report) -> str:
    return said(report, args.json, render)


def assess(
    status: SpoolStatus, now: datetime, backlog_age: timedelta, imds_age: timedelta
) -> Report:
    """What the spool says, and how bad it is; pure."""
    report = Report(state_dir=str(status.path.parent))
    identity = VmIdentity.from_state(status.state.get(StateKey.IDENTITY))
    report.identity = {k: v for k, v in asdict(identity).items() if v not in (None, (), [])}
    _heartbeat(report, status.state.get(StateKey.HEALTH), now, imds_age)
    _document(report, status.state.get(StateKey.NORMALISER))
    _spool(report, status, now, backlog_age)
    report.hooks = [
        {
            "job": job_id,
            "phase": payload.get("phase"),
            "event": (payload.get("trigger") or {}).get("EventId"),
            # A prepare hook held behind the drain (bridge.agent.prepare) says so.
            **({"after": payload["after"]} if payload.get("after") else {}),
        }
        for job_id, payload in status.jobs
        if not is_drain_job(payload)
    ]
    _drain(report, status)
    approved = (status.state.get(StateKey.APPROVALS) or {}).get("events") or {}
    seen = (status.state.get(StateKey.SEEN_COMMANDS) or {}).get("seen") or {}
    report.approvals = {"approved_events": approved, "commands": seen}
    return report


def _heartbeat(
    report: Report, health: dict[str, Any] | None, now: datetime, imds_age: timedelta
) -> None:
    if not health:
        report.flag(CRITICAL, "no heartbeat recorded yet: the agent has not run here")
        return
    report.heartbeat = dict(health)
    at = parse_time(health.get("at"))
    interval = timedelta(seconds=float(health.get("heartbeat_interval") or 300))
    if health.get("reason") == "Stop":
        report.flag(CRITICAL, f"the agent stopped at {health.get('at')}")
    elif at is None or now - at > 2 * interval + timedelta(minutes=1):
        report.flag(CRITICAL, f"no heartbeat since {health.get('at')}: is the agent running?")
    success = parse_time(health.get("last_imds_success"))
    started = parse_time(health.get("started_at")) or at
    if success is None:
        since = health.get("started_at")
        if started is None or (at or now) - started > imds_age:
            report.flag(CRITICAL, f"IMDS had not answered since the agent started at {since}")
        else:
            report.flag(WARNING, f"IMDS has not answered since the agent started at {since}")
    elif at is not None and at - success > imds_age:
        report.flag(
            CRITICAL,
            f"IMDS had not answered since {health.get('last_imds_success')} at the last heartbeat",
        )


def _drain(report: Report, status: SpoolStatus) -> None:
    """The drains of the node that are running (a job in the spool) and the last news of one;
    a drain that is blocked right now is a WARNING, naming what blocks it."""
    running = [
        {"phase": p.get("phase"), "event": p.get("event_id")}
        for _, p in status.jobs
        if is_drain_job(p)
    ]
    last = status.state.get(StateKey.DRAIN)
    if not running and not last:
        return
    report.drain = {"running": running, "last": last or {}}
    if not last or last.get("status") != "Blocked":
        return
    if {"phase": "prepare", "event": last.get("event")} in running:
        report.flag(
            WARNING,
            f"the drain of node {last.get('node')} for event "
            f"{last.get('event')} is blocked (at {last.get('at')}): "
            f"{last.get('detail')}",
        )


EVENT_FIELDS = (
    "EventId",
    "EventType",
    "EventStatus",
    "NotBefore",
    "Resources",
    "EventSource",
    "AffectsThisVm",
)


def _document(report: Report, state: dict[str, Any] | None) -> None:
    state = state or {}
    events = [e for e in (state.get("events") or {}).values() if isinstance(e, dict)]
    report.document = {
        "incarnation": state.get("incarnation"),
        "acted_on_at": state.get("observed_at"),
        "events": [{key: event.get(key) for key in EVENT_FIELDS} for event in events],
    }


def _spool(report: Report, status: SpoolStatus, now: datetime, backlog_age: timedelta) -> None:
    troubles = (status.state.get(StateKey.DELIVERY) or {}).get("sinks")
    troubles = troubles if isinstance(troubles, dict) else {}
    report.spool = {
        "path": str(status.path),
        "records": status.records,
        "bytes": status.bytes,
        "shed": status.shed,
        "sinks": [{**asdict(sink), "last_error": troubles.get(sink.name)} for sink in status.sinks],
    }
    if status.shed:
        report.flag(WARNING, f"{status.shed} records were shed at the spool's bound (lost)")
    for sink in status.sinks:
        oldest = parse_time(sink.oldest)
        if oldest is not None and now - oldest > backlog_age:
            report.flag(
                WARNING,
                f"sink {sink.name} has {sink.waiting} records waiting, the "
                f"oldest from {sink.oldest}",
            )
        if sink.dead_letters:
            report.flag(
                WARNING, f"sink {sink.name} set {sink.dead_letters} records aside as dead letters"
            )
        trouble = troubles.get(sink.name)
        if isinstance(trouble, dict) and trouble.get("kind") == "permanent":
            report.flag(
                WARNING,
                f"sink {sink.name} cannot deliver since {trouble.get('since')}: "
                f"{trouble.get('error')}",
            )


def _imds_lines(beat: dict[str, Any]) -> list[str]:
    """Where the agent asks IMDS, whether it answers, since when, and what it last said when
    it did not: what an operator needs to find why (an agent from before these were kept
    says no address)."""
    success = beat.get("last_imds_success")
    answering = "answering" if beat.get("imds_healthy") else "not answering"
    said = f"{answering}, last answered {success}" if success else "not yet answered"
    lines = [f"IMDS {beat.get('imds_url') or '(address not recorded)'}: {said}"]
    error = beat.get("last_imds_error")
    if isinstance(error, dict):
        lines.append(f"  last error at {error.get('at')}: {error.get('error')}")
    return lines


def render(report: Report) -> str:
    ident = report.identity
    lines = [f"{LEVELS[report.level]}: se-bridge agent state in {report.state_dir}"]
    lines += [f"  {problem}" for problem in report.problems]
    lines.append(
        f"identity: VM {ident.get('vm_name', '?')} ({ident.get('vm_id', 'VmId not known yet')})"
        + (f", scale set {ident['vm_scale_set_name']}" if "vm_scale_set_name" in ident else "")
        + (f", resource group {ident['resource_group']}" if "resource_group" in ident else "")
    )
    beat = report.heartbeat
    if beat:
        lines.append(f"last heartbeat: {beat.get('at')} ({beat.get('reason')})")
        lines += _imds_lines(beat)
    lines += _document_lines(report.document)
    lines += _spool_lines(report.spool)
    lines.append(f"hooks running: {len(report.hooks)}")
    lines += [
        f"  {h['phase']} for {h['event']}"
        + (f" (waits for the {h['after']})" if h.get("after") else "")
        for h in report.hooks
    ]
    if report.drain:
        lines += _drain_lines(report.drain)
    approvals = report.approvals
    lines.append(
        f"approvals remembered: {len(approvals['approved_events'])} events, "
        f"{len(approvals['commands'])} commands"
    )
    for command, seen in approvals["commands"].items():
        lines.append(f"  command {command}: {seen.get('outcome')} (kept until {seen.get('until')})")
    return "\n".join(printable(line) for line in lines)


def _document_lines(doc: dict[str, Any]) -> list[str]:
    if doc.get("incarnation") is None:
        return ["last document acted on: none yet"]
    lines = [
        f"last document acted on: incarnation {doc.get('incarnation')} at "
        f"{doc.get('acted_on_at')}, {len(doc.get('events', []))} events"
    ]
    for event in doc.get("events", []):
        lines.append(
            f"  {event['EventId']} {event['EventType']} {event['EventStatus']}, "
            f"NotBefore {event['NotBefore']}, Resources {event['Resources']}"
            + (" (this VM)" if event.get("AffectsThisVm") else "")
        )
    return lines


def _spool_lines(spool: dict[str, Any]) -> list[str]:
    lines = [
        f"spool: {spool['records']} records ({spool['bytes']} bytes) held, {spool['shed']} shed"
    ]
    for sink in spool["sinks"]:
        since = f", oldest from {sink['oldest']}" if sink["oldest"] else ""
        trouble = sink["last_error"]
        failing = (
            f"; failing since {trouble.get('since')}: {trouble.get('error')}"
            if isinstance(trouble, dict)
            else ""
        )
        lines.append(
            f"  {sink['name']}: {sink['waiting']} waiting{since}; "
            f"{sink['dead_letters']} dead letters{failing}"
        )
    return lines


def _drain_lines(drain: dict[str, Any]) -> list[str]:
    lines = [f"node drains running: {len(drain['running'])}"]
    lines += [
        f"  {'drain' if d['phase'] == 'prepare' else 'uncordon'} for {d['event']}"
        for d in drain["running"]
    ]
    last = drain["last"]
    if last:
        lines.append(
            f"  last: node {last.get('node')}, event {last.get('event')}: "
            f"{last.get('status')} at {last.get('at')}"
        )
        lines += [
            f"    pod {b.get('Namespace')}/{b.get('Pod')}: {b.get('Reason')}"
            + (
                f" (PodDisruptionBudget {b['PodDisruptionBudget']})"
                if b.get("PodDisruptionBudget")
                else ""
            )
            for b in last.get("blockers") or []
        ]
    return lines
