"""Builds infra/workbook/se-bridge.workbook.json from the KQL files beside it.

The workbook's queries live as .kql files in infra/workbook/queries/ (readable, diffable);
this lays them out as the workbook's serializedData. Run it after editing a query:

    python -m tools.kql.workbook          # rewrite the JSON
    python -m tools.kql.workbook --check  # exit 1 if the JSON is stale (the tests do this)

A sample of one item it writes:

    {"type": 3, "name": "agents-grid", "content": {"version": "KqlItem/1.0",
     "query": "SeBridgeRecords_CL | ...", "queryType": 0, "visualization": "table",
     "resourceType": "microsoft.operationalinsights/workspaces",
     "timeContextFromParameter": "TimeRange", "timeContext": {"durationMs": 604800000}, ...}}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WORKBOOK = ROOT / "infra" / "workbook" / "se-bridge.workbook.json"
QUERIES = WORKBOOK.parent / "queries"
WORKSPACE = "microsoft.operationalinsights/workspaces"
DAY_MS = 86_400_000
# Open events can have been scheduled long before the chosen range (hardware failures are
# announced days ahead), so the "now" section looks back a fixed two weeks.
OPEN_EVENTS_MS = 14 * DAY_MS
# What runs on the nodes now: heartbeats come every 5 minutes and a blocked drain is reported
# every minute, so a day back sees every node and every drain still running.
NODES_NOW_MS = DAY_MS
# The week ahead: a consumer writes every upcoming disruption at each pass (at least daily), and
# the queries keep each consumer's latest pass, so two days back always holds one.
WEEK_AHEAD_MS = 2 * DAY_MS

Item = dict[str, Any]


def _text(name: str, markdown: str) -> Item:
    return {"type": 1, "name": name, "content": {"json": markdown}}


def _query(name: str, title: str, visualization: str, *, fixed_ms: int | None = None) -> Item:
    content: Item = {
        "version": "KqlItem/1.0",
        "query": (QUERIES / f"{name}.kql").read_text(encoding="utf-8"),
        "size": 0,
        "title": title,
        "queryType": 0,
        "resourceType": WORKSPACE,
        "visualization": visualization,
        "timeContext": {"durationMs": fixed_ms or 7 * DAY_MS},
    }
    if fixed_ms is None:
        content["timeContextFromParameter"] = "TimeRange"
    if visualization == "tiles":
        content["tileSettings"] = {
            "titleContent": {"columnMatch": "Name", "formatter": 1},
            "leftContent": {"columnMatch": "Value", "formatter": 12},
            "showBorder": True,
        }
    return {"type": 3, "name": name, "content": content}


def _parameters() -> Item:
    choices = [1, 6, 24, 72, 168, 336, 720]
    time_range = {
        "id": "6f1c3e52-8d0a-4b53-9a39-3f0f3b4c2a10",
        "version": "KqlParameterItem/1.0",
        "name": "TimeRange",
        "label": "Time range",
        "type": 4,
        "isRequired": True,
        "value": {"durationMs": 7 * DAY_MS},
        "typeSettings": {"selectableValues": [{"durationMs": h * 3_600_000} for h in choices]},
    }
    content = {
        "version": "KqlParameterItem/1.0",
        "parameters": [time_range],
        "style": "pills",
        "queryType": 0,
        "resourceType": WORKSPACE,
    }
    return {"type": 9, "name": "parameters", "content": content}


def items() -> list[Item]:
    return [
        _text(
            "title",
            "# se-bridge: scheduled maintenance across the fleet\n"
            "Records from `SeBridgeRecords_CL` in this workspace.",
        ),
        _parameters(),
        _text(
            "upcoming-heading",
            "## Upcoming and ongoing maintenance\n"
            "Open events right now (looks back 14 days, whatever the time range).",
        ),
        _query("upcoming-tiles", "Open events", "tiles", fixed_ms=OPEN_EVENTS_MS),
        _query("upcoming-grid", "Open events, soonest first", "table", fixed_ms=OPEN_EVENTS_MS),
        _text(
            "next-14-days-heading",
            "## The next 14 days\n"
            "What the consumer's latest week-ahead pass foresees (`Upcoming` records): maintenance "
            "configurations' runs, Service Health's planned maintenance and AKS upgrades, per day "
            "and group (a scale set, a VM outside one, an AKS cluster). `BreaksABudget` marks the "
            "days a disruption would take more of a budget group at once than the policy allows; "
            "`BudgetBreaks` says which (looks back two days, whatever the time range).",
        ),
        _query("next-14-days-tiles", "The next 14 days", "tiles", fixed_ms=WEEK_AHEAD_MS),
        _query(
            "next-14-days-grid",
            "Per day and group, the days over a budget first",
            "table",
            fixed_ms=WEEK_AHEAD_MS,
        ),
        _query(
            "next-14-days-breaks-grid",
            "Per day and budget group, the groups a disruption would take over their limit",
            "table",
            fixed_ms=WEEK_AHEAD_MS,
        ),
        _text(
            "shadow-heading",
            "## Shadow decisions\n"
            "What a consumer in shadow mode (`consumer.mode = shadow`) decided: nothing was sent.",
        ),
        _query("shadow-grid", "Shadow decisions, newest first", "table"),
        _text("scaleset-heading", "## Timeline per scale set"),
        _query("scaleset-chart", "VMs entering maintenance per hour, by scale set", "timechart"),
        _query("scaleset-grid", "Each event's milestones per scale set", "table"),
        _text("approval-heading", "## Time from Scheduled to approval"),
        _query("approval-time-chart", "Mean minutes from Scheduled to approval", "timechart"),
        _query("approval-time-grid", "By event type and rule", "table"),
        _text(
            "approvals-missed-heading",
            "## Approvals that never reached IMDS\n"
            "Approve decisions whose command came after the event had Started or ended "
            "(refused as `Late`), was refused, or was never answered while the event went "
            "ahead: such an event started at its NotBefore, not when the policy approved it.",
        ),
        _query("approvals-missed-tiles", "Approve decisions", "tiles"),
        _query("approvals-missed-grid", "Approve decisions that never reached IMDS", "table"),
        _text(
            "agents-heading",
            "## Agents' health\n"
            "From each agent's latest heartbeat in the time range; an agent silent for the "
            "whole range is not listed, so pick a range longer than any outage.",
        ),
        _query("agents-tiles", "Agents", "tiles"),
        _query("agents-grid", "Heartbeat age, IMDS, spool depth and dropped records", "table"),
        _text(
            "people-heading",
            "## People in the loop\n"
            "Events the policy asked a person about (`action: ask`) and nobody has answered yet "
            "(looks back 14 days, whatever the time range), what each person decided, approvals "
            "over a full budget, and pauses of early approvals.",
        ),
        _query("people-asks-grid", "Asks pending, oldest first", "table", fixed_ms=OPEN_EVENTS_MS),
        _query("people-decisions-chart", "Decisions by person per hour", "timechart"),
        _query("people-decisions-grid", "Decisions by person", "table"),
        _query("people-overrides-grid", "Approvals over a full budget (overrides)", "table"),
        _query("people-pauses-grid", "Pauses and resumes, newest first", "table"),
        _text(
            "drains-heading",
            "## Kubernetes drains\n"
            "Nodes whose agent drains them before maintenance (`[kubernetes]`): drains running "
            "now and what blocks them (the last day, whatever the time range), how long drains "
            "took, and each node pool.",
        ),
        _query("drains-now-grid", "Nodes draining now", "table", fixed_ms=NODES_NOW_MS),
        _query(
            "drains-blocked-grid",
            "Blocked drains: the pods and PodDisruptionBudgets in the way",
            "table",
            fixed_ms=NODES_NOW_MS,
        ),
        _query("drains-duration-grid", "Drain durations, from Draining to its outcome", "table"),
        _query("node-pools-grid", "Node pools", "table"),
    ]


def render() -> str:
    return json.dumps({"version": "Notebook/1.0", "items": items()}, indent=2) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if WORKBOOK.read_text(encoding="utf-8") != text:
            print(f"{WORKBOOK} is stale: run python -m tools.kql.workbook", file=sys.stderr)
            return 1
        return 0
    WORKBOOK.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
