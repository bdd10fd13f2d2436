"""Pure arithmetic of the benchmark report: percentiles, slopes, cost, the markdown table.

Nothing here measures or reads a clock, so tests/benchmarks/test_report.py can
check every number the report prints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

HOURS_PER_MONTH = 730.0  # Azure's pricing pages bill a month as 730 hours
SECONDS_PER_MONTH = HOURS_PER_MONTH * 3600.0
EVENT_HUBS_UNIT_BYTES = 64 * 1024  # an ingress event is billed per 64 KB or part of it
TU_EVENTS_PER_SECOND = 1000.0  # one throughput unit: 1 MB/s or 1000 events/s of ingress
TU_BYTES_PER_SECOND = 1_000_000.0
GB = 1e9  # Log Analytics bills GB as 10^9 bytes


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), interpolated linearly between closest ranks."""
    if not values:
        raise ValueError("no values")
    if not 0 <= q <= 100:
        raise ValueError("q must be within 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def window_medians(samples: Sequence[tuple[float, float]], windows: int) -> list[float]:
    """The median value of each of `windows` consecutive equal shares of (seconds, value)
    samples, oldest first (a leftover sample or two at the end is not counted)."""
    size = len(samples) // windows
    if size == 0:
        raise ValueError(f"{len(samples)} samples cannot fill {windows} windows")
    return [median([v for _, v in samples[i : i + size]]) for i in range(0, size * windows, size)]


def slope_per_minute(samples: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) samples, in value units per minute."""
    if len(samples) < 2:
        raise ValueError("a slope needs two samples")
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_v = sum(v for _, v in samples) / n
    spread = sum((t - mean_t) ** 2 for t, _ in samples)
    if spread == 0:
        raise ValueError("the samples share one time")
    covariance = sum((t - mean_t) * (v - mean_v) for t, v in samples)
    return covariance / spread * 60.0


def rate(count: float, seconds: float) -> float:
    if seconds <= 0:
        raise ValueError("the window must last")
    return count / seconds


# --- cost ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prices:
    """List prices in USD; `as_of` and `sources` are printed with the report."""

    eventhubs_per_million_events: float
    eventhubs_tu_per_hour: float
    loganalytics_per_gb: float
    queue_per_10k_operations: float
    table_per_10k_transactions: float
    blob_write_per_10k_operations: float
    as_of: str
    sources: tuple[str, ...]


@dataclass(frozen=True)
class MonthlyUse:
    """One VM's steady-state use per month, extrapolated from a measured run."""

    eventhubs_events: float  # billed 64 KB units
    eventhubs_bytes: float
    loganalytics_bytes: float
    queue_operations: float
    table_transactions: float


def eventhubs_units(sizes: Sequence[int]) -> int:
    """Billed ingress events: each event counts once per started 64 KB."""
    return sum(max(1, math.ceil(size / EVENT_HUBS_UNIT_BYTES)) for size in sizes)


def per_month(count: float, *, measured: float, month: float) -> float:
    """`count` seen over `measured` occurrences of something that happens `month` times a month."""
    if measured <= 0:
        raise ValueError("nothing was measured")
    return count / measured * month


def tu_share(use: MonthlyUse) -> float:
    """The share of one throughput unit this VM's ingress needs (events or bytes, the larger)."""
    events = use.eventhubs_events / SECONDS_PER_MONTH / TU_EVENTS_PER_SECOND
    volume = use.eventhubs_bytes / SECONDS_PER_MONTH / TU_BYTES_PER_SECOND
    return max(events, volume)


def monthly_cost(use: MonthlyUse, prices: Prices) -> dict[str, float]:
    """USD per VM-month by meter; the throughput unit is amortised by capacity share."""
    return {
        "eventhubs_ingress": use.eventhubs_events / 1e6 * prices.eventhubs_per_million_events,
        "eventhubs_tu_share": tu_share(use) * prices.eventhubs_tu_per_hour * HOURS_PER_MONTH,
        "loganalytics": use.loganalytics_bytes / GB * prices.loganalytics_per_gb,
        "queue": use.queue_operations / 1e4 * prices.queue_per_10k_operations,
        "table": use.table_transactions / 1e4 * prices.table_per_10k_transactions,
    }


# Log Analytics bills "a string representation of the columns that are stored" for a row,
# leaving out _ResourceId, _SubscriptionId, _ItemId, _IsBillable, _BilledSize and Type:
# https://learn.microsoft.com/azure/azure-monitor/logs/cost-logs#data-size-calculation
DATETIME_CHARS = 28  # 2026-11-21T17:36:51.7630000Z: Kusto prints datetimes in 100 ns ticks
TENANT_ID_CHARS = 36  # every row's TenantId column, a GUID, stored by the service


def billed_row_size(row: dict[str, Any], types: dict[str, str]) -> int:
    """Bytes Log Analytics bills for one stored row; null and empty columns store nothing."""
    size = TENANT_ID_CHARS
    for name, value in row.items():
        if value is None or value == "" or name not in types:
            continue  # a column the table does not have is dropped, not stored
        if types[name] == "datetime":
            size += DATETIME_CHARS
        elif isinstance(value, str):
            size += len(value.encode("utf-8"))
        else:  # numbers, booleans and dynamic values: their JSON text
            size += len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    return size


def naive_queue_cost(prices: Prices, *, poll_seconds: float = 1.0) -> float:
    """USD per VM-month of a design whose agent reads its queue every `poll_seconds`."""
    reads = SECONDS_PER_MONTH / poll_seconds
    return reads / 1e4 * prices.queue_per_10k_operations


# --- the table -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    number: str  # the measurement number, e.g. "1", "2b"
    measurement: str
    result: str
    target: str
    met: bool | None  # None: no target for this row


def verdict(met: bool | None) -> str:
    return {True: "yes", False: "**no**", None: ""}[met]


def render_table(rows: Sequence[Row]) -> str:
    lines = [
        "| # | Measurement | Result | Target | Met |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        cells = (row.number, row.measurement, row.result, row.target, verdict(row.met))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.1 else f"{seconds * 1000:.1f} ms"


def usd(amount: float) -> str:
    return f"${amount:.4f}" if amount < 1 else f"${amount:.2f}"
