"""The agent's metrics (docs/operations.md#metrics-and-health): what it counts as it goes,
and what it reads from the spool and the delivery workers when Prometheus scrapes.

Low cardinality only: labels are kinds, types, sinks (by kind: `jsonl`, never its path) and
outcomes, never a VM or an event.
A sample of what `/metrics` shows (besides the process_*, python_gc_* and python_info ones):

    se_bridge_imds_polls_total{outcome="ok"} 3605.0
    se_bridge_imds_failures_total{kind="throttled"} 2.0
    se_bridge_imds_last_success_timestamp_seconds 1.7641400e+09
    se_bridge_records_total{transition="Scheduled",type="Event"} 1.0
    se_bridge_spool_waiting_records{sink="eventhubs"} 0.0
    se_bridge_spool_oldest_waiting_age_seconds{sink="eventhubs"} 0.0
    se_bridge_delivery_failures_total{kind="retryable",sink="eventhubs"} 4.0
    se_bridge_hooks_total{outcome="ok",phase="prepare"} 1.0
    se_bridge_commands_total{outcome="Approved",source="Central"} 1.0
    se_bridge_commands_late_total{reason="Started"} 1.0
    se_bridge_approval_latency_seconds_bucket{le="1.0"} 1.0
    se_bridge_agent_drains_total{outcome="drained"} 1.0
    se_bridge_agent_evictions_refused_total 3.0
    se_bridge_events_pending 1.0
    se_bridge_next_event_start_timestamp_seconds 1.7641410e+09
    se_bridge_build_info{version="0.1.0"} 1.0
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bridge.agent.normalise import NormaliserState, empty_state
from bridge.outbox.spool import Spool
from bridge.records import ApprovalOutcome, RecordView, parse_time
from bridge.recordtypes import RECORD_TYPE
from bridge.retry import DeliveryError, PermanentError, ThrottledError


class AgentMetrics:
    """What the agent counts; `registry` is what the endpoint serves."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.polls = Counter(
            "se_bridge_imds_polls",
            "Scheduled Events polls, by outcome (ok, failed).",
            ["outcome"],
            registry=registry,
        )
        self.imds_failures = Counter(
            "se_bridge_imds_failures",
            "IMDS failures by kind: throttled, retryable, permanent, invalid (a body that is "
            "not a Scheduled Events document).",
            ["kind"],
            registry=registry,
        )
        self.last_success = Gauge(
            "se_bridge_imds_last_success_timestamp_seconds",
            "When IMDS last answered a poll (Unix time): time() minus this is its age.",
            registry=registry,
        )
        self.records = Counter(
            "se_bridge_records",
            "Records made, by type and (for Event records) transition.",
            ["type", "transition"],
            registry=registry,
        )
        self.hooks = Counter(
            "se_bridge_hooks",
            "Hooks run, by phase and outcome (ok, failed, timeout).",
            ["phase", "outcome"],
            registry=registry,
        )
        self.commands = Counter(
            "se_bridge_commands",
            "Approvals handled, by source (Central, Local) and outcome (Approved, Refused, "
            "Failed).",
            ["source", "outcome"],
            registry=registry,
        )
        self.late = Counter(
            "se_bridge_commands_late",
            "Approvals that came too late, by reason: the event had Started or Ended here "
            "(refused as Late: it went ahead unapproved), or the command had Expired.",
            ["reason"],
            registry=registry,
        )
        self.drains = Counter(
            "se_bridge_agent_drains",
            "Drains of this VM's Kubernetes node ([kubernetes]), by outcome: started, drained, "
            "gave_up (the deadline came), failed.",
            ["outcome"],
            registry=registry,
        )
        self.drain_blocked = Counter(
            "se_bridge_agent_drain_blocked",
            "Times a drain reported itself blocked (a Hook record with DrainStatus Blocked).",
            registry=registry,
        )
        self.evictions_refused = Counter(
            "se_bridge_agent_evictions_refused",
            "Evictions the API server refused (429: a PodDisruptionBudget forbids it now).",
            registry=registry,
        )
        self.approval_latency = Histogram(
            "se_bridge_approval_latency_seconds",
            "From a command's IssuedAt (or the local decision) to IMDS accepting the approval.",
            buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=registry,
        )

    def polled(self, err: DeliveryError | None, now: datetime | None = None) -> None:
        if err is None:
            self.polls.labels("ok").inc()
            self.last_success.set(now.timestamp() if now else time.time())
            return
        self.polls.labels("failed").inc()
        kind = (
            "throttled"
            if isinstance(err, ThrottledError)
            else "permanent"
            if isinstance(err, PermanentError)
            else "retryable"
        )
        self.imds_failures.labels(kind).inc()

    def invalid_document(self) -> None:
        self.imds_failures.labels("invalid").inc()

    def made(self, records: Sequence[RecordView]) -> None:
        for record in records:
            transition = record.get("Transition") if record.get(RECORD_TYPE) == "Event" else ""
            self.records.labels(str(record.get(RECORD_TYPE)), str(transition or "")).inc()

    def hook(self, phase: str, outcome: str) -> None:
        self.hooks.labels(phase, outcome).inc()

    def approval(self, outcome: ApprovalOutcome) -> None:
        self.commands.labels(outcome.source, outcome.outcome).inc()
        self.records.labels("Approval", "").inc()
        if outcome.late is not None:
            self.late.labels(outcome.late).inc()
        if outcome.outcome == "Approved" and outcome.latency_ms is not None:
            self.approval_latency.observe(outcome.latency_ms / 1000)

    def watch(
        self,
        spool: Spool,
        delivery_status: Callable[[], Mapping[str, Mapping[str, Any]]],
        events: Callable[[], NormaliserState | None],
    ) -> None:
        """Read the spool, the delivery workers and the events IMDS last listed (`events`,
        the normaliser's state) at each scrape (nothing kept in between)."""
        self.registry.register(_OutboxCollector(spool, delivery_status))
        self.registry.register(_EventsCollector(events))


