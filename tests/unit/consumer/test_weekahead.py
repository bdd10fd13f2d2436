"""Upcoming records (issue 40, item 2): a VM a maintenance configuration's run will patch, with
the budgets that run would break, as the consumer writes them to the sinks."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from bridge.consumer.weekahead import read_runs, upcoming_records
from bridge.policy.model import Budget
from bridge.policy.upcoming import Planned
from tests.support.records import assert_valid
from tests.unit.policy.test_model import NOW, fleet, vm

WEB = "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachinescalesets/web"
CONFIG = (
    "/subscriptions/s/resourceGroups/rg-patch/providers/Microsoft.Maintenance/"
    "maintenanceConfigurations/web-tue"
)
VM0 = "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachines/vm0"
TUESDAY = datetime(2024, 6, 18, 0, 0, tzinfo=timezone.utc)
ONE = (Budget("one-at-a-time", "scale_set", max_vms=1),)
VMS = [vm(n, vm_id=f"0000000a-0000-4000-8000-00000000000{n}", subscription_id="s",
          scale_set="web") for n in range(4)]  # fmt: skip


def _run(*resources: str) -> Planned:
    return Planned(CONFIG, TUESDAY, TUESDAY + timedelta(hours=2), frozenset(resources))


def test_a_record_per_vm_of_the_run_each_naming_the_budget_it_breaks() -> None:
    records = upcoming_records(ONE, fleet(*VMS), [_run(WEB, "/subscriptions/s/x/gone")], NOW,
                               host_name="consumer-1")  # fmt: skip
    for record in records:
        assert_valid(record)
    assert [r["VmName"] for r in records] == ["vm0", "vm1", "vm2", "vm3", "gone"]
    assert records[0]["VmId"] == "0000000a-0000-4000-8000-000000000000"
    assert records[0]["VmScaleSetName"] == "web"
    assert records[4]["VmId"] is None
    first = records[0]
    assert first["RecordType"] == "Upcoming"
    assert first["UpcomingSource"] == "MaintenanceConfiguration"
    assert first["MaintenanceConfiguration"] == "web-tue"
    assert first["MaintenanceConfigurationId"] == CONFIG
    assert first["WindowStart"] == "2024-06-18T00:00:00.000Z"
    assert first["WindowEnd"] == "2024-06-18T02:00:00.000Z"
    assert first["HostName"] == "consumer-1"
    # The other sources' fields, null for a configuration's run.
    assert [first.get(k, "left out") for k in ("NoticeId", "NoticeKind", "AksCluster")] == [
        None, None, None]  # fmt: skip
    assert len(first["BudgetBreaks"]) == 1
    assert "one-at-a-time" in first["BudgetBreaks"][0]
    assert "patches 4 of them at once, more than the 1 allowed" in first["BudgetBreaks"][0]


def test_a_run_that_fits_has_no_breaks_and_a_stable_record_id() -> None:
    once = upcoming_records(ONE, fleet(*VMS), [_run(VM0)], NOW,
                            host_name="c")  # fmt: skip
    again = upcoming_records(ONE, fleet(*VMS), [_run(VM0)],
                             NOW + timedelta(hours=1), host_name="c")  # fmt: skip
    assert [r["VmName"] for r in once] == ["vm0"]
    assert once[0]["BudgetBreaks"] == []
    # The same run of the same VM read again is the same record: a sink deduplicates on it.
    assert once[0]["RecordId"] == again[0]["RecordId"]
    assert once[0]["TimeGenerated"] != again[0]["TimeGenerated"]


SUB = "8d5f9c8e-1111-4222-8333-444455556666"
CONFIG_ID = (
    f"/subscriptions/{SUB}/resourceGroups/rg-patch/providers/Microsoft.Maintenance/"
    "maintenanceConfigurations/web-tue-0200"
)
SCALE_SET = (
    f"/subscriptions/{SUB}/resourceGroups/rg-web/providers/Microsoft.Compute/"
    "virtualMachineScaleSets/web"
)


def _graph(query: str, subscriptions: list[str]) -> list[dict[str, object]]:
    """Resource Graph as the consumer's client returns its rows (a double)."""
    assert subscriptions == [SUB]
    if query.startswith("resources "):
        return [
            {"id": CONFIG_ID, "name": "web-tue-0200",
             "type": "microsoft.maintenance/maintenanceconfigurations",
             "properties": {"maintenanceScope": "InGuestPatch", "maintenanceWindow": {
                 "startDateTime": "2024-06-01 02:00", "duration": "03:55",
                 "timeZone": "W. Europe Standard Time", "recurEvery": "Week Tuesday"}}},
            {"id": CONFIG_ID.replace("web-tue-0200", "hourly"), "name": "hourly",
             "type": "microsoft.maintenance/maintenanceconfigurations",
             "properties": {"maintenanceScope": "InGuestPatch", "maintenanceWindow": {
                 "startDateTime": "2024-06-01 02:00", "duration": "03:55",
                 "timeZone": "UTC", "recurEvery": "6Hours"}}},
        ]  # fmt: skip
    assert query.startswith(
        "maintenanceresources | where type =~ 'microsoft.maintenance/configurationassignments'"
    )
    return [{"id": f"{SCALE_SET}/providers/Microsoft.Maintenance/configurationAssignments/a1",
             "type": "microsoft.maintenance/configurationassignments", "subscriptionId": SUB,
             "properties": {"maintenanceConfigurationId": CONFIG_ID,
                            "resourceId": SCALE_SET}}]  # fmt: skip


def test_the_read_finds_each_configurations_runs_and_resources_and_names_what_it_refuses() -> None:
    runs, refused = read_runs(_graph, [SUB], NOW)
    assert [(r.name, r.start) for r in runs] == [
        ("web-tue-0200", datetime(2024, 6, 18, 0, tzinfo=timezone.utc)),
        ("web-tue-0200", datetime(2024, 6, 25, 0, tzinfo=timezone.utc)),
    ]
    assert runs[0].resources == frozenset({SCALE_SET.lower()})
    assert len(refused) == 1
    assert "hourly" in refused[0]
    assert "6Hours" in refused[0]
