"""`se-bridge policy check POLICY --schedule FILE` (issue 40, item 2; docs/planned-disruptions.md
#the-week-ahead): the fleet's patch schedules over the next 14 days against the policy's
budgets, offline: each run that would break a budget is a line naming the configuration, the
group, the count and the limit; exit 1 when there is one.

The file is what the consumer reads from Azure, written down: the maintenance configurations
as ARM's GET returns them, each with `resources` (the VM and scale set ids it patches: its
assignments and dynamic scopes resolved), and the fleet's VMs (their groups), for example:

{"configurations": [{"id": "/subscriptions/.../maintenanceConfigurations/web-tue-0200",
   "properties": {"maintenanceWindow": {"startDateTime": "2024-06-01 02:00",
     "duration": "03:55", "timeZone": "W. Europe Standard Time", "recurEvery": "Week Tuesday"}},
   "resources": ["/subscriptions/.../virtualMachineScaleSets/web"]}],
 "vms": [{"name": "web_0", "subscriptionId": "...", "resourceGroup": "rg-web",
          "scaleSet": "web", "zone": "1", "tags": {"tier": "web"}}]}
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bridge.policy.model import Budget, FleetView, VmView
from bridge.policy.upcoming import HORIZON, AheadBreach, Planned, ahead, parse_schedule, plan


class ScheduleError(ValueError):
    """The schedule file cannot be read: said as it is, exit 2."""


def load(path: Path, now: datetime) -> tuple[list[Planned], FleetView, int]:
    """The runs within HORIZON of `now`, the fleet, and how many configurations."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ScheduleError(f"cannot read --schedule {path}: {err.strerror or err}") from err
    except ValueError as err:
        raise ScheduleError(f"--schedule {path} is not JSON: {err}") from err
    if not isinstance(data, Mapping):
        raise ScheduleError(f"--schedule {path}: not a JSON object")
    configurations = _list(data, "configurations", path)
    schedules = []
    for number, config in enumerate(configurations, 1):
        if not isinstance(config, Mapping):
            raise ScheduleError(f"--schedule {path}: configuration {number} is not an object")
        resources = config.get("resources") or []
        if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
            raise ScheduleError(f"--schedule {path}: configuration {number}'s resources is "
                                "not a list of resource ids")  # fmt: skip
        try:
            schedule = parse_schedule(config)
        except (ValueError, TypeError) as err:
            raise ScheduleError(f"--schedule {path}: {err}") from err
        schedules.append((schedule, frozenset(r.lower() for r in resources)))
    vms = [_vm(row, number, path, now) for number, row in enumerate(_list(data, "vms", path), 1)]
    fleet = FleetView(vms={vm.vm_id: vm for vm in vms}, impacted={})
    return plan(schedules, now, HORIZON), fleet, len(schedules)


def _list(data: Mapping[str, Any], key: str, path: Path) -> list[Any]:
    value = data.get(key) or []
    if not isinstance(value, list):
        raise ScheduleError(f"--schedule {path}: {key} is not a list")
    return value


def _vm(row: Any, number: int, path: Path, now: datetime) -> VmView:
    """A VM of the file, alive at `now` (the budgets count the live members of a group)."""
    if not isinstance(row, Mapping) or not isinstance(row.get("name"), str):
        raise ScheduleError(f"--schedule {path}: vm {number} is not an object with a name")

    def text(key: str) -> str | None:
        value = row.get(key)
        return str(value) if value is not None else None

    tags = row.get("tags") or {}
    return VmView(
        vm_id=text("vmId") or row["name"],
        name=row["name"],
        subscription_id=text("subscriptionId"),
        resource_group=text("resourceGroup"),
        location=text("location"),
        zone=text("zone"),
        scale_set=text("scaleSet"),
        tags={str(k): str(v) for k, v in tags.items()} if isinstance(tags, Mapping) else {},
        last_seen=now,
        resource_id=(text("id") or "").lower() or None,
    )


def report(  # noqa: PLR0917 - policy check's arguments, as before `others`
    budgets: Sequence[Budget], runs: Sequence[Planned], fleet: FleetView, configurations: int,
    now: datetime, others: Sequence[Planned] = (),
) -> tuple[list[str], list[AheadBreach]]:  # fmt: skip
    """The lines `policy check --schedule` (and `--azure`) prints, and the breaks: of the
    configurations' `runs` and of the other sources' windows `others` (Service Health, AKS),
    counted together where they overlap, each break naming the windows that made it."""
    found = sorted(ahead(budgets, fleet, [*runs, *others], now),
                   key=lambda b: (b.start, b.configuration))  # fmt: skip
    days = HORIZON // timedelta(days=1)
    lines = [
        f"BREAK {b.start:%Y-%m-%d %H:%M}Z {b.configuration}: budget {b.budget}, group "
        f"{b.group}: {b.count} VMs at once, limit {b.limit}"
        + (f" (with {', '.join(b.sources)})" if b.sources else "")
        for b in found
    ]
    head = f"{len(runs)} runs of {configurations} configurations"
    if others:
        head += (
            f" and {len(others)} window{'' if len(others) == 1 else 's'} of Service Health or AKS"
        )
    head += f" in the next {days} days"
    if found:
        lines.append(f"{head}: {len(found)} would break a budget")
    else:
        lines.append(f"{head} fit every budget")
    return lines, found
