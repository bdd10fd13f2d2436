"""The consumer's metrics exposition (bridge/consumer/metrics.py): counters read at each scrape."""

from __future__ import annotations

from datetime import datetime, timezone

from prometheus_client import CollectorRegistry, generate_latest

from bridge.consumer.metrics import ConsumerMetrics
from bridge.consumer.people.desk import PeopleCounts
from bridge.consumer.release import Pending


def test_the_ledgers_reads_conflicts_and_fetches_are_read_at_each_scrape() -> None:
    registry = CollectorRegistry()
    counts = [3, 1, 7]
    ConsumerMetrics(registry).watch_ledger(lambda: (counts[0], counts[1], counts[2]))
    text = generate_latest(registry).decode()
    assert "se_bridge_consumer_ledger_reads_total 3.0" in text
    assert "se_bridge_consumer_ledger_conflicts_total 1.0" in text
    assert "se_bridge_consumer_ledger_documents_fetched_total 7.0" in text
    counts[:] = [5, 2, 9]
    text = generate_latest(registry).decode()
    assert "se_bridge_consumer_ledger_reads_total 5.0" in text
    assert "se_bridge_consumer_ledger_conflicts_total 2.0" in text
    assert "se_bridge_consumer_ledger_documents_fetched_total 9.0" in text


def test_approvals_that_never_reached_imds_are_counted_by_reason() -> None:
    registry = CollectorRegistry()
    missed = {"late": 2, "unanswered": 1}
    ConsumerMetrics(registry).watch_missed(lambda: missed)
    text = generate_latest(registry).decode()
    assert 'se_bridge_consumer_approvals_missed_total{reason="late"} 2.0' in text
    assert 'se_bridge_consumer_approvals_missed_total{reason="unanswered"} 1.0' in text
    assert 'reason="refused"' not in text  # none yet


def test_open_events_and_the_next_start_are_read_at_each_scrape() -> None:
    registry = CollectorRegistry()
    pending = [
        Pending(scheduled=2, started=1, next_start=datetime(2026, 11, 27, 6, tzinfo=timezone.utc))
    ]
    ConsumerMetrics(registry).watch_pending(lambda: pending[0])
    text = generate_latest(registry).decode()
    assert 'se_bridge_consumer_events_pending{status="Scheduled"} 2.0' in text
    assert 'se_bridge_consumer_events_pending{status="Started"} 1.0' in text
    assert "se_bridge_consumer_next_event_start_timestamp_seconds 1.7957592e+09" in text
    pending[0] = Pending()
    text = generate_latest(registry).decode()
    assert 'se_bridge_consumer_events_pending{status="Scheduled"} 0.0' in text
    assert "next_event_start" not in text  # absent when nothing is scheduled


def test_asks_pauses_and_peoples_actions_are_read_at_each_scrape() -> None:
    registry = CollectorRegistry()
    counts = [PeopleCounts(1, 2, {"approve": 3}, 4, 6)]
    metrics = ConsumerMetrics(registry)
    metrics.watch_people(lambda: counts[0])
    metrics.decided([{"RecordType": "Decision", "DecisionAction": "Approve",
                      "DecisionRule": "(person)", "DecisionMode": "normal",
                      "BudgetOverride": True}])  # fmt: skip
    text = generate_latest(registry).decode()
    assert "se_bridge_consumer_asks_pending 1.0" in text
    assert "se_bridge_consumer_pauses_active 2.0" in text
    assert 'se_bridge_consumer_operator_actions_total{kind="approve"} 3.0' in text
    assert 'se_bridge_consumer_operator_actions_total{kind="pause"} 0.0' in text
    assert "se_bridge_consumer_operator_actions_forged_total 4.0" in text
    assert "se_bridge_consumer_operator_actions_previous_key 6.0" in text
    assert "se_bridge_consumer_budget_overrides_total 1.0" in text
    counts[0] = PeopleCounts(0, 0, {}, 5)
    text = generate_latest(registry).decode()
    assert "se_bridge_consumer_asks_pending 0.0" in text
    assert "se_bridge_consumer_operator_actions_forged_total 5.0" in text
