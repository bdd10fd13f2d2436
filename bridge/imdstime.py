"""Times as Scheduled Events give them: NotBefore in RFC 1123 (with any weekday, as
Microsoft's own samples have wrong ones) or ISO 8601, read the same way wherever they
arrive (the agent's IMDS documents, the consumer's Event Grid deliveries).

    "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT"   (IMDS, api-version 2020-07-01)
    "NotBefore": "Mon, 19 Sep 2025 18:29:47 GMT"   (Event Grid's sample: 19 Sep 2025 was a Friday)
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTHS = {m: i for i, m in enumerate(_MONTH_NAMES, 1)}
# The weekday is matched but ignored: Microsoft's own samples carry wrong ones.
_RFC1123 = re.compile(
    r"^\s*(?:[A-Za-z]{3,9},?\s+)?(\d{1,2})\s+([A-Za-z]{3})[a-z]*\s+(\d{4})\s+"
    r"(\d{1,2}):(\d{2})(?::(\d{2}))?\s*(?:GMT|UTC|Z|\+0000)?\s*$"
)


def parse_time(raw: object) -> datetime | None:
    """NotBefore as an aware UTC datetime: RFC 1123 (any weekday) or ISO 8601; None otherwise."""
    if not isinstance(raw, str) or not raw.strip():
        return None
    text = raw.strip()
    match = _RFC1123.match(text)
    if match:
        return _from_rfc1123(match)
    return _from_iso(text)


def _from_rfc1123(match: re.Match[str]) -> datetime | None:
    day, month, year, hour, minute, second = match.groups()
    month_no = _MONTHS.get(month.lower())
    if month_no is None:
        return None
    try:
        return datetime(
            int(year),
            month_no,
            int(day),
            int(hour),
            int(minute),
            int(second or 0),
            tzinfo=timezone.utc,
        )
    except ValueError:
        return None


def _from_iso(text: str) -> datetime | None:
    candidate = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        moment = datetime.fromisoformat(candidate)
        if moment.tzinfo is None:
            # IMDS times are UTC; a bare ISO time from an old sample means UTC too.
            return moment.replace(tzinfo=timezone.utc)
        return moment.astimezone(timezone.utc)
    except (ValueError, OverflowError):
        return None
