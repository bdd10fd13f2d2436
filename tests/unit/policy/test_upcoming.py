"""The week ahead (issue 40, item 2): a maintenance configuration's next runs from its schedule
as ARM returns it, and the budgets they would break (bridge.policy.upcoming)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from bridge.policy.model import Budget
from bridge.policy.upcoming import Planned, ahead, parse_schedule, planned_runs, upcoming
from tests.unit.policy.test_model import NOW, fleet, vm

WEB = "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachinescalesets/web"
CONFIG = (
    "/subscriptions/s/resourceGroups/rg-patch/providers/Microsoft.Maintenance/"
    "maintenanceConfigurations/web-tue-0200"
)

# The schedule part of a maintenance configuration as ARM's GET returns it (api-version
# 2023-04-01), the window under properties.maintenanceWindow.
SAMPLE = {
    "id": CONFIG,
    "name": "web-tue-0200",
    "type": "Microsoft.Maintenance/maintenanceConfigurations",
    "location": "westeurope",
    "properties": {
        "maintenanceScope": "InGuestPatch",
        "visibility": "Custom",
        "maintenanceWindow": {
            "startDateTime": "2024-06-01 02:00",
            "duration": "03:55",
            "timeZone": "W. Europe Standard Time",
            "recurEvery": "Week Tuesday",
        },
        "installPatches": {"rebootSetting": "IfRequired"},
    },
}


def _at(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=timezone.utc)


def _runs(window: dict[str, str], now: datetime = NOW) -> list[datetime]:
    schedule = parse_schedule({"id": CONFIG, "properties": {"maintenanceWindow": window}})
    return [start for start, _ in planned_runs(schedule, now, timedelta(days=14))]


def test_a_weekly_tuesday_schedule_in_central_european_summer_time() -> None:
    schedule = parse_schedule(SAMPLE)
    runs = planned_runs(schedule, NOW, timedelta(days=14))
    # 02:00 in Amsterdam in June is 00:00 UTC; NOW is Wednesday 12 June.
    assert runs == [
        (_at(2024, 6, 18, 0, 0), _at(2024, 6, 18, 3, 55)),
        (_at(2024, 6, 25, 0, 0), _at(2024, 6, 25, 3, 55)),
    ]


def test_flattened_window_keys_are_read_too() -> None:
    """Resource Graph and older api-versions put the window's keys beside maintenanceScope."""
    flat = {"id": CONFIG, "properties": {**SAMPLE["properties"]["maintenanceWindow"]}}  # type: ignore[index]
    assert parse_schedule(flat) == parse_schedule(SAMPLE)


@pytest.mark.parametrize(
    ("recur", "start", "now", "expected"),
    [
        ("Day", "2024-06-01 22:00", NOW, [_at(2024, 6, 12 + d, 22) for d in range(14)]),
        ("3Days", "2024-06-11 22:00", NOW, [_at(2024, 6, d, 22) for d in (14, 17, 20, 23)]),
        ("2Weeks Saturday,Sunday", "2024-06-01 04:00", NOW,
         [_at(2024, 6, 15, 4), _at(2024, 6, 16, 4)]),
        ("Month day23,day24", "2024-01-01 01:00", NOW, [_at(2024, 6, 23, 1), _at(2024, 6, 24, 1)]),
        ("Month Last Sunday Offset-6", "2024-01-01 01:00", NOW, [_at(2024, 6, 24, 1)]),
        ("Month Second Tuesday", "2024-01-01 01:00", _at(2024, 7, 1), [_at(2024, 7, 9, 1)]),
        ("2Months Second Tuesday", "2024-06-01 01:00", _at(2024, 7, 1), []),
        ("Month", "2024-05-20 01:00", NOW, [_at(2024, 6, 20, 1)]),
    ],
)  # fmt: skip
def test_recurrences_in_utc(
    recur: str, start: str, now: datetime, expected: list[datetime]
) -> None:
    window = {"startDateTime": start, "duration": "02:00", "timeZone": "UTC", "recurEvery": recur}
    assert _runs(window, now) == expected