class _EventsCollector(Collector):
    def __init__(self, state: Callable[[], NormaliserState | None]) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        events = (self._state() or empty_state())["events"].values()
        pending = GaugeMetricFamily(
            "se_bridge_events_pending",
            "Events in the last Scheduled Events document, this VM's and its neighbours'.",
        )
        pending.add_metric([], len(events))
        starts = [
            moment.timestamp()
            for event in events
            if event["AffectsThisVm"]
            and event["EventStatus"] == "Scheduled"
            and (moment := parse_time(event["NotBefore"])) is not None
        ]
        upcoming = GaugeMetricFamily(
            "se_bridge_next_event_start_timestamp_seconds",
            "The earliest NotBefore (Unix time) of a Scheduled event that affects this VM; no "
            "sample when none is scheduled: `... - time()` is how long until it may start.",
        )
        if starts:
            upcoming.add_metric([], min(starts))
        yield from (pending, upcoming)


class _OutboxCollector(Collector):
    def __init__(self, spool: Spool, status: Callable[[], Mapping[str, Mapping[str, Any]]]) -> None:
        self._spool, self._status = spool, status

    def collect(self) -> Iterator[Metric]:
        held = GaugeMetricFamily("se_bridge_spool_records", "Records held in the spool.")
        held.add_metric([], self._spool.depth())
        shed = CounterMetricFamily(
            "se_bridge_spool_shed_records", "Records dropped at the spool's bound (lost)."
        )
        shed.add_metric([], self._spool.dropped())
        waiting = GaugeMetricFamily(
            "se_bridge_spool_waiting_records", "Records a sink has yet to take.", labels=["sink"]
        )
        oldest = GaugeMetricFamily(
            "se_bridge_spool_oldest_waiting_age_seconds",
            "Age of the oldest record a sink has yet to take (0 when none).",
            labels=["sink"],
        )
        failures = CounterMetricFamily(
            "se_bridge_delivery_failures",
            "Failed deliveries, by sink and kind (retryable, permanent, unexpected, spool).",
            labels=["sink", "kind"],
        )
        dead = CounterMetricFamily(
            "se_bridge_dead_letters", "Records a sink rejected, kept aside.", labels=["sink"]
        )
        now = time.time()
        statuses = self._status()
        labels = sink_labels(list(statuses))
        for sink, status in statuses.items():
            label = labels[sink]
            waiting.add_metric([label], status.get("backlog", 0))
            oldest.add_metric([label], _age(self._spool.oldest_waiting(sink), now))
            for kind, count in (status.get("failures_by_kind") or {}).items():
                failures.add_metric([label, kind], count)
            dead.add_metric([label], status.get("dead_lettered", 0))
        yield from (held, shed, waiting, oldest, failures, dead)


def sink_labels(names: list[str]) -> dict[str, str]:
    """The `sink` label of each sink name: its kind (jsonl, hub, stdout, eventhubs,
    loganalytics), never its file or directory, which is long and says where the records
    are; a second sink of one kind is `jsonl-2`, a third `jsonl-3`, in the configured order."""
    labels: dict[str, str] = {}
    seen: dict[str, int] = {}
    for name in names:
        kind = name.partition(":")[0]
        seen[kind] = seen.get(kind, 0) + 1
        labels[name] = kind if seen[kind] == 1 else f"{kind}-{seen[kind]}"
    return labels


def _age(body: str | None, now: float) -> float:
    try:
        moment = parse_time(json.loads(body).get("TimeGenerated")) if body else None
    except (ValueError, AttributeError):  # not a JSON object: the spool holds only records
        moment = None
    return 0.0 if moment is None else max(0.0, now - moment.timestamp())
