"""The standalone consumer's metrics (docs/operations.md#metrics-and-health).

Low cardinality only: labels are reasons, actions, policy rule and budget names, and Event
Hubs partitions (a fixed, small number), never a VM or an event. A sample:

    se_bridge_consumer_records_total 1204.0
    se_bridge_consumer_records_refused_total{reason="schema"} 3.0
    se_bridge_consumer_lag_seconds{partition="0"} 0.8
    se_bridge_consumer_decisions_total{action="Approve",mode="normal",rule="user-initiated"} 7.0
    se_bridge_consumer_budget_fullest_ratio{budget="one-per-set"} 1.0
    se_bridge_consumer_commands_sent_total 7.0
    se_bridge_consumer_confirmation_latency_seconds_bucket{le="1.0"} 6.0
    se_bridge_consumer_approvals_missed_total{reason="late"} 1.0
    se_bridge_consumer_ledger_reads_total 311.0
    se_bridge_consumer_ledger_conflicts_total 4.0
    se_bridge_consumer_ledger_documents_fetched_total 29.0
    se_bridge_consumer_events_pending{status="Scheduled"} 3.0
    se_bridge_consumer_events_pending{status="Started"} 1.0
    se_bridge_consumer_next_event_start_timestamp_seconds 1.7957592e+09
    se_bridge_consumer_asks_pending 1.0
    se_bridge_consumer_pauses_active 0.0
    se_bridge_consumer_operator_actions_total{kind="approve"} 2.0
    se_bridge_consumer_operator_actions_forged_total 0.0
    se_bridge_consumer_operator_actions_previous_key 0.0
    se_bridge_consumer_budget_overrides_total 1.0
    se_bridge_consumer_eventgrid_total{kind="event"} 12.0
    se_bridge_consumer_eventgrid_refused_total{reason="untrusted-topic"} 1.0
    se_bridge_consumer_eventgrid_disagreements_total{field="Resources"} 1.0
    se_bridge_consumer_arm_acknowledge_total{outcome="approved"} 2.0
    se_bridge_consumer_failures_total{activity="reconcile",kind="OperationalError"} 1.0
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bridge.commands.message import Command
from bridge.consumer.people.desk import PeopleCounts
from bridge.consumer.people.operatorlog import KINDS, REFUSED
from bridge.consumer.release import Pending
from bridge.consumer.secondsource import EventGridCounts
from bridge.records import RecordView, parse_time
from bridge.recordtypes import RECORD_TYPE

PATCH_OUTCOMES = (
    "fits",
    "over_budget",
    "asked",
    "cancelled",
    "too_late",
    "cancel_failed",
    "unresolved",
    "instances_unread",
)


class ConsumerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.records = Counter(
            "se_bridge_consumer_records", "Records handed to the consumer.", registry=registry
        )
        self.refused = Counter(
            "se_bridge_consumer_records_refused",
            "Messages set aside as not records, by reason: size, json, schema, sender.",
            ["reason"],
            registry=registry,
        )
        self.lag = Gauge(
            "se_bridge_consumer_lag_seconds",
            "Per partition: the consumer's clock minus the TimeGenerated of the newest record "
            "of the last batch it handled.",
            ["partition"],
            registry=registry,
        )
        self.decisions = Counter(
            "se_bridge_consumer_decisions",
            "Decision records, by action, rule and mode.",
            ["action", "rule", "mode"],
            registry=registry,
        )
        self.sent = Counter(
            "se_bridge_consumer_commands_sent", "Approval commands sent.", registry=registry
        )
        self.confirmation = Histogram(
            "se_bridge_consumer_confirmation_latency_seconds",
            "From a command's IssuedAt to the agent's Approved record (its ApprovalLatencyMs).",
            buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=registry,
        )

        self.overrides = Counter(
            "se_bridge_consumer_budget_overrides",
            "Approvals a person made over a full budget (break-glass; Decision BudgetOverride).",
            registry=registry,
        )

    def batch(self, partition: str, records: Sequence[RecordView]) -> None:
        self.records.inc(len(records))
        newest = max((str(r.get("TimeGenerated") or "") for r in records), default="")
        moment = parse_time(newest)
        if moment is not None:
            self.lag.labels(partition).set(max(0.0, time.time() - moment.timestamp()))
        for record in records:
            latency = record.get("ApprovalLatencyMs")
            central = record.get("ApprovalSource") == "Central"
            # Records as read, before the schema check: a latency that is no number is not timed.
            approved = record.get("ApprovalOutcome") == "Approved"
            if approved and central and isinstance(latency, (int, float)):
                self.confirmation.observe(float(latency) / 1000)

    def refusal(self, reason: str) -> None:
        kind = (
            "size"
            if "bytes, more than" in reason
            else "sender"
            if "does not match the sender" in reason
            else "schema"
            if "record.schema.json" in reason
            else "json"
        )
        self.refused.labels(kind).inc()

    def decided(self, records: Sequence[RecordView]) -> None:
        for record in records:
            if record.get(RECORD_TYPE) == "Decision":
                self.decisions.labels(
                    str(record.get("DecisionAction")),
                    str(record.get("DecisionRule")),
                    str(record.get("DecisionMode")),
                ).inc()
                if record.get("BudgetOverride") is True:
                    self.overrides.inc()

    def watch_budgets(self, use: Callable[[], Mapping[str, float]]) -> None:
        """Ask `use` how full each budget is at each scrape (it reads the fleet state: done
        when Prometheus asks, not at every re-evaluation)."""
        self.registry.register(_BudgetCollector(use))

    def watch_ledger(self, counts: Callable[[], tuple[int, int, int]]) -> None:
        """Ask `counts` for the approval ledger's reads, conflicts and documents fetched so far
        at each scrape (bridge.consumer.ledger.ApprovalLedger keeps them as plain numbers)."""
        self.registry.register(_LedgerCollector(counts))

    def watch_pending(self, pending: Callable[[], Pending]) -> None:
        """Ask `pending` at each scrape for the open events as the consumer's last tick
        counted them (Consumer.pending: no read of the fleet state at a scrape)."""
        self.registry.register(_PendingCollector(pending))

    def watch_missed(self, counts: Callable[[], Mapping[str, int]]) -> None:
        """Ask `counts` for the approvals sent that never reached IMDS, by reason, at each
        scrape (bridge.consumer.ledger.ApprovalLedger.missed)."""
        self.registry.register(_MissedCollector(counts))

    def watch_eventgrid(self, counts: Callable[[], EventGridCounts]) -> None:
        """Ask `counts` at each scrape what the second source (Event Grid) has done."""
        self.registry.register(_EventGridCollector(counts))

    def watch_arm(self, counts: Callable[[], Mapping[str, int]]) -> None:
        """Ask `counts` at each scrape how ARM's acknowledge (the carrier of last resort)
        fared, by outcome (bridge.consumer.armcarrier.ArmCarrier.outcomes)."""
        self.registry.register(_ArmCollector(counts))

    def watch_failures(self, counts: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        """Ask `counts` at each scrape how often each periodic pass failed, by activity and
        kind (bridge.consumer.guard.Failures.counts)."""
        self.registry.register(_FailuresCollector(counts))

    def watch_patch_runs(self, counts: Callable[[], Mapping[str, int]]) -> None:
        """Ask `counts` at each scrape what became of Update Manager's patch runs, by outcome
        (bridge.consumer.patchruns.PatchRuns.outcomes)."""
        self.registry.register(_PatchRunCollector(counts))

    def watch_people(self, counts: Callable[[], PeopleCounts]) -> None:
        """Ask `counts` at each scrape for the asks, pauses and people's actions
        (PeopleDesk.counts: no read of the fleet state at a scrape)."""
        self.registry.register(_PeopleCollector(counts))


class _EventGridCollector(Collector):
    def __init__(self, counts: Callable[[], EventGridCounts]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        now = self._counts()
        records = CounterMetricFamily(
            "se_bridge_consumer_eventgrid",
            "What Event Grid's deliveries held, by kind: event (an Event record folded in), "
            "health (a health change), ignored (AKS events, health annotations, a whole scale "
            "set's health).",
            labels=["kind"],
        )
        for kind, count in (
            ("event", now.events),
            ("health", now.health),
            ("ignored", now.ignored),
        ):
            records.add_metric([kind], count)
        yield records
        refused = CounterMetricFamily(
            "se_bridge_consumer_eventgrid_refused",
            "Event Grid deliveries refused, by reason: not-json, too-large, wrong-type, "
            "untrusted-topic, wrong-subscription, out-of-scope, too-many-resources, malformed.",
            labels=["reason"],
        )
        for reason, count in sorted(now.refused.items()):
            refused.add_metric([reason], count)
        yield refused
        disagreed = CounterMetricFamily(
            "se_bridge_consumer_eventgrid_disagreements",
            "Events the agents and Event Grid tell differently, once per event and field.",
            labels=["field"],
        )
        for name, count in sorted(now.disagreements.items()):
            disagreed.add_metric([name], count)
        yield disagreed


class _FailuresCollector(Collector):
    def __init__(self, counts: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "se_bridge_consumer_failures",
            "Passes of the consumer's periodic work that failed and were tried again at the "
            "next, by activity (reevaluate, reconcile, reconcile_row, eventgrid_parse) and kind "
            "(the error's type).",
            labels=["activity", "kind"],
        )
        for (activity, kind), count in sorted(self._counts().items()):
            family.add_metric([activity, kind], count)
        yield family


class _PeopleCollector(Collector):
    def __init__(self, counts: Callable[[], PeopleCounts]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        now = self._counts()
        yield GaugeMetricFamily(
            "se_bridge_consumer_asks_pending",
            "Open events waiting for a person's answer (an ask rule), as of the last tick.",
            value=now.asks_pending,
        )
        yield GaugeMetricFamily(
            "se_bridge_consumer_pauses_active",
            "Pauses of early approvals in force (fleet-wide or of a budget group).",
            value=now.pauses_active,
        )
        yield _by_label(
            "se_bridge_consumer_operator_actions",
            "What people decided through the API, the page or the CLI and the consumer "
            "accepted, by kind: approve, hold, pause, resume.",
            "kind",
            KINDS,
            now.operated,
        )
        yield CounterMetricFamily(
            "se_bridge_consumer_operator_actions_forged",
            "Operator actions found in the fleet state whose signature did not verify with "
            "this consumer's key: ignored (someone wrote the state by hand, or the key changed).",
            value=now.forged,
        )
        yield _by_label(
            "se_bridge_consumer_operator_documents_refused",
            "Signed operator documents the consumer refused, by why: deleted (before their "
            "time: written back), reappeared (a forgotten one put back), signed_after_rotation "
            "(by a previous key after the current one took over).",
            "why",
            REFUSED,
            now.refused,
        )
        yield GaugeMetricFamily(
            "se_bridge_consumer_operator_actions_previous_key",
            "Operator actions that apply only through a previous signing key "
            "(commands.verify_key) because they are not yet signed again with the current one: "
            "keep that key until this is 0.",
            value=now.on_previous_key,
        )


def _by_label(
    name: str, doc: str, label: str, values: Iterable[str], counts: Mapping[str, int]
) -> CounterMetricFamily:
    """A counter of one label, every value of `values` given (0 when `counts` has none)."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for value in values:
        family.add_metric([value], counts.get(value, 0))
    return family


