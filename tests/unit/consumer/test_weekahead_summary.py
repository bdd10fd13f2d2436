"""The week ahead's summary in the fleet state (issue 40, item 2): what `status --consumer`
lists, bounded whatever the fleet's size, and what it says of it."""

from __future__ import annotations

import json
from datetime import timedelta

from bridge.consumer.state import MAX_VALUE_CHARS
from bridge.consumer.status import week_ahead_lines
from bridge.consumer.weekahead import upcoming_records
from bridge.consumer.weekaheadpass import MAX_LISTED, summarize
from bridge.policy.model import Budget
from bridge.policy.upcoming import Planned
from tests.unit.consumer.test_weekahead import CONFIG, ONE, TUESDAY, VM0, VMS, WEB
from tests.unit.policy.test_model import NOW, fleet


def runs(count: int, *resources: str) -> list[Planned]:
    """`count` runs a day apart, each patching `resources`."""
    return [
        Planned(CONFIG.replace("web-tue", f"web-{n:03}"), TUESDAY + timedelta(days=n),
                TUESDAY + timedelta(days=n, hours=2), frozenset(resources))
        for n in range(count)
    ]  # fmt: skip


def test_each_run_that_breaks_a_budget_is_listed_once_with_its_breaks_and_the_rest_counted() -> (
    None
):
    fits = Planned(CONFIG.replace("web-tue", "db"), TUESDAY, TUESDAY + timedelta(hours=2),
                   frozenset({"/subscriptions/s/resourcegroups/rg/providers/x/db1"}))  # fmt: skip
    records = upcoming_records(ONE, fleet(*VMS), [*runs(2, WEB), fits], NOW, host_name="c")
    summary = summarize(records, ["maintenance configuration x: recurEvery '6Hours' ..."], NOW)
    assert summary["vms"] == len(records) == 9
    assert (summary["runs"], summary["breaking_total"], summary["others"]) == (3, 2, 1)
    assert len(summary["breaking"]) == 2
    first = summary["breaking"][0]
    assert (first["name"], first["vms"]) == ("web-000", 4)
    assert first["start"] == "2024-06-18T00:00:00.000Z"
    (said,) = first["breaks"]  # one line, though each of the run's four records carries it
    assert "more than the 1 allowed" in said
    assert summary["problems"] == 1


def test_a_fleets_worth_of_breaks_stays_a_small_document_and_says_how_many_it_left_out() -> None:
    records = upcoming_records(ONE, fleet(*VMS), runs(200, WEB), NOW, host_name="c")
    summary = summarize(records, ["x" * 10_000] * 100, NOW)
    assert summary["breaking_total"] == 200
    assert len(summary["breaking"]) == MAX_LISTED
    assert len(json.dumps(summary)) < MAX_VALUE_CHARS // 10
    lines = week_ahead_lines(summary)
    assert lines[0].startswith("week ahead: 200 runs would break a budget, 0 others")
    assert lines[-1] == f"  and {200 - MAX_LISTED} more runs that would break a budget"
    assert week_ahead_lines(None) == []


VM_IDS = [VM0.replace("vm0", f"vm{n}") for n in range(4)]


def test_status_says_which_sources_overlapping_a_run_made_its_break() -> None:
    """However many windows of other sources make a run's break, status names each."""
    two = (Budget("two-at-a-time", "scale_set", max_vms=2),)
    (run,) = runs(1, VM_IDS[0])
    windows = [
        Planned(f"servicehealth/TRACK-{n:03d}-LONG-TRACKING-ID", TUESDAY,
                TUESDAY + timedelta(hours=4), frozenset({VM_IDS[n]}), "ServiceHealth")
        for n in (1, 2, 3)
    ]  # fmt: skip
    records = upcoming_records(two, fleet(*VMS), [run], NOW, host_name="c", alongside=windows)
    lines = week_ahead_lines(summarize(records, [], NOW))
    (said,) = [line for line in lines if line.startswith("  break: ")]
    for n in (1, 2, 3):
        assert f"Service Health's planned maintenance TRACK-{n:03d}-LONG-TRACKING-ID (1 VM)" in said