def test_an_offset_that_crosses_into_the_next_month_in_india() -> None:
    # Second Tuesday of August 2024 is the 13th; Offset4 is Saturday the 17th, 03:00 IST.
    window = {"startDateTime": "2024-07-13 03:00", "duration": "03:55",
              "timeZone": "India Standard Time",
              "recurEvery": "1Month Second Tuesday Offset4"}  # fmt: skip
    assert _runs(window, _at(2024, 8, 5)) == [_at(2024, 8, 16, 21, 30)]


def test_no_run_before_the_start_or_after_the_expiration() -> None:
    window = {"startDateTime": "2024-06-20 02:00", "expirationDateTime": "2024-06-22 02:00",
              "duration": "02:00", "timeZone": "UTC", "recurEvery": "Day"}  # fmt: skip
    assert _runs(window) == [_at(2024, 6, 20, 2), _at(2024, 6, 21, 2), _at(2024, 6, 22, 2)]


def test_a_run_under_way_is_listed() -> None:
    window = {"startDateTime": "2024-06-01 09:00", "duration": "03:00", "timeZone": "UTC",
              "recurEvery": "Week Wednesday"}  # fmt: skip
    assert _runs(window)[0] == _at(2024, 6, 12, 9)


@pytest.mark.parametrize(
    ("window", "said"),
    [
        ({"recurEvery": "Week Tuesday", "startDateTime": "2024-06-01 02:00", "duration": "03:55",
          "timeZone": "Mars Standard Time"}, "time zone 'Mars Standard Time'"),
        ({"recurEvery": "6Hours", "startDateTime": "2024-06-01 02:00", "duration": "03:55",
          "timeZone": "UTC"}, "recurEvery '6Hours'"),
        ({"recurEvery": "Week Tuesday", "duration": "03:55", "timeZone": "UTC"}, "startDateTime"),
        ({"recurEvery": "Month Fifth Monday", "startDateTime": "2024-06-01 02:00",
          "duration": "03:55", "timeZone": "UTC"}, "recurEvery 'Month Fifth Monday'"),
    ],
)  # fmt: skip
def test_a_schedule_it_cannot_read_is_refused_by_name(window: dict[str, str], said: str) -> None:
    with pytest.raises(ValueError, match=said.replace("(", r"\(")) as caught:
        parse_schedule({"id": CONFIG, "properties": {"maintenanceWindow": window}})
    assert "web-tue-0200" in str(caught.value)


ONE = (Budget("one-at-a-time", "scale_set", max_vms=1),)
VMS = [vm(n, subscription_id="s", scale_set="web") for n in range(4)]


def _planned(name: str, start: datetime, *resources: str, hours: int = 2) -> Planned:
    configuration = CONFIG.replace("web-tue-0200", name)
    return Planned(configuration, start, start + timedelta(hours=hours), frozenset(resources))


def _vm_id(n: int) -> str:
    return f"/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachines/vm{n}"


def test_a_tuesday_run_of_a_whole_max_vms_1_scale_set_breaks_its_budget_days_ahead() -> None:
    run = _planned("web-tue-0200", _at(2024, 6, 18, 0), WEB)
    found = ahead(ONE, fleet(*VMS), [run], NOW)
    assert [(b.configuration, b.budget, b.group, b.count, b.limit) for b in found] == [
        ("web-tue-0200", "one-at-a-time", "s/rg/web", 4, 1)
    ]
    assert found[0].day.isoformat() == "2024-06-18"


def test_split_configurations_fit_when_apart_and_break_when_they_overlap() -> None:
    apart = [_planned(f"web-{n}", _at(2024, 6, 18, 2 * n), _vm_id(n)) for n in range(4)]
    assert ahead(ONE, fleet(*VMS), apart, NOW) == []
    overlap = [*apart[:3], _planned("web-3", _at(2024, 6, 18, 5), _vm_id(3))]
    found = ahead(ONE, fleet(*VMS), overlap, NOW)
    said = {(b.configuration, b.count, b.limit) for b in found}
    assert said == {("web-2", 2, 1), ("web-3", 2, 1)}