class _ArmCollector(Collector):
    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        yield _by_label(
            "se_bridge_consumer_arm_acknowledge",
            "Approvals carried by ARM's acknowledge (no live agent could), by outcome: approved, "
            "refused (ARM would not: the event is over or not opted in), failed (ARM unreachable, "
            "throttled past the retries, or the identity refused: sent again at the next pass).",
            "outcome",
            ("approved", "refused", "failed"),
            self._counts(),
        )


class _PatchRunCollector(Collector):
    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        yield _by_label(
            "se_bridge_consumer_patch_runs",
            "Update Manager's patch runs decided, by outcome: fits, over_budget (let run over a "
            "budget), asked, cancelled (through applyUpdates before the cut-off), too_late (a "
            "cancel wanted past the cut-off's margin: refused, the run ran), cancel_failed "
            "(ARM refused or could not be reached), unresolved (its VMs could not be read), "
            "instances_unread (a scale set's instances could not be read: the run counted as "
            "breaking every budget; also counted by what was decided).",
            "outcome",
            PATCH_OUTCOMES,
            self._counts(),
        )


class _PendingCollector(Collector):
    def __init__(self, pending: Callable[[], Pending]) -> None:
        self._pending = pending

    def collect(self) -> Iterator[Metric]:
        now = self._pending()
        gauge = GaugeMetricFamily(
            "se_bridge_consumer_events_pending",
            "Open events across the fleet by status, as of the consumer's last tick.",
            labels=["status"],
        )
        gauge.add_metric(["Scheduled"], now.scheduled)
        gauge.add_metric(["Started"], now.started)
        yield gauge
        if now.next_start is not None:  # absent, not 0, when nothing is scheduled
            yield GaugeMetricFamily(
                "se_bridge_consumer_next_event_start_timestamp_seconds",
                "The earliest NotBefore (Unix time) of a Scheduled event across the fleet.",
                value=now.next_start.timestamp(),
            )


