"""`se-bridge policy replay`: recorded history through a policy file, and what would have
differed from what was decided (docs/policy.md#replaying-history).

It reads the history (`--records`, repeatable: a Log Analytics export, the agents' and the
consumer's jsonl files), replays it with bridge.consumer.replay and prints, per event and per
rule, what differs, with the budgets' arithmetic: a table, or one JSON object (`--json`). It
writes nothing.

Exit codes: 0 nothing differed, 1 something did (a difference the replay stands by; marked
ones do not count), 2 bad input (a policy, a setting, a file).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bridge import recordtypes as rt
from bridge.config import ConfigError, ConsumerSettings, given
from bridge.consumer import armcarrier, wiring
from bridge.consumer.explain import Chunked, SetAside, chunked, records_in
from bridge.consumer.replay import Decided, EventReplay, Replay, replay, replay_chunks
from bridge.policy.model import Policy
from bridge.records import is_event, iso

SAME, DIFFERED, BAD_INPUT = 0, 1, 2


def run_replay(args: argparse.Namespace) -> int:
    try:
        config = wiring.load_config(args.config, flags=given(args, "consumer.policy"))
        policy = wiring.load_policy(config.consumer.policy)
        aside: list[SetAside] = []
        large = chunked(args.records[0], aside) if len(args.records) == 1 else None
        history = read_history(args.records, aside) if large is None else []
        last_resort = armcarrier.wanted(config)  # ARM's acknowledge, as the live one
        read_lag = timedelta(seconds=args.read_lag)
        if large is None:
            done = replay(history, policy, config.consumer, last_resort=last_resort,
                          read_lag=read_lag)  # fmt: skip
        else:
            done = _replay_as_read(large, args.records, aside, policy, config.consumer,
                                   last_resort=last_resort, read_lag=read_lag)  # fmt: skip
    except ConfigError as err:
        print(f"se-bridge: {err}", file=sys.stderr)
        return BAD_INPUT
    shown = (render_json if args.json else render)(done, policy, every=args.all, aside=aside)
    print(shown)
    return DIFFERED if done.differing else SAME


def read_history(paths: Sequence[Path], aside: list[SetAside]) -> list[rt.Record]:
    """The records of every file (`policy explain`'s reading of each); ConfigError when none
    holds an Event record. A record the consumer would refuse goes to `aside`, as the live
    consumer sets it aside, and the others are replayed: one record never stops the rest."""
    records = [r for path in paths for r in records_in(path, aside)]
    if not any(is_event(r) for r in records):
        raise _no_event(paths, aside)
    return records


def _replay_as_read(
    large: Chunked,
    paths: Sequence[Path],
    aside: list[SetAside],
    policy: Policy,
    settings: ConsumerSettings,
    *,
    last_resort: bool,
    read_lag: timedelta,
) -> Replay:
    """`replay` of one large file's records as `read_history` reads them, begun while they are
    read (issue 40); the same ConfigError, once every record is read."""
    events = False

    def watched() -> Iterator[list[rt.Record]]:
        nonlocal events
        for chunk in large.chunks():
            events = events or any(is_event(r) for r in chunk)
            yield chunk

    try:
        done = replay_chunks(watched(), large.decisions, policy, settings,
                             last_resort=last_resort, read_lag=read_lag)  # fmt: skip
    finally:
        large.close()
    if not events:
        raise _no_event(paths, aside)
    return done


def _no_event(paths: Sequence[Path], aside: Sequence[SetAside]) -> ConfigError:
    named = ", ".join(str(p) for p in paths)
    refused = f" ({_count(len(aside), 'record')} set aside: {aside[0]})" if aside else ""
    return ConfigError(
        f"--records {named}: no Event record: a replay needs the agents' records "
        "(an export of SeBridgeRecords_CL, or their jsonl sinks), not only Decision "
        f"records{refused}"
    )


# --- the table -------------------------------------------------------------------------------


def render(
    done: Replay, policy: Policy, *, every: bool = False, aside: Sequence[SetAside] = ()
) -> str:
    """The replay as a person reads it: what was replayed, the records set aside and why, a
    line per event that differs with each side's decisions and their budgets, the marked
    ones, and a table per rule."""
    lines = _header(done, policy)
    if aside:
        lines.append(f"\n{_count(len(aside), 'record')} set aside (not replayed):")
        lines += [f"  {a}" for a in aside]
    differing, marked = done.differing, done.marked
    if differing:
        lines.append(f"\n{_count(len(differing), 'event')} would have been decided differently:")
        for event in differing:
            lines += _event_lines(event)
    if marked:
        lines.append(
            f"\n{_count(len(marked), 'event')} {'differs' if len(marked) == 1 else 'differ'} "
            "for reasons a replay cannot reproduce (marked, not counted):"
        )
        for event in marked:
            lines += _event_lines(event)
    if every:
        same = [e for e in done.events if not e.differs]
        if same:
            lines.append(f"\n{_count(len(same), 'event')} decided the same:")
            for event in same:
                lines += _event_lines(event)
    lines += ["", *_rule_table(done)]
    return "\n".join(lines)


def _header(done: Replay, policy: Policy) -> list[str]:
    span = f"{_when(done.first)} to {_when(done.last)}" if done.first else "no time"
    history = (
        f"the history's {_count(done.decisions, 'decision')} (DecisionMode {done.mode}, by "
        f"{', '.join(done.recorded_policies)})"
        if done.decisions
        else "the history holds no Decision record: every decision the replay takes is new"
    )
    differing, marked = len(done.differing), len(done.marked)
    same = sum(1 for e in done.events if not e.differs)
    return [
        f"replayed {_count(done.records, 'record')} of the agents, {span}, through {policy.source}",
        f"compared with {history}",
        f"{_count(len(done.events), 'event')}: {differing} would differ, {marked} marked "
        f"(a person, agents' silence, the timing of reads, a drain), {same} the same",
    ]


def _event_lines(event: EventReplay) -> list[str]:
    vms = ", ".join(event.resources) or "no VM named"
    lines = [
        f"  event {event.event_id}: {event.event_type or 'unknown type'} from "
        f"{event.event_source or 'an unknown source'}, {vms}"
    ]
    lines += _side("recorded", event.recorded)
    lines += _side("replayed", event.replayed)
    if event.assumed:
        lines.append(
            f"    assumed: the history never sent {_count(len(event.assumed), 'approval')} the "
            "replay sends; taken as approved at once by its VM"
        )
    lines += [f"    marked ({m.kind}): {m.why}" for m in event.marks]
    return lines


def _side(name: str, decided: Sequence[Decided]) -> list[str]:
    """One side's decisions, a line each with its budgets' lines under it (those its reason
    does not already say)."""
    if not decided:
        return [f"    {name}  no decision"]
    lines, indent = [], " " * (len(name) + 4)
    for n, d in enumerate(decided):
        label = name if n == 0 else " " * len(name)
        target = f" through {d.target_name or d.target}" if d.target else ""
        lines.append(f"    {label}  {_when(d.at)}  {d.action} by {d.rule}{target}: {d.reason}")
        lines += [f"{indent}      {line}" for line in d.budgets if line not in d.reason]
    return lines


def _rule_table(done: Replay) -> list[str]:
    rows = [("RULE", "RECORDED", "REPLAYED", "EVENTS DIFFERING")]
    for tally in done.rules:
        rows.append(
            (
                tally.rule or "(none)",
                _actions(tally.recorded),
                _actions(tally.replayed),
                str(tally.differing),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
        + "  "
        + row[3]
        for row in rows
    ]


def _actions(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{action} {n}" for action, n in sorted(counts.items())) or "-"


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def _when(moment: datetime | None) -> str:
    return iso(moment) if moment else "never"


# --- JSON ------------------------------------------------------------------------------------


def render_json(
    done: Replay, policy: Policy, *, every: bool = False, aside: Sequence[SetAside] = ()
) -> str:
    """One object: what was replayed, every event that differs (counted or marked; with
    `every`, all of them), the rules' tallies. Field names are the records' where they say
    the same."""
    return json.dumps(
        {
            "Records": done.records,
            "SetAside": [
                {
                    "File": str(a.path),
                    "Where": f"{a.where} {a.number}",
                    "RecordId": a.record_id,
                    "Reason": a.reason,
                }
                for a in aside
            ],
            "From": _when(done.first) if done.first else None,
            "To": _when(done.last) if done.last else None,
            "PolicySource": policy.source,
            "RecordedPolicySources": list(done.recorded_policies),
            "RecordedDecisions": done.decisions,
            "DecisionMode": done.mode,
            "Events": len(done.events),
            "Differing": len(done.differing),
            "Marked": len(done.marked),
            "Same": sum(1 for e in done.events if not e.differs),
            "EventsReplayed": [_event_json(e) for e in done.events if every or e.differs],
            "Rules": [
                {
                    "DecisionRule": t.rule,
                    "Recorded": dict(t.recorded),
                    "Replayed": dict(t.replayed),
                    "EventsDiffering": t.differing,
                }
                for t in done.rules
            ],
        },
        indent=2,
    )


def _event_json(event: EventReplay) -> dict[str, Any]:
    return {
        "EventId": event.event_id,
        "EventType": event.event_type,
        "EventSource": event.event_source,
        "Resources": list(event.resources),
        "Differs": event.differs,
        "Counted": event.counted,
        "Marks": [{"Kind": m.kind, "Why": m.why} for m in event.marks],
        "AssumedApprovals": list(event.assumed),
        "Recorded": [_decided_json(d) for d in event.recorded],
        "Replayed": [_decided_json(d) for d in event.replayed],
    }


def _decided_json(d: Decided) -> dict[str, Any]:
    return {
        "TimeGenerated": iso(d.at),
        "DecisionAction": d.action,
        "DecisionRule": d.rule,
        "DecisionReason": d.reason,
        "TargetVmId": d.target,
        "TargetVmName": d.target_name,
        "Attempt": d.attempt,
        "Budgets": list(d.budgets),
    }
