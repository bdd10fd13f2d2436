"""The window gate (`approve_in_window`): an event is approved only inside one of the
rule's weekly windows, in the rule's time zone; outside, it waits for the next window, or is
held when none opens before NotBefore.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from bridge.policy.model import (
    EventView,
    Rule,
    Verdict,
    Window,
)


def check(rule: Rule, event: EventView, now: datetime) -> Verdict | None:
    zone = ZoneInfo(rule.action.timezone)
    if in_window(rule.action.windows, now, zone):
        return None
    opens = next_window_start(rule.action.windows, now, zone)
    if opens is None or (event.not_before is not None and opens >= event.not_before):
        why = "no maintenance window opens before NotBefore: the event starts at NotBefore"
        return Verdict("Hold", rule.name, why)
    return Verdict(
        "Defer",
        rule.name,
        f"outside the maintenance window until {opens:%a %H:%M}Z",
        recheck_at=opens,
    )


def in_window(windows: tuple[Window, ...], now: datetime, zone: ZoneInfo) -> bool:
    local = now.astimezone(zone)
    today, yesterday, clock = local.weekday(), (local.weekday() - 1) % 7, local.time()
    for w in windows:
        if w.start < w.end and today in w.days and w.start <= clock < w.end:
            return True
        # A window that wraps past midnight belongs to the day it opened.
        if w.start >= w.end and (
            (today in w.days and clock >= w.start) or (yesterday in w.days and clock < w.end)
        ):
            return True
    return False


def next_window_start(
    windows: tuple[Window, ...], now: datetime, zone: ZoneInfo
) -> datetime | None:
    local = now.astimezone(zone)
    starts = []
    for offset in range(8):
        day = local.date() + timedelta(days=offset)
        for w in windows:
            if day.weekday() in w.days:
                begin = datetime.combine(day, w.start, tzinfo=zone)
                starts += [s for s in _instants(begin) if s > now]
    return min(starts).astimezone(now.tzinfo) if starts else None


def _instants(begin: datetime) -> list[datetime]:
    """When a local wall time happens, in UTC: once, or twice in the hour a DST change repeats.

    Compared as instants: Python compares datetimes sharing a tzinfo by wall time alone, which
    put a window start in the first pass of the repeated hour "after" a now in the second pass.
    """
    first = begin.astimezone(timezone.utc)
    second = begin.replace(fold=1).astimezone(timezone.utc)
    return [first, second] if second > first else [first]
