"""The consumer's metrics exposition (bridge/consumer/metrics.py): counters read at each scrape."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from bridge.consumer.metrics import ConsumerMetrics


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