class _MissedCollector(Collector):
    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        missed = CounterMetricFamily(
            "se_bridge_consumer_approvals_missed",
            "Approvals sent that never reached IMDS, counted as their events end, by reason: "
            "late (the agent read the command after the event Started or ended), refused (the "
            "last VM asked refused it), unanswered (no Approval record came).",
            labels=["reason"],
        )
        for reason, count in sorted(self._counts().items()):
            missed.add_metric([reason], count)
        yield missed


class _LedgerCollector(Collector):
    def __init__(self, counts: Callable[[], tuple[int, int, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        reads, conflicts, fetched = self._counts()
        yield CounterMetricFamily(
            "se_bridge_consumer_ledger_reads",
            "Reads of the whole approval ledger; on Table Storage each returns every ledger "
            "document written in its last 10 s, up to 97 entities of one partition.",
            value=reads,
        )
        yield CounterMetricFamily(
            "se_bridge_consumer_ledger_conflicts",
            "Ledger writes that found a document changed since it was read (decided again).",
            value=conflicts,
        )
        yield CounterMetricFamily(
            "se_bridge_consumer_ledger_documents_fetched",
            "Ledger documents read by key: the shard of an entry released, sent or answered; "
            "before an approval and after a conflict, what the write takes and what changed.",
            value=fetched,
        )


class _BudgetCollector(Collector):
    def __init__(self, use: Callable[[], Mapping[str, float]]) -> None:
        self._use = use

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "se_bridge_consumer_budget_fullest_ratio",
            "Per budget: VMs impacted over the limit in its fullest group (1 is full).",
            labels=["budget"],
        )
        for name, ratio in self._use().items():
            gauge.add_metric([name], ratio)
        yield gauge


class CountingSender:
    """A command channel that counts what goes through it."""

    def __init__(self, inner: Any, metrics: ConsumerMetrics) -> None:
        self._inner, self._metrics = inner, metrics

    def send(self, command: Command, time_to_live: float) -> None:
        self._inner.send(command, time_to_live)
        self._metrics.sent.inc()

    def close(self) -> None:
        self._inner.close()
