"""The week ahead (issue 40, item 2; docs/planned-disruptions.md#the-week-ahead): when each
maintenance configuration will next patch its VMs, and which budgets those runs would break.
Pure: the configurations' schedules, their resolved VMs, the fleet and the clock in.

A configuration's schedule is its maintenance window as ARM returns it. Microsoft's reference
(MaintenanceConfiguration, learn.microsoft.com/javascript/api/@azure/arm-maintenance/
maintenanceconfiguration) says: `startDateTime` and `expirationDateTime` "in YYYY-MM-DD hh:mm
format", "created in the time zone provided and adjusted to daylight savings according to that
time zone"; `duration` "in HH:mm format"; `timeZone` a Windows name ("Pacific Standard Time,
UTC, W. Europe Standard Time, Korea Standard Time, Cen. Australia Standard Time"); `recurEvery`
"[Frequency as integer]['Day(s)']" (`Day`, `3Days`), "[Frequency as integer]['Week(s)']
[Optional comma separated list of weekdays Monday-Sunday]" (`3Weeks`, `Week Saturday,Sunday`),
"[Frequency as integer]['Month(s)'] [Comma separated list of month days]" or "[Week of Month
(First, Second, Third, Fourth, Last)] [Weekday Monday-Sunday] [Optional Offset(No. of days)]",
the offset "between -6 and 6 inclusive" (`Month day23,day24`, `Month Last Sunday Offset-3`).
Hourly schedules exist for other maintenance scopes, not for guest patching: refused by name.

A run's budget check is the patch-run gate's (bridge.policy.gates.patchrun.breach_list), with
the other runs whose windows overlap it counted as impacted: two configurations that split a
scale set fit only if their windows do not overlap. The other sources' windows (Service Health's
planned maintenance, AKS upgrades: bridge.consumer.planned) are runs here too, so one arithmetic
counts every source, and a break names the overlapping windows that made it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta, timezone
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bridge.policy.gates.patchrun import breach_list
from bridge.policy.model import Budget, FleetView
from bridge.policy.patchruns import RunView, index_of, members

HORIZON = timedelta(days=14)

# Windows time zone names (what ARM takes) to IANA names (what zoneinfo knows): the common ones,
# from CLDR's windowsZones.xml (territory 001). An IANA name is taken as it is.
WINDOWS_ZONES: Mapping[str, str] = {
    "utc": "UTC",
    "gmt standard time": "Europe/London",
    "greenwich standard time": "Atlantic/Reykjavik",
    "w. europe standard time": "Europe/Berlin",
    "central europe standard time": "Europe/Budapest",
    "central european standard time": "Europe/Warsaw",
    "romance standard time": "Europe/Paris",
    "e. europe standard time": "Europe/Chisinau",
    "fle standard time": "Europe/Kiev",
    "gtb standard time": "Europe/Bucharest",
    "russian standard time": "Europe/Moscow",
    "turkey standard time": "Europe/Istanbul",
    "israel standard time": "Asia/Jerusalem",
    "south africa standard time": "Africa/Johannesburg",
    "arabian standard time": "Asia/Dubai",
    "india standard time": "Asia/Calcutta",
    "se asia standard time": "Asia/Bangkok",
    "singapore standard time": "Asia/Singapore",
    "china standard time": "Asia/Shanghai",
    "tokyo standard time": "Asia/Tokyo",
    "korea standard time": "Asia/Seoul",
    "w. australia standard time": "Australia/Perth",
    "cen. australia standard time": "Australia/Adelaide",
    "aus eastern standard time": "Australia/Sydney",
    "new zealand standard time": "Pacific/Auckland",
    "hawaiian standard time": "Pacific/Honolulu",
    "alaskan standard time": "America/Anchorage",
    "pacific standard time": "America/Los_Angeles",
    "mountain standard time": "America/Denver",
    "us mountain standard time": "America/Phoenix",
    "central standard time": "America/Chicago",
    "eastern standard time": "America/New_York",
    "atlantic standard time": "America/Halifax",
    "e. south america standard time": "America/Sao_Paulo",
    "sa pacific standard time": "America/Bogota",
}

_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NTH = {"first": 1, "second": 2, "third": 3, "fourth": 4, "last": -1}
_UNIT = re.compile(r"^(\d*)\s*(day|week|month)s?$", re.IGNORECASE)


@dataclass(frozen=True)
class Schedule:
    """A maintenance configuration's window: when its runs start, in its own time zone."""

    configuration: str  # its resource id
    start: datetime  # the first run's start, local (naive) in `zone`
    duration: timedelta
    zone: str  # an IANA name
    unit: Literal["day", "week", "month"]
    every: int
    weekdays: tuple[int, ...] = ()  # week: Monday = 0
    monthdays: tuple[int, ...] = ()  # month: days of the month
    nth: int | None = None  # month: 1 to 4 or -1 (Last) ...
    weekday: int | None = None  # ... of this weekday
    offset: int = 0  # ... moved by so many days
    expires: datetime | None = None  # local, like `start`

    @property
    def name(self) -> str:
        return self.configuration.rstrip("/").rpartition("/")[2]


