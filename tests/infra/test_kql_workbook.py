"""The workbook: generated from its .kql files, with the sections the fleet's operators need."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.support.kql import session
from tools.kql import workbook

NAME = "infra/workbook/se-bridge.workbook.json"


def _content() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(workbook.WORKBOOK.read_text(encoding="utf-8"))
    return data


def _kql_items() -> dict[str, dict[str, Any]]:
    return {
        i["name"]: i["content"]
        for i in _content()["items"]
        if i["content"].get("version") == "KqlItem/1.0"
    }


def _columns(item: str) -> dict[str, str]:
    pairs = (c.partition(":") for c in session().result(f"{NAME}#{item}").columns)
    return {name: kind for name, _, kind in pairs}


def test_workbook_json_is_generated_from_its_queries() -> None:
    assert workbook.WORKBOOK.read_text(encoding="utf-8") == workbook.render()
    assert workbook.main(["--check"]) == 0


def test_workbook_is_serialized_data_with_a_time_range_parameter() -> None:
    content = _content()
    assert content["version"] == "Notebook/1.0"
    params = [i for i in content["items"] if i["type"] == 9]
    (time_range,) = params[0]["content"]["parameters"]
    assert (time_range["name"], time_range["type"]) == ("TimeRange", 4)


def test_every_query_reads_the_workspace_the_workbook_is_attached_to() -> None:
    for name, item in _kql_items().items():
        assert item["resourceType"] == "microsoft.operationalinsights/workspaces", name
        assert "crossComponentResources" not in item, name
        assert item.get("timeContextFromParameter") == "TimeRange" or item["timeContext"], name


def test_queries_have_no_workbook_placeholders_the_checker_cannot_see() -> None:
    for name, item in _kql_items().items():
        assert not re.search(r"\{[A-Za-z_]\w*(:\w+)?\}", item["query"]), name


def test_sections_for_maintenance_scale_sets_approvals_and_agents() -> None:
    headings = " ".join(i["content"]["json"] for i in _content()["items"] if i["type"] == 1)
    for section in ("Upcoming and ongoing", "per scale set", "Scheduled to approval", "health"):
        assert section in headings


def test_agents_health_shows_heartbeat_age_spool_imds_and_drops() -> None:
    columns = _columns("agents-grid")
    for column in ("HeartbeatAgeMinutes", "SpoolDepth", "ImdsHealthy", "DroppedInRange"):
        assert column in columns


def test_tiles_give_name_and_value_and_charts_a_time_axis() -> None:
    for name, item in _kql_items().items():
        columns = _columns(name)
        if item["visualization"] == "tiles":
            assert columns == {"Name": "string", "Value": "long"}, name
        if item["visualization"] == "timechart":
            assert "datetime" in columns.values(), name


def test_time_to_approval_is_in_minutes() -> None:
    assert _columns("approval-time-chart")["MeanMinutesToApproval"] == "real"
    assert _columns("scaleset-grid")["ApprovedAt"] == "datetime"


def test_approvals_that_never_reached_imds_have_tiles_and_a_grid_saying_why() -> None:
    headings = " ".join(i["content"]["json"] for i in _content()["items"] if i["type"] == 1)
    assert "never reached IMDS" in headings
    columns = _columns("approvals-missed-grid")
    for column in ("EventId", "ApprovalThrough", "Answer", "WentAheadAt", "ApprovalDetail"):
        assert column in columns
    assert columns["SecondsToGoAhead"] == "real"
    tiles = _kql_items()["approvals-missed-tiles"]["query"]
    for name in ("Reached IMDS", "Came too late", "Never answered"):
        assert f'"{name}"' in tiles


def _headings() -> str:
    return " ".join(i["content"]["json"] for i in _content()["items"] if i["type"] == 1)


def test_people_section_shows_pending_asks_decisions_by_person_overrides_and_pauses() -> None:
    assert "## People in the loop" in _headings()
    asks = _columns("people-asks-grid")
    for column in ("EventId", "AskedTarget", "AskedAt", "AskDeadline", "NotifyFailing"):
        assert column in asks
    assert asks["MinutesPending"] == "real"
    chart = _columns("people-decisions-chart")
    assert (chart["Person"], chart["Decisions"], chart["TimeGenerated"]) == (
        "string",
        "long",
        "datetime",
    )
    by_person = _columns("people-decisions-grid")
    for column in ("Person", "Approved", "Overrides", "Held", "Pauses", "LastReason"):
        assert column in by_person
    overrides = _columns("people-overrides-grid")
    for column in ("OverriddenAt", "EventId", "Person", "OperatorReason"):
        assert column in overrides
    pauses = _columns("people-pauses-grid")
    assert pauses["ActiveNow"] == "bool"
    for column in ("At", "Action", "Scope", "Person", "OperatorReason", "PauseUntil"):
        assert column in pauses


def test_kubernetes_section_shows_drains_now_their_blockers_durations_and_pools() -> None:
    assert "## Kubernetes drains" in _headings()
    now = _columns("drains-now-grid")
    for column in ("NodeName", "NodePool", "EventId", "DrainStatus", "DrainStartedAt"):
        assert column in now
    blocked = _columns("drains-blocked-grid")
    for column in ("NodeName", "Namespace", "Pod", "PodDisruptionBudget", "Reason"):
        assert blocked[column] == "string", column
    assert "mv-expand" in session().result(f"{NAME}#drains-blocked-grid").operators
    durations = _columns("drains-duration-grid")
    assert durations["MinutesToDrain"] == "real"
    assert {"DrainingAt", "EndedAt", "Outcome", "NodePool"} <= set(durations)
    pools = _columns("node-pools-grid")
    for column in ("Pool", "Nodes", "DrainingNow", "CordonedByOthers", "P95MinutesToDrain"):
        assert column in pools


def test_the_next_14_days_shows_each_day_and_group_and_marks_budget_breaks() -> None:
    headings = " ".join(i["content"]["json"] for i in _content()["items"] if i["type"] == 1)
    assert "The next 14 days" in headings
    columns = _columns("next-14-days-grid")
    expected = {"Day": "datetime", "Group": "string", "BreaksABudget": "bool",
                "Disruptions": "dynamic", "BudgetBreaks": "dynamic",
                "VmsAhead": "long"}  # fmt: skip
    assert {name: columns.get(name) for name in expected} == expected
    breaks = _columns("next-14-days-breaks-grid")
    expected = {"Day": "datetime", "Budget": "string", "BudgetGroup": "string", "Limit": "int",
                "Disruptions": "dynamic", "Lines": "dynamic"}  # fmt: skip
    assert {name: breaks.get(name) for name in expected} == expected
    for name in ("next-14-days-grid", "next-14-days-tiles", "next-14-days-breaks-grid"):
        item = _kql_items()[name]
        assert item["timeContext"] == {"durationMs": 2 * workbook.DAY_MS}, name
        assert "timeContextFromParameter" not in item, name
        # Each RecordId's newest record, of each consumer's latest pass.
        assert "arg_max(TimeGenerated" in item["query"], name
        assert "LastPass" in item["query"], name
