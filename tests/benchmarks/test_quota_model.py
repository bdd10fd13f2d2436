"""The quota model's arithmetic (tests/benchmarks/quotas.py): loads scale with the fleet and the
fan-out, and each quota breaks where its load meets its limit."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tests.benchmarks import quotas

MEASURED = quotas.Measured(
    connection_seconds_per_send=5.0,
    events_per_heartbeat=1.0,
    la_requests_per_send=1.0,
    la_bytes_per_record=800.0,
    sends_per_event=3.0,
    records_per_event=3.0,
    queue_reads_per_event=0.0,
    queue_reads_per_pending_second=1.0,
    others_reads_per_second=0.1,
    table_ops_per_heartbeat=2.0,
    table_ops_per_event_record=2.0,
    table_entities_per_heartbeat={"vm": 1.5, "ledger": 1.5},
    table_entities_per_event_record={"event": 2.0, "ledger": 2.0},
    blob_ops_per_second=2.0,
)
FREEZE = next(w for w in quotas.WAVES if w.name == "freeze")
STORM = next(w for w in quotas.WAVES if w.name == "spot-storm")


def quota(measure: str, tier: str = "Standard") -> quotas.Quota:
    return next(q for q in quotas.QUOTAS if q.measure == measure and q.tier.startswith(tier))


@pytest.mark.parametrize("q", quotas.QUOTAS, ids=lambda q: f"{q.name} {q.tier}")
@pytest.mark.parametrize("wave", quotas.WAVES, ids=lambda w: w.name)
def test_each_quota_breaks_where_its_load_meets_its_limit(
    q: quotas.Quota, wave: quotas.Wave
) -> None:
    n = q.breaks_at(MEASURED, wave, fanout=1.0)
    assert n > 0
    if not math.isinf(n):
        assert q.load(MEASURED, wave, n, 1.0) >= q.limit
        assert q.load(MEASURED, wave, n - 1, 1.0) < q.limit


def test_a_connection_held_for_a_minute_caps_a_standard_namespace_at_25000_vms() -> None:
    """The agent before issue 15 held its connection about a minute after each heartbeat."""
    held = replace(MEASURED, connection_seconds_per_send=60.0)
    assert quota("connections").breaks_at(held, quotas.STEADY, 1.0) == pytest.approx(25_000, abs=1)
    assert quota("connections").breaks_at(MEASURED, quotas.STEADY, 1.0) == pytest.approx(
        300_000, abs=1
    )


def test_one_logs_request_per_heartbeat_caps_one_rule_at_60000_vms() -> None:
    rule = quota("requests/min", "(soft")
    assert rule.breaks_at(MEASURED, quotas.STEADY, 1.0) == pytest.approx(60_000, abs=1)


def test_the_fanout_multiplies_what_follows_an_event_not_the_heartbeats() -> None:
    q = quota("events/s")
    steady = q.load(MEASURED, quotas.STEADY, 100_000, 100.0)
    assert steady == q.load(MEASURED, quotas.STEADY, 100_000, 1.0)
    one = q.load(MEASURED, FREEZE, 100_000, 1.0) - steady
    hundred = q.load(MEASURED, FREEZE, 100_000, 100.0) - steady
    assert hundred == pytest.approx(100 * one)


def test_a_storm_of_a_fixed_size_loads_a_fleet_no_more_than_it_has_vms() -> None:
    q = quota("storage requests/s", "Standard GPv2")
    records = 5000 / 120 * 3 * 2 + 2  # the consumer's table requests for the storm, and blobs
    heartbeats = 100_000 / 300 * 2
    # 5,000 Preempts in 2 min, each pending 30 s: 1,250 VMs reading their queue at once...
    assert q.load(MEASURED, STORM, 100_000, 1.0) == pytest.approx(1250 + records + heartbeats)
    # ... and with 100 VMs seeing each event, 125,000 more at the slower interval: all the
    # other VMs of a 100,000-VM fleet, no more.
    assert q.load(MEASURED, STORM, 100_000, 100.0) == pytest.approx(
        1250 + (100_000 - 1250) * 0.1 + records * 100 - 2 * 99 + heartbeats
    )
    assert quotas.fmt_fleet(math.inf) == "never"
    assert quotas.fmt_fleet(2_500_000) == "2.5M"


def test_the_reads_as_an_event_appears_are_charged_once_per_event_not_per_pending_second() -> None:
    """An agent reads its queue every 0.2 s for 3 s after an event that affects it appears (12
    reads more than at its 1 s poll_interval), then every second while the event is pending."""
    q = quota("storage requests/s", "Standard GPv2")
    burst = replace(MEASURED, queue_reads_per_event=12.0)
    # The freeze: 20,000 events in 30 minutes, 11.1 a second, each pending 900 s at worst:
    # 10,000 VMs reading every second, and 11.1 bursts a second of 12 reads more each.
    events = 0.2 * 100_000 / 1800
    assert q.load(burst, FREEZE, 100_000, 1.0) == pytest.approx(
        q.load(MEASURED, FREEZE, 100_000, 1.0) + events * 12.0
    )
    # Neighbours never burst: a placement group adds only what their records cost.
    assert q.load(burst, FREEZE, 100_000, 100.0) - q.load(MEASURED, FREEZE, 100_000, 100.0) == (
        pytest.approx(events * 12.0)
    )
    # The same reads measured over events pending 2 s and charged per pending second, as the
    # model did, would have broken an account at less than a sixth of the fleet.
    per_second = replace(MEASURED, queue_reads_per_pending_second=1.0 + 12.0 / 2)
    assert q.breaks_at(per_second, FREEZE, 1.0) < q.breaks_at(burst, FREEZE, 1.0) / 6


def test_the_table_names_every_quota_and_says_which_hold() -> None:
    lines = quotas.table(MEASURED, 1.0)
    assert len(lines) == 2 + len(quotas.QUOTAS)
    assert any("**no**" in line for line in lines)  # one Logs Ingestion rule at 100k VMs
    assert any("| yes |" in line for line in lines)


def test_what_a_fleet_needs_is_its_worst_load_over_the_limit_rounded_up() -> None:
    q = quota("requests/min", "(soft")
    # 100,000 VMs: 20,000 heartbeat requests a minute; the storm adds 5,000 x 3 sends in 2 min.
    assert quotas.needed(q, MEASURED, 1.0, 100_000) == math.ceil((20_000 + 7_500) / 12_000)
    assert quotas.needed(q, MEASURED, 1.0, 1_000) == 1


def test_a_send_interval_bounds_the_uploads_of_what_can_wait_not_of_own_events() -> None:
    rule = quota("requests/min", "(soft")
    held = replace(MEASURED, la_send_interval=60.0)
    # Fan-out 1: heartbeats (20,000 a minute at 100,000 VMs) are far under one upload a
    # minute per VM, so nothing changes.
    assert rule.load(held, STORM, 100_000, 1.0) == rule.load(MEASURED, STORM, 100_000, 1.0)
    # Fan-out 100: 5,000 x 99 neighbours' sightings x 3 sends in 2 minutes would be 742,500
    # uploads a minute; each VM uploads them at most once a minute: 100,000. Own events
    # (5,000 x 3 in 2 minutes) still go at once.
    assert rule.load(MEASURED, STORM, 100_000, 100.0) == pytest.approx(7_500 + 742_500 + 20_000)
    assert rule.load(held, STORM, 100_000, 100.0) == pytest.approx(7_500 + 100_000)


def test_each_table_partition_takes_what_its_records_cost_and_the_busiest_is_the_load() -> None:
    q = quota("partition entities/s", "Standard GPv2")
    # 100,000 VMs: 333 heartbeats/s; the storm: 5,000 x 3 records in 2 minutes, 125/s.
    loads = quotas.partition_loads(MEASURED, STORM, 100_000, 1.0)
    assert loads == pytest.approx({"vm": 500.0, "ledger": 500.0 + 250.0, "event": 250.0})
    assert q.load(MEASURED, STORM, 100_000, 1.0) == pytest.approx(750.0)
    # A neighbour's sighting that costs the consumer only the event's fold: at fan-out 100,
    # 99 neighbours' records for each own one, and the ledger's load stays.
    cheap = replace(
        MEASURED,
        neighbour_records_per_event=2.0,
        table_entities_per_neighbour_record={"event": 1.0},
    )
    loads = quotas.partition_loads(cheap, STORM, 100_000, 100.0)
    assert loads["ledger"] == pytest.approx(750.0)
    assert loads["event"] == pytest.approx(250.0 + 5000 / 120 * 99 * 2.0)
    # The event collection spread over 32 partitions: each takes a 32nd of it.
    spread = replace(cheap, table_partitions={"event": 32})
    assert quotas.partition_loads(spread, STORM, 100_000, 100.0)["event"] == pytest.approx(
        loads["event"] / 32
    )
    # What neighbours' records cost the ledger is its re-evaluation looks: capped.
    capped = replace(
        cheap,
        table_entities_per_neighbour_record={"event": 1.0, "ledger": 0.5},
        neighbour_caps={"ledger": 600.0},
    )
    loads = quotas.partition_loads(capped, STORM, 100_000, 100.0)
    assert loads["ledger"] == pytest.approx(750.0 + 600.0)