def parse_schedule(configuration: Mapping[str, Any]) -> Schedule:
    """The Schedule of a maintenance configuration as ARM's GET (or Resource Graph's
    `resources` row) returns it: the window under `properties.maintenanceWindow`, or its keys
    in `properties` itself (flattened). ValueError naming the configuration and the field it
    cannot read.

    A real one (ARM, api-version 2023-04-01; ids shortened):
    {"id": "/subscriptions/.../resourceGroups/rg-patch/providers/Microsoft.Maintenance/
       maintenanceConfigurations/web-tue-0200", "name": "web-tue-0200",
     "type": "Microsoft.Maintenance/maintenanceConfigurations", "location": "westeurope",
     "properties": {"maintenanceScope": "InGuestPatch", "visibility": "Custom",
       "maintenanceWindow": {"startDateTime": "2024-06-01 02:00", "duration": "03:55",
         "timeZone": "W. Europe Standard Time", "recurEvery": "Week Tuesday"},
       "installPatches": {"rebootSetting": "IfRequired"}}}
    """
    config_id = str(configuration.get("id") or "")
    name = config_id.rstrip("/").rpartition("/")[2] or "(a configuration without an id)"
    props = configuration.get("properties")
    props = props if isinstance(props, Mapping) else {}
    window = props.get("maintenanceWindow")
    window = window if isinstance(window, Mapping) else props

    def field(key: str, required: bool = True) -> str:
        value = window.get(key)
        if value is None or value == "":
            if required:
                raise ValueError(f"maintenance configuration {name}: no {key} in its window")
            return ""
        if not isinstance(value, str):
            raise TypeError(f"maintenance configuration {name}: {key} {value!r} is not a string")
        return value.strip()

    def local(key: str, value: str) -> datetime:
        try:
            return datetime.strptime(value[:16], "%Y-%m-%d %H:%M")
        except ValueError:
            raise ValueError(
                f"maintenance configuration {name}: {key} {value!r} is not YYYY-MM-DD hh:mm"
            ) from None

    start = local("startDateTime", field("startDateTime"))
    expiration = field("expirationDateTime", required=False)
    expires = local("expirationDateTime", expiration) if expiration else None
    duration = _duration(name, field("duration"))
    zone = _zone(name, field("timeZone"))
    recur = _recurrence(name, field("recurEvery"), start)
    return Schedule(config_id, start, duration, zone, expires=expires, **recur)


def _duration(name: str, value: str) -> timedelta:
    hours, _, minutes = value.partition(":")
    if not (hours.isdigit() and minutes[:2].isdigit()):
        raise ValueError(f"maintenance configuration {name}: duration {value!r} is not HH:mm")
    return timedelta(hours=int(hours), minutes=int(minutes[:2]))


def _zone(name: str, value: str) -> str:
    zone = WINDOWS_ZONES.get(value.lower(), value)
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"maintenance configuration {name}: time zone {value!r} is not one se-bridge knows "
            "(a Windows name of bridge.policy.upcoming.WINDOWS_ZONES or an IANA name)"
        ) from None
    return zone