def test_the_upcoming_records_name_each_vm_of_each_run() -> None:
    run = _planned("web-tue-0200", _at(2024, 6, 18, 0), WEB, "/subscriptions/s/x/vm-gone")
    rows = upcoming(fleet(*VMS), [run])
    assert [(u.vm, u.vm_id, u.configuration) for u in rows] == [
        *[(f"vm{n}", f"id{n}", "web-tue-0200") for n in range(4)],
        ("vm-gone", None, "web-tue-0200"),
    ]
    assert rows[0].start == _at(2024, 6, 18, 0)
    assert rows[0].end == _at(2024, 6, 18, 2)


TWO = (Budget("two-at-a-time", "scale_set", max_vms=2),)


def test_a_run_that_fits_alone_breaks_with_another_sources_window_and_names_it() -> None:
    run = _planned("web-tue-0200", _at(2024, 6, 18, 2), _vm_id(0), _vm_id(1))
    window = Planned("servicehealth/PYN_-ZL8", _at(2024, 6, 18, 3), _at(2024, 6, 18, 9),
                     frozenset({_vm_id(2)}), source="ServiceHealth")  # fmt: skip
    assert ahead(TWO, fleet(*VMS), [run], NOW) == []
    found = ahead(TWO, fleet(*VMS), [run], NOW, alongside=[window])
    assert [(b.configuration, b.count, b.limit) for b in found] == [("web-tue-0200", 3, 2)]
    assert found[0].sources == ("Service Health's planned maintenance PYN_-ZL8 (1 VM)",)
    assert found[0].line.endswith(
        "more than the 2 allowed; with Service Health's planned maintenance PYN_-ZL8 (1 VM)"
    )
    # Each run asked about says the others that made its break; `alongside` only counts.
    both = ahead(TWO, fleet(*VMS), [run, window], NOW)
    assert [(b.configuration, b.sources) for b in both] == [
        ("web-tue-0200", ("Service Health's planned maintenance PYN_-ZL8 (1 VM)",)),
        ("PYN_-ZL8",
         ("maintenance configuration web-tue-0200's run at 2024-06-18 02:00Z (2 VMs)",)),
    ]  # fmt: skip


def test_an_overlapping_window_on_another_group_is_not_named() -> None:
    other = vm(9, subscription_id="s", scale_set="api")
    run = _planned("web-tue-0200", _at(2024, 6, 18, 2), _vm_id(0), _vm_id(1), _vm_id(2))
    window = Planned("aks/aks-prod NodeOSUpgrade", _at(2024, 6, 18, 3), _at(2024, 6, 18, 7),
                     frozenset({_vm_id(9)}), source="AksUpgrade")  # fmt: skip
    found = ahead(TWO, fleet(*VMS, other), [run], NOW, alongside=[window])
    assert [(b.configuration, b.count, b.sources) for b in found] == [("web-tue-0200", 3, ())]
    assert found[0].line.endswith("more than the 2 allowed")
    assert window.said == "AKS upgrade aks-prod NodeOSUpgrade"


def test_a_break_made_by_many_windows_names_three_and_counts_the_others() -> None:
    big = [vm(n, subscription_id="s", scale_set="web") for n in range(8)]
    run = _planned("web-tue-0200", _at(2024, 6, 18, 2), _vm_id(0))
    windows = [
        Planned(f"servicehealth/T{n}", _at(2024, 6, 18, 1), _at(2024, 6, 18, 5),
                frozenset({_vm_id(n)}), source="ServiceHealth")
        for n in range(1, 6)
    ]  # fmt: skip
    (found,) = ahead(TWO, fleet(*big), [run], NOW, alongside=windows)
    assert len(found.sources) == 5
    assert found.line.endswith(
        "; with Service Health's planned maintenance T1 (1 VM), Service Health's planned "
        "maintenance T2 (1 VM), Service Health's planned maintenance T3 (1 VM) and 2 other windows"
    )
