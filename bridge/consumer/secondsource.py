"""The consumer's second source (issue 36, docs/second-source.md): Event Grid deliveries of the
scheduled-events and resource-health system topics, read from their event hub, turned into
the consumer's records (bridge.consumer.sources.eventgrid) and folded in beside the agents'.

Each refusal is counted by its code and logged once per delivery with what to check, and
changes nothing: a refused delivery cannot end an event, so it can never free a slot
early. Where the agents and Event Grid tell one event differently, each field that differs
is counted once per event (`Consumer.disagreements`, by field) and said in `policy explain`.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bridge import recordtypes as rt
from bridge.cloud import identity
from bridge.config import Config
from bridge.consumer import documents as fs
from bridge.consumer.core import Consumer
from bridge.consumer.guard import Failures, Guard
from bridge.consumer.reading import Position
from bridge.consumer.sources.eventgrid import HealthChange, Parsed, Trust, describe, parse
from bridge.consumer.sources.resourcegraph import Reconciler, RequestsTransport, ResourceGraph
from bridge.records import RecordView, utc_now
from bridge.redact import redact

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EventGridCounts:
    """What the intake has done so far (the metrics ask at each scrape)."""

    events: int
    health: int
    ignored: int
    refused: Mapping[str, int]
    disagreements: Mapping[str, int]


class EventGridIntake:
    """Hands Event Grid deliveries to `consumer`, refusing what `trust` does not cover."""

    def __init__(
        self,
        consumer: Consumer,
        trust: Trust,
        emit: Callable[[Sequence[RecordView]], None] | None = None,
        failures: Failures | None = None,
    ) -> None:
        """`emit`: where the Event records made of deliveries go besides the fold (the
        consumer's own sinks, so Log Analytics holds both sources' records in one table).
        `failures`: where the metric finds the messages the parser failed on."""
        self.consumer, self.trust, self._emit = consumer, trust, emit
        # A message the parser fails on (a bug) is set aside, the rest of its batch goes on.
        self.guard = Guard("eventgrid_parse", log, failures)
        self.refused: Counter[str] = Counter()  # by refusal code
        self.ignored = 0  # AKS events, health annotations, whole scale sets' health
        self.events = 0  # Event records folded in
        self.health = 0  # health changes folded in
        self.runs = 0  # patch runs' pre- and post-maintenance events taken
        # The hub's reader and the Resource Graph reconciler count from their own threads.
        self._counting = threading.Lock()

    def counts(self) -> EventGridCounts:
        with self._counting:
            return EventGridCounts(
                self.events,
                self.health,
                self.ignored,
                dict(self.refused),
                dict(self.consumer.disagreements),
            )

    def handle(self, bodies: Sequence[str], position: Position | None = None) -> None:
        """Fold the deliveries `bodies` in (a batch of one partition of the hub, `position`)."""
        taken = self.take(bodies)
        self.fold([*taken.events, *taken.advisories], taken.health, position)
        if taken.runs and self.consumer.patch_runs is not None:
            self.consumer.patch_runs.take(taken.runs)  # Update Manager's (issue 40)
            with self._counting:
                self.runs += len(taken.runs)

    def take(self, bodies: Sequence[str], what: str = "an Event Grid delivery") -> Parsed:
        """What `bodies` hold that may be folded in, each refusal counted and logged: the
        deliveries of the hub, or the Resource Graph reconciler's rows (`what` one is)."""
        taken = Parsed()
        lost = 0
        for body in bodies:
            try:
                parsed = parse(body, self.trust)
            except Exception as err:  # one message never keeps the others of its batch out
                lost += 1
                self.guard.failed(
                    err,
                    f"reading {what}",
                    "it was set aside, nothing of it folded in, and the rest of its batch "
                    "goes on; report this line with its traceback (it begins "
                    f"{redact(body[:300])!r})",
                )
                continue
            if parsed.refused:
                with self._counting:
                    self.refused.update(r.code for r in parsed.refused)
                log.warning(
                    "refused %s: %s; nothing of it was folded in (check "
                    "eventgrid.subscriptions and eventgrid.resource_groups, and who may "
                    "send to the hub)",
                    what,
                    describe(parsed.refused),
                )
            with self._counting:
                self.ignored += len(parsed.ignored)
            taken.events += parsed.events
            taken.advisories += parsed.advisories
            taken.health += parsed.health
            taken.runs += parsed.runs
        if bodies and not lost:
            self.guard.succeeded(f"reading {what}")
        return taken

    def fold(
        self,
        events: Sequence[rt.Event | rt.Advisory],
        health: Sequence[HealthChange],
        position: Position | None = None,
    ) -> None:
        """Fold checked Event records and health changes in, the records also to `emit`."""
        if events or (position is not None and position.caught_up is not None):
            self.consumer.process(list(events), position)
        if events and self._emit is not None:
            self._emit(events)
        with self._counting:
            self.events += len(events)
        if health:
            self.consumer.note_health(health)
            with self._counting:
                self.health += len(health)


def intake_for(
    config: Config,
    consumer: Consumer,
    emit: Callable[[Sequence[RecordView]], None] | None = None,
    failures: Failures | None = None,
) -> EventGridIntake | None:
    """The intake of `consumer` when eventgrid.enabled, trusting what [eventgrid] names;
    None when it is off. `se-bridge consume` and the Azure Functions app both build it here,
    so a delivery is refused or taken alike whichever of them reads the hub."""
    if not config.eventgrid.enabled:
        return None
    return EventGridIntake(
        consumer, Trust.of(config.eventgrid, config.patchruns.enabled), emit, failures
    )


class FleetKnown:
    """The fleet state as the Resource Graph reconciler compares its rows with it."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer

    def events(self, event_ids: Sequence[str]) -> dict[str, Mapping[str, Any]]:
        keys = sorted({fs.event_key(e) for e in event_ids})
        return {key: doc.value for key, doc in self.consumer.fleet.events_of(keys).items()}

    def health(self) -> dict[str, Mapping[str, Any]]:
        docs = self.consumer.fleet.vms.health()
        return {str(d.value.get("resource_id", "")).lower(): d.value for d in docs}


def build_reconciler(
    config: Config, intake: EventGridIntake, failures: Failures | None = None
) -> Reconciler:
    """The Resource Graph reconciler of eventgrid.reconcile_interval, as the consumer's
    identity (azure-identity), feeding `intake`; its failures counted in `failures`."""
    graph = ResourceGraph(
        config.eventgrid.resource_graph_url,
        identity.credential(config.identity),
        RequestsTransport(),
    )
    return Reconciler(graph, intake, FleetKnown(intake.consumer), utc_now, failures)