def _recurrence(name: str, value: str, start: datetime) -> dict[str, Any]:
    words = value.replace(",", " ").split()
    unit = _UNIT.match(words[0]) if words else None
    refused = ValueError(
        f"maintenance configuration {name}: recurEvery {value!r} is not a daily, weekly or "
        "monthly schedule se-bridge can read"
    )
    if unit is None:
        raise refused
    every = int(unit.group(1) or 1)
    kind = unit.group(2).lower()
    rest = [w.lower() for w in words[1:]]
    if every < 1:
        raise refused
    if kind == "day":
        if rest:
            raise refused
        return {"unit": "day", "every": every}
    if kind == "week":
        if any(w not in _WEEKDAYS for w in rest):
            raise refused
        days = tuple(sorted({_WEEKDAYS.index(w) for w in rest})) or (start.weekday(),)
        return {"unit": "week", "every": every, "weekdays": days}
    if all(re.fullmatch(r"day\d{1,2}", w) for w in rest):
        days = tuple(sorted({int(w[3:]) for w in rest})) or (start.day,)
        if any(not 1 <= d <= 31 for d in days):
            raise refused
        return {"unit": "month", "every": every, "monthdays": days}
    offset = 0
    if rest and rest[-1].startswith("offset"):
        try:
            offset = int(rest.pop()[6:])
        except ValueError:
            raise refused from None
    if len(rest) != 2 or rest[0] not in _NTH or rest[1] not in _WEEKDAYS or abs(offset) > 6:
        raise refused
    return {"unit": "month", "every": every, "nth": _NTH[rest[0]],
            "weekday": _WEEKDAYS.index(rest[1]), "offset": offset}  # fmt: skip


