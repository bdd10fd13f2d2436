"""The agent's health: whether IMDS answers its polls, and the Heartbeat records that say so.

A heartbeat goes to the spool at start (Start), every agent.heartbeat_interval (Periodic),
at stop (Stop), and when what it says of the Kubernetes node changes (Node), with what
`se-bridge status` reads kept in the spool's state beside it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from bridge import recordtypes as rt
from bridge.agent.metrics import AgentMetrics
from bridge.agent.normalise import NormaliserState, empty_state, pending_events
from bridge.outbox.spool import SPOOL_ERRORS, Spool, StateKey
from bridge.records import Health, NodeHealth, Origin, heartbeat_record, iso
from bridge.redact import describe
from bridge.retry import Backoff, DeliveryError, FailureStreak, PermanentError

# The poll loop's lines, whichever of its collaborators says them.
log = logging.getLogger("bridge.agent.loop")
MAX_POLL_BACKOFF = 5.0  # a Preempt may give only 30 s of notice: never back off long


class PollHealth:
    """Whether IMDS (at `address`, the imds.url setting) answers, its last error, and how long
    to wait after it did not."""

    def __init__(self, address: str = "") -> None:
        self.address = address
        self.healthy = False
        self.last_success: datetime | None = None
        self.last_error: str | None = None
        self.last_error_at: datetime | None = None
        self.changed = False  # answering, or not, since the last poll: news for status
        self._streak = FailureStreak(Backoff(initial=0.5, maximum=MAX_POLL_BACKOFF))

    def succeeded(self, now: datetime) -> None:
        if ended := self._streak.succeeded():
            log.info("IMDS answers again after %d failed polls", ended)
        self.changed = not self.healthy
        self.healthy, self.last_success = True, now

    def failed(self, err: DeliveryError, interval: float, now: datetime) -> float:
        self.healthy = False
        self.last_error, self.last_error_at = describe(err), now
        first, delay = self._streak.failed(err)
        self.changed = first
        if first:
            level = logging.ERROR if isinstance(err, PermanentError) else logging.WARNING
            log.log(level, "cannot read scheduled events: %s; retrying with backoff", err)
        return max(interval, delay)


class Heartbeats:
    """Heartbeat records, each with the health it reports kept for `se-bridge status`."""

    def __init__(
        self,
        spool: Spool,
        poll: PollHealth,
        metrics: AgentMetrics,
        now: Callable[[], datetime],
        *,
        interval: float,
        prepare_steps: tuple[str, ...],
        clock: Callable[[], float] = time.monotonic,
        node: Callable[[], NodeHealth | None] = lambda: None,
    ) -> None:
        self._spool, self._poll, self._metrics, self._now = spool, poll, metrics, now
        self._node = node  # [kubernetes] on: what the drains know of this VM's node
        self._interval, self._steps, self._clock = interval, prepare_steps, clock
        self._run = uuid.uuid4().hex  # this process, in heartbeat ids
        self._next = 0.0
        self._started_at: str | None = None  # the Start heartbeat's TimeGenerated

    def due(self, at: float) -> bool:
        """Whether the periodic heartbeat is due at `at` (the monotonic clock)."""
        return at >= self._next

    def beat(
        self, reason: rt.HeartbeatReason, origin: Origin, state: NormaliserState | None
    ) -> None:
        """A heartbeat (Start, Periodic, Stop, Node) to the spool; a WARNING when it cannot."""
        self._next = self._clock() + self._interval
        state = state or empty_state()
        health = Health(
            incarnation=state["incarnation"],
            pending_events=pending_events(state),
            spool_depth=self._spool.depth(),
            spool_dropped=self._spool.dropped(),
            imds_healthy=self._poll.healthy,
            last_imds_success=self._poll.last_success,
            prepare_hook=bool(self._steps),
            node=self._node(),
            prepare_steps=self._steps,
        )
        try:
            beat = heartbeat_record(origin, reason, health, self._now(), run=self._run)
            # What `se-bridge status` reads: the heartbeat leaves the spool once delivered.
            if reason == "Start" or self._started_at is None:
                self._started_at = beat["TimeGenerated"]
            seen: dict[str, Any] = {
                "at": beat["TimeGenerated"],
                "started_at": self._started_at,
                "reason": reason,
                **self._imds(),
                "heartbeat_interval": self._interval,
            }
            self._spool.commit([beat], state={StateKey.HEALTH: seen})
            self._metrics.made([beat])
        except SPOOL_ERRORS as err:
            log.warning("heartbeat not written to the spool %s: %s", self._spool.path, err)

    def _imds(self) -> dict[str, Any]:
        """What `se-bridge status` says of IMDS: where, whether it answers, when it last did,
        and its last error (kept after it answers again: the operator's clue)."""
        poll = self._poll
        error = poll.last_error
        return {
            "imds_url": poll.address,
            "imds_healthy": poll.healthy,
            "last_imds_success": iso(poll.last_success) if poll.last_success else None,
            "last_imds_error": None
            if error is None
            else {"at": iso(poll.last_error_at) if poll.last_error_at else None, "error": error},
        }

    def imds_news(self) -> None:
        """IMDS began or stopped answering: tell `se-bridge status` now, not at the next
        heartbeat minutes later (the Start heartbeat comes before the first poll)."""
        seen = self._spool.load_state(StateKey.HEALTH)
        if seen is None or seen.get("started_at") != self._started_at:
            return
        seen.update(self._imds())
        try:
            self._spool.commit([], state={StateKey.HEALTH: seen})
        except SPOOL_ERRORS as err:
            log.warning("IMDS health not written to the spool %s: %s", self._spool.path, err)
