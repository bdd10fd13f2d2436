"""The week ahead in the consumer (issue 40, item 2; docs/planned-disruptions.md#the-week-ahead):
the Upcoming records of the maintenance configurations' runs within 14 days, a record per VM a
run patches, each naming the budgets its run would break. Pure: the runs, the fleet, the
budgets and the clock in.

A record's RecordId is its run's and VM's (configuration, window start, VM): the same run read
again is the same record, and a sink or a query deduplicates on it (the newest TimeGenerated
wins), so a periodic read can write every upcoming run each time.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from bridge import recordtypes as rt
from bridge.consumer.decisionrecord import identity_of
from bridge.consumer.planned import read_more, upcoming_more
from bridge.consumer.sources.patchruns import Rows, resolve_configuration
from bridge.policy.model import Budget, FleetView
from bridge.policy.upcoming import (
    HORIZON,
    Planned,
    Schedule,
    ahead,
    parse_schedule,
    plan,
    planned_runs,
    upcoming,
)
from bridge.records import Origin, VmIdentity, iso, record_id


def upcoming_records(
    budgets: Sequence[Budget],
    fleet: FleetView,
    runs: Sequence[Planned],
    now: datetime,
    *,
    host_name: str,
    alongside: Sequence[Planned] = (),
) -> list[rt.Upcoming]:
    """An Upcoming record per VM per run of `runs`, with the budgets its run would break,
    counting the other sources' windows `alongside` where they overlap it."""
    broken: dict[tuple[str, datetime], list[str]] = {}
    for breach in ahead(budgets, fleet, runs, now, alongside=alongside):
        broken.setdefault((breach.configuration, breach.start), []).append(breach.line)
    records: list[rt.Upcoming] = []
    for row in upcoming(fleet, runs):
        vm = fleet.vms.get(row.vm_id) if row.vm_id else None
        identity = identity_of(vm) if vm else VmIdentity(vm_name=row.vm)
        rid = record_id(
            "upcoming", row.configuration_id.lower(), iso(row.start), row.vm_id or row.vm
        )
        common = Origin(identity, host_name).common("Upcoming", rid, now)
        records.append({
            **common,
            rt.RECORD_TYPE: "Upcoming",
            "UpcomingSource": "MaintenanceConfiguration",
            "MaintenanceConfiguration": row.configuration,
            "MaintenanceConfigurationId": row.configuration_id,
            "WindowStart": iso(row.start),
            "WindowEnd": iso(row.end),
            "BudgetBreaks": broken.get((row.configuration, row.start), []),
            "NoticeId": None,
            "NoticeTitle": None,
            "NoticeKind": None,
            "AksCluster": None,
        })  # fmt: skip
    return records


CONFIGURATIONS = "microsoft.maintenance/maintenanceconfigurations"


def configuration_query() -> str:
    """Every guest patching configuration of the subscriptions, its window in `properties`."""
    return (
        f"resources | where type =~ '{CONFIGURATIONS}'"
        " | where tostring(properties.maintenanceScope) =~ 'InGuestPatch'"
        " | project id, name, type, properties"
    )


def read_runs(
    rows: Rows, subscriptions: Sequence[str], now: datetime
) -> tuple[list[Planned], list[str]]:
    """The runs of the next 14 days of every guest patching configuration in `subscriptions`
    (lower case), each with the resources it patches, and a sentence per configuration whose
    schedule cannot be read. `rows(query, subscriptions)` is ResourceGraph.rows (paged,
    bounded, its 429s waited). A configuration with no run ahead costs no assignment query."""
    trusted = [s.lower() for s in subscriptions]
    refused: list[str] = []
    schedules: list[tuple[Schedule, frozenset[str]]] = []
    for row in rows(configuration_query(), trusted):
        if str(row.get("type", "")).lower() != CONFIGURATIONS:
            continue
        try:
            schedule = parse_schedule(row)
        except (ValueError, TypeError) as err:
            refused.append(f"{err}: its runs are not counted ahead")
            continue
        if not planned_runs(schedule, now, HORIZON):
            continue
        found = resolve_configuration(schedule.configuration, trusted, rows)
        schedules.append((schedule, found.resources))
    return plan(schedules, now, HORIZON), refused


def week_ahead(
    rows: Rows,
    subscriptions: Sequence[str],
    fleet: FleetView,
    budgets: Sequence[Budget],
    now: datetime,
    *,
    host_name: str,
) -> tuple[list[rt.Upcoming], list[str]]:
    """One pass of the week ahead: the Upcoming records of every source of planned
    maintenance, and a sentence per thing a source could not read (each naming it). Each
    source adds its records and its sentences here, in turn."""
    runs, problems = read_runs(rows, subscriptions, now)
    # Service Health and AKS: their windows and the configurations' runs count together, each
    # source's records naming the others' windows that make its breaks.
    more = read_more(rows, subscriptions, now)
    records = upcoming_records(
        budgets, fleet, runs, now, host_name=host_name, alongside=more.planned(fleet)
    )
    records += upcoming_more(budgets, fleet, more.maintenance, more.notices, now,
                             host_name=host_name, alongside=runs)  # fmt: skip
    return records, [*problems, *more.problems]