def _nth_weekday(year: int, month: int, nth: int, weekday: int) -> date:
    if nth > 0:
        first = date(year, month, 1)
        return first + timedelta(days=(weekday - first.weekday()) % 7 + 7 * (nth - 1))
    following = date(year + month // 12, month % 12 + 1, 1)
    last = following - timedelta(days=1)
    return last - timedelta(days=(last.weekday() - weekday) % 7)


def _runs_on(schedule: Schedule, day: date) -> bool:
    """Whether `schedule` has a run starting on `day` (local)."""
    first = schedule.start.date()
    if schedule.unit == "day":
        return (day - first).days % schedule.every == 0
    if schedule.unit == "week":
        monday = first - timedelta(days=first.weekday())
        week = (day - monday).days // 7
        return week % schedule.every == 0 and day.weekday() in schedule.weekdays
    # A monthly run is counted in the month of its date before the offset.
    nominal = day - timedelta(days=schedule.offset)
    months = (nominal.year - first.year) * 12 + nominal.month - first.month
    if months % schedule.every:
        return False
    if schedule.nth is None or schedule.weekday is None:
        return day.day in schedule.monthdays
    return nominal == _nth_weekday(nominal.year, nominal.month, schedule.nth, schedule.weekday)


def planned_runs(
    schedule: Schedule, now: datetime, horizon: timedelta = HORIZON
) -> list[tuple[datetime, datetime]]:
    """The runs (start, end, UTC) of `schedule` that have not ended at `now` and start before
    `now + horizon`."""
    zone = ZoneInfo(schedule.zone)
    until = now + horizon
    day = max(schedule.start.date(), (now - schedule.duration).astimezone(zone).date())
    last = until.astimezone(zone).date()
    runs: list[tuple[datetime, datetime]] = []
    while day <= last:
        local = datetime.combine(day, schedule.start.time())
        expired = schedule.expires is not None and local > schedule.expires
        if not expired and local >= schedule.start and _runs_on(schedule, day):
            start = local.replace(tzinfo=zone).astimezone(timezone.utc)
            end = start + schedule.duration
            if end > now and start < until:
                runs.append((start, end))
        day += timedelta(days=1)
    return runs


PlannedSource = Literal["MaintenanceConfiguration", "ServiceHealth", "AksUpgrade"]


@dataclass(frozen=True)
class Planned:
    """A configuration's run in the days ahead and the resources it patches (its assignments
    and dynamic scopes resolved: bridge.consumer.sources.patchruns.resolve)."""

    configuration: str  # its resource id (another source's: its label, bridge.consumer.planned)
    start: datetime
    end: datetime
    resources: frozenset[str]  # VM and scale set ids, lower case
    source: PlannedSource = "MaintenanceConfiguration"  # the Upcoming record's UpcomingSource

    @property
    def name(self) -> str:
        return self.configuration.rstrip("/").rpartition("/")[2]

    @property
    def said(self) -> str:
        """The run as a break names it among the windows that made it."""
        if self.source == "ServiceHealth":
            return f"Service Health's planned maintenance {self.name}"
        if self.source == "AksUpgrade":
            return f"AKS upgrade {self.name}"
        return f"maintenance configuration {self.name}'s run at {self.start:%Y-%m-%d %H:%M}Z"

    def view(self) -> RunView:
        """As the patch-run gate sees a run (no cut-off yet: none is known days ahead)."""
        run_id = f"{self.configuration.lower()}/{self.start:%Y%m%dT%H%MZ}"
        resources = frozenset(r.lower() for r in self.resources)
        return RunView(run_id, self.configuration, self.start, self.end, None, resources)


def plan(
    schedules: Iterable[tuple[Schedule, frozenset[str]]],
    now: datetime,
    horizon: timedelta = HORIZON,
) -> list[Planned]:
    """Every run of the `schedules` (each with the resources it patches) within `horizon`."""
    found = [
        Planned(schedule.configuration, start, end, resources)
        for schedule, resources in schedules
        for start, end in planned_runs(schedule, now, horizon)
    ]
    return sorted(found, key=lambda p: (p.start, p.configuration))


@dataclass(frozen=True)
class AheadBreach:
    """A run that would take a budget group over its limit."""

    day: date  # the run's start, UTC
    configuration: str  # the configuration's name
    start: datetime
    budget: str
    group: str
    count: int  # VMs of the group impacted at once: the run's and the overlapping runs'
    limit: int
    line: str
    sources: tuple[str, ...] = ()  # the overlapping windows whose VMs the group counted


def ahead(
    budgets: Sequence[Budget],
    fleet: FleetView,
    runs: Sequence[Planned],
    now: datetime,
    *,
    alongside: Sequence[Planned] = (),
) -> list[AheadBreach]:
    """The budgets each run of `runs` would break, counting the other runs, and the windows
    `alongside` (another source's, whose own breaks are told elsewhere), that overlap it; each
    break names the overlapping windows whose VMs are in the group it breaks. What is
    impacted now (events, drains) is left out: it will be over by then; the VMs live now are
    the groups' members."""
    calm = replace(fleet, impacted={})
    index = index_of(fleet.vms.values())
    every = [*runs, *alongside]
    vms = {id(run): _counted(run, index) for run in every}
    found: list[AheadBreach] = []
    for run in runs:
        others = [o for o in every if o is not run and o.start < run.end and run.start < o.end]
        overlapping = {other.view().key: vms[id(other)] for other in others}
        for breach in breach_list(
            budgets, calm, run.view(), vms[id(run)], now, overlapping=overlapping
        ):
            sources = tuple(_with(other, vms[id(other)] & breach.busy) for other in others
                            if vms[id(other)] & breach.busy)  # fmt: skip
            said = f"{run.name} at {run.start:%Y-%m-%d %H:%M}Z: {breach.line}"
            said += f"; with {_named(sources)}" if sources else ""
            where = (run.start.date(), run.name, run.start)
            found.append(AheadBreach(*where, breach.budget, breach.group, breach.count,
                                     breach.limit, said, sources))  # fmt: skip
    return found


NAMED = 3  # overlapping windows a break's line names; the rest it counts


def _named(sources: Sequence[str]) -> str:
    """The windows that made a break, as its line says them: a line stays a line."""
    more = len(sources) - NAMED
    listed = ", ".join(sources[:NAMED])
    return f"{listed} and {more} other window{'' if more == 1 else 's'}" if more > 0 else listed


def _with(other: Planned, counted: frozenset[str]) -> str:
    return f"{other.said} ({len(counted)} VM{'' if len(counted) == 1 else 's'})"


def _counted(run: Planned, index: Mapping[str, frozenset[str]]) -> frozenset[str]:
    known, unknown = members(run.view().resources, index)
    return known | frozenset(unknown)


@dataclass(frozen=True)
class Upcoming:
    """A VM a run will patch: the Upcoming record's fields."""

    configuration: str  # the configuration's name
    configuration_id: str
    start: datetime
    end: datetime
    vm: str  # its name
    vm_id: str | None  # None: a VM (or a scale set) no agent reports


def upcoming(fleet: FleetView, runs: Sequence[Planned]) -> list[Upcoming]:
    """A row per VM per run: the known VMs by name, then the names no agent reports."""
    index = index_of(fleet.vms.values())
    rows: list[Upcoming] = []
    for run in runs:
        known, unknown = members(run.view().resources, index)
        names = sorted((fleet.vms[v].name, v) for v in known)
        base = Upcoming(run.name, run.configuration, run.start, run.end, "", None)
        rows += [replace(base, vm=name, vm_id=vm_id) for name, vm_id in names]
        rows += [replace(base, vm=name) for name in unknown]
    return rows
