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
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from bridge.consumer.core import Consumer
from bridge.consumer.reading import Position
from bridge.consumer.sources.eventgrid import Trust, describe, parse
from bridge.records import RecordView

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
    ) -> None:
        """`emit`: where the Event records made of deliveries go besides the fold (the
        consumer's own sinks, so Log Analytics holds both sources' records in one table)."""
        self.consumer, self.trust, self._emit = consumer, trust, emit
        self.refused: Counter[str] = Counter()  # by refusal code
        self.ignored = 0  # AKS events, health annotations, whole scale sets' health
        self.events = 0  # Event records folded in
        self.health = 0  # health changes folded in

    def counts(self) -> EventGridCounts:
        return EventGridCounts(self.events, self.health, self.ignored, dict(self.refused),
                               dict(self.consumer.disagreements))  # fmt: skip

    def handle(self, bodies: Sequence[str], position: Position | None = None) -> None:
        """Fold the deliveries `bodies` in (a batch of one partition of the hub, `position`)."""
        events, health = [], []
        for body in bodies:
            parsed = parse(body, self.trust)
            if parsed.refused:
                self.refused.update(r.code for r in parsed.refused)
                log.warning("refused an Event Grid delivery: %s; nothing of it was folded in "
                            "(check eventgrid.subscriptions and eventgrid.resource_groups, and "
                            "who may send to the hub)", describe(parsed.refused))  # fmt: skip
            self.ignored += len(parsed.ignored)
            events += parsed.events
            health += parsed.health
        if events or (position is not None and position.caught_up is not None):
            self.consumer.process(events, position)
        if events and self._emit is not None:
            self._emit(events)
        self.events += len(events)
        if health:
            self.consumer.note_health(health)
            self.health += len(health)
