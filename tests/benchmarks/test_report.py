"""The benchmark report's arithmetic (tests/benchmarks/report.py): percentiles, slopes, cost."""

from __future__ import annotations

import pytest

from tests.benchmarks.report import (
    SECONDS_PER_MONTH,
    MonthlyUse,
    Prices,
    Row,
    billed_row_size,
    eventhubs_units,
    median,
    monthly_cost,
    naive_queue_cost,
    per_month,
    percentile,
    rate,
    render_table,
    slope_per_minute,
    tu_share,
    window_medians,
)

PRICES = Prices(
    eventhubs_per_million_events=0.028,
    eventhubs_tu_per_hour=0.03,
    loganalytics_per_gb=2.30,
    queue_per_10k_operations=0.004,
    table_per_10k_transactions=0.00036,
    blob_write_per_10k_operations=0.065,
    as_of="test",
    sources=(),
)


def test_percentiles_interpolate_between_closest_ranks() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 5.0
    assert median(values) == 3.0
    assert percentile(values, 99) == pytest.approx(4.96)
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile([7.0], 99) == 7.0


def test_percentile_refuses_nothing_and_out_of_range() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="within"):
        percentile([1.0], 101)


def test_slope_is_per_minute_and_zero_when_flat() -> None:
    growing = [(t, 30.0 + t / 60.0 * 2.0) for t in range(0, 300, 5)]  # +2 per minute
    assert slope_per_minute(growing) == pytest.approx(2.0)
    assert slope_per_minute([(0.0, 5.0), (60.0, 5.0), (120.0, 5.0)]) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="two samples"):
        slope_per_minute([(0.0, 1.0)])


def test_window_medians_are_oldest_first_and_need_a_sample_each() -> None:
    samples = [(float(t), v) for t, v in enumerate([1.0, 9.0, 2.0, 3.0, 3.0, 8.0, 5.0])]
    assert window_medians(samples, 3) == [5.0, 2.5, 5.5]  # the seventh sample is left over
    with pytest.raises(ValueError, match="cannot fill"):
        window_medians(samples[:2], 3)


def test_rate_and_per_month_scaling() -> None:
    assert rate(10_000, 4.0) == 2500.0
    # 40 events seen over 20 heartbeats; 8760 heartbeats a month → 17,520 a month.
    assert per_month(40, measured=20, month=8760) == 17_520
    with pytest.raises(ValueError, match="nothing"):
        per_month(1, measured=0, month=1)


def test_event_hubs_bills_each_started_64_kb() -> None:
    assert eventhubs_units([100, 65_536, 65_537, 0]) == 1 + 1 + 2 + 1


def test_monthly_cost_per_meter() -> None:
    use = MonthlyUse(
        eventhubs_events=1e6,
        eventhubs_bytes=1e9,
        loganalytics_bytes=1e9,
        queue_operations=1e4,
        table_transactions=2e4,
    )
    cost = monthly_cost(use, PRICES)
    assert cost["eventhubs_ingress"] == pytest.approx(0.028)
    assert cost["loganalytics"] == pytest.approx(2.30)
    assert cost["queue"] == pytest.approx(0.004)
    assert cost["table"] == pytest.approx(0.00072)
    # 1e6 events a month is 0.38 events/s: 0.038% of a TU's 1000/s; bytes need less.
    share = 1e6 / SECONDS_PER_MONTH / 1000
    assert tu_share(use) == pytest.approx(share)
    assert cost["eventhubs_tu_share"] == pytest.approx(share * 0.03 * 730)


def test_naive_design_reads_the_queue_every_second() -> None:
    # 730 h * 3600 s = 2,628,000 reads a month at $0.004 per 10,000.
    assert naive_queue_cost(PRICES) == pytest.approx(1.0512)
    assert naive_queue_cost(PRICES, poll_seconds=2.0) == pytest.approx(0.5256)


def test_table_marks_misses_and_escapes_pipes() -> None:
    text = render_table([
        Row("1", "a|b", "0.7", "≤ 0.6", False),
        Row("2", "c", "1", "", None),
        Row("3", "d", "2", "≥ 1", True),
    ])  # fmt: skip
    lines = text.splitlines()
    assert lines[0] == "| # | Measurement | Result | Target | Met |"
    assert lines[2] == "| 1 | a\\|b | 0.7 | ≤ 0.6 | **no** |"
    assert lines[3] == "| 2 | c | 1 |  |  |"
    assert lines[4].endswith("| yes |")


def test_billed_row_size_counts_stored_values_not_names_nulls_or_unknown_columns() -> None:
    types = {
        "TimeGenerated": "datetime",
        "VmName": "string",
        "SpoolDepth": "int",
        "ImdsHealthy": "boolean",
        "Tags": "dynamic",
        "Zone": "string",
    }
    row = {
        "TimeGenerated": "2026-11-21T17:36:51.763Z",
        "VmName": "vm-ü",
        "SpoolDepth": 120,
        "ImdsHealthy": False,
        "Tags": {"a": "b"},
        "Zone": None,
        "NotAColumn": "x" * 50,
    }
    # TenantId 36, datetime 28, "vm-ü" 5 bytes, "120" 3, "false" 5, {"a":"b"} 9
    assert billed_row_size(row, types) == 36 + 28 + 5 + 3 + 5 + 9
    assert billed_row_size({"Zone": "", "VmName": None}, types) == 36
