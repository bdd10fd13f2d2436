"""The week ahead, end to end (issue 40, item 2): the patch-run rig of test_patch_runs (a scale
set of 4, agents on web_0 and web_1, a `max_vms: 1` budget, the maintenance configuration
"tuesday" assigned to the whole set) with weekahead.enabled. `se-bridge consume` (a real
process) reads the configuration's schedule and assignment from the Resource Graph double over
HTTPS as its managed identity, and the Upcoming records of the run, each naming the budget it
would break, reach the Logs Ingestion double (strict: every column declared, every value of
its type) the day before the run.

The consumer's clock is the machine's, so the schedule is set instead of the clock: the weekly
run falls on tomorrow's weekday at 02:00 UTC, and today is the day before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from bridge import schema
from bridge.records import parse_time
from tests.doubles.logs_ingestion import LogsIngestionDouble
from tests.doubles.resourcegraph import ResourceGraphDouble
from tests.e2e.test_patch_runs import WAIT, Rig
from tests.support.cloud import RULE
from tests.support.wait import eventually
from tools import kql_check
from tools.kql_check import KqlText

pytestmark = pytest.mark.e2e

# The workbook's queries of the next 14 days (the week-ahead sources' change writes them beside
# the workbook's other queries). They read the columns below of the Upcoming records; the test
# checks both against each other.
QUERIES = [Path(__file__).resolve().parents[2] / "infra/workbook/queries" / name
           for name in ("next-14-days-grid.kql", "next-14-days-breaks-grid.kql")]  # fmt: skip
READ = ("RecordType", "UpcomingSource", "VmName", "VmScaleSetName", "ResourceGroup", "HostName",
        "WindowStart", "WindowEnd", "BudgetBreaks", "MaintenanceConfiguration", "TimeGenerated",
        "RecordId")  # fmt: skip


def tomorrow_at_two(now: datetime) -> datetime:
    return datetime.combine(now.date() + timedelta(days=1), datetime.min.time(),
                            tzinfo=timezone.utc) + timedelta(hours=2)  # fmt: skip


@pytest.fixture
def rig(tmp_path: Path, logs: LogsIngestionDouble) -> Iterator[Rig]:
    with ResourceGraphDouble() as graph:
        made = Rig(tmp_path, graph)
        run = tomorrow_at_two(datetime.now(timezone.utc))
        # The configuration as Resource Graph's `resources` table holds it (ARM's shape).
        graph.tables["resources"] = [{
            "id": made.configuration, "name": "tuesday",
            "type": "microsoft.maintenance/maintenanceconfigurations",
            "subscriptionId": made.subscription, "resourceGroup": "rg-patch",
            "properties": {"maintenanceScope": "InGuestPatch", "maintenanceWindow": {
                "startDateTime": f"{run - timedelta(days=1):%Y-%m-%d} 02:00",
                "duration": "03:55", "timeZone": "UTC", "recurEvery": f"Week {run:%A}"}},
        }]  # fmt: skip
        made.more_args = ("--sink", "loganalytics")
        made.more_cas = [Path(logs.ca_bundle)]
        made.more_env = {"SE_BRIDGE_LOGANALYTICS_ENDPOINT": logs.endpoint,
                         "SE_BRIDGE_LOGANALYTICS_RULE_ID": RULE,
                         "SE_BRIDGE_LOGANALYTICS_SEND_INTERVAL": "5"}  # fmt: skip
        try:
            yield made.start()
        finally:
            made.close()


def breaking(logs: LogsIngestionDouble, start: datetime) -> list[dict[str, Any]]:
    """The Upcoming records Log Analytics holds of the run at `start` naming a break."""
    return [r for r in logs.records() if r.get("RecordType") == "Upcoming"
            and parse_time(r.get("WindowStart")) == start and r.get("BudgetBreaks")]  # fmt: skip


def test_the_runs_upcoming_records_reach_log_analytics_the_day_before_naming_the_group(
    rig: Rig, logs: LogsIngestionDouble
) -> None:
    eventually(rig.heard, WAIT, "both agents heard", rig.details)
    # The week ahead turned on in a consumer that knows the set's VMs: its first pass is as
    # it starts (one made before the agents were heard would name the set as one VM).
    assert rig.consumer is not None
    assert rig.consumer.stop() == 0
    rig.more_config = "\n[weekahead]\nenabled = true\n"
    rig.start_consumer()
    now = datetime.now(timezone.utc)
    start = tomorrow_at_two(now)
    eventually(lambda: len(breaking(logs, start)) >= 2, WAIT, "the run's records", rig.details)
    found = breaking(logs, start)
    assert sorted({r["VmName"] for r in found}) == ["web_0", "web_1"]
    group = f"{rig.subscription}/{rig.group}/web"
    for record in found:
        assert record["MaintenanceConfiguration"] == "tuesday"
        assert record["UpcomingSource"] == "MaintenanceConfiguration"
        assert parse_time(record["WindowEnd"]) == start + timedelta(hours=3, minutes=55)
        (said,) = record["BudgetBreaks"]
        assert "budget one-at-a-time" in said
        assert group in said
        assert "more than the 1 allowed" in said
        # What the workbook's 14-day query keeps: an Upcoming record written before its run,
        # whose window starts within 14 days of when it was written (and asked: now).
        generated = parse_time(record["TimeGenerated"])
        assert generated is not None
        assert now - timedelta(minutes=10) < generated < start <= generated + timedelta(days=14)
        assert set(READ) <= set(record)
    assert all(r.authorized for r in rig.graph.requests)


# What the workbook's query must be able to do with the records above, as Log Analytics holds
# them: the newest word of each record, the windows of the next 14 days, the breaks per group and
# day. Checked by the Kusto parser against the schema's columns and types (a datetime WindowStart
# to compare with now(), a dynamic BudgetBreaks to count).
PROBE = """SeBridgeRecords_CL
| where RecordType == "Upcoming"
| summarize arg_max(TimeGenerated, *) by RecordId
| where WindowStart between (now() .. now() + 14d)
| where array_length(BudgetBreaks) > 0
| summarize VMs = dcount(VmName), Breaks = make_set(BudgetBreaks) by Day = startofday(WindowStart),
    VmScaleSetName, MaintenanceConfiguration
"""


def test_a_14_day_query_of_these_records_is_valid_kql_and_so_is_the_workbooks() -> None:
    """Every column the records above are checked to carry is one the record schema gives Log
    Analytics, and a query of the next 14 days of them passes the Kusto parser; so does the
    workbook's own queries of them, once they are written (infra/workbook/queries/)."""
    columns = {c["name"] for c in schema.dcr_stream_declaration()["columns"]}
    assert set(READ) <= columns
    texts = [KqlText("probe: the next 14 days", PROBE)]
    texts += [KqlText(str(q), q.read_text(encoding="utf-8")) for q in QUERIES if q.exists()]
    results = kql_check.run(texts)
    for result in results:
        assert result.errors == [], (result.name, result.errors)
    assert {"Day:datetime", "VMs:long", "Breaks:dynamic"} <= set(results[0].columns)
