"""The agent: poll IMDS, normalise, spool (records and state in one transaction), deliver, hook.

Threads: this loop (polling, heartbeats, instance metadata), one delivery worker per
sink, and the hook workers. Only this loop produces Event records, so their order in
the spool is the order they were observed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bridge import recordtypes as rt
from bridge import telemetry
from bridge.agent import advisory, imds, listener
from bridge.agent.approver import Approver
from bridge.agent.drains import DrainJobs
from bridge.agent.heartbeats import Heartbeats, PollHealth
from bridge.agent.imds import ImdsClient
from bridge.agent.imdscalls import ImdsCalls, Pending
from bridge.agent.instance import InstanceMetadata
from bridge.agent.listener import CommandListener
from bridge.agent.localmode import LocalApprover
from bridge.agent.metrics import AgentMetrics
from bridge.agent.normalise import Context, NormaliserState, normalise, restore
from bridge.agent.prepare import Preparation
from bridge.config import Config
from bridge.outbox.delivery import Delivery
from bridge.outbox.spool import SPOOL_ERRORS, Spool, StateKey
from bridge.records import Origin
from bridge.retry import DeliveryError
from bridge.sinks import Sink

log = logging.getLogger(__name__)
CHECKPOINT_SECONDS = 30.0  # how stale the saved "last observed" time may get
IDENTITY_WAIT_MARGIN = 30.0
STALL_WAIT = 1.0  # how long a cycle waits for a poll's answer before its housekeeping
# Waiting for instance metadata longer than this, the agent says so and writes heartbeats
# (the Start one first) while it waits: a restarted agent is never silent (issue 37).
QUIET_LIMIT = 5.0


@dataclass(frozen=True)
class Parts:
    """What an agent is made of, built by bridge.agent.wiring.build_agent."""

    imds: ImdsClient  # the poll's and instance metadata's connection
    approval_imds: ImdsClient  # the approvals' own (the same client, when a test gives one)
    calls: ImdsCalls
    spool: Spool
    sinks: Sequence[Sink]
    delivery: Delivery
    metrics: AgentMetrics
    notifier: telemetry.SystemdNotifier
    poll: PollHealth
    instance: InstanceMetadata
    heartbeats: Heartbeats
    prepare: Preparation  # the prepare step: the drain, the hook, both, or none
    approver: Approver
    listener: CommandListener | None
    local: LocalApprover | None
    drains: DrainJobs | None = None  # [kubernetes] on: the drain step, which names the node


class Agent:
    """The poll loop over the parts bridge.agent.wiring.build_agent makes; it builds none."""

    def __init__(
        self, config: Config, parts: Parts, *, now: Callable[[], datetime], boot_id: str | None
    ) -> None:
        self.config = config
        self._now, self._boot_id = now, boot_id
        self.imds, self.approval_imds = parts.imds, parts.approval_imds
        self.sinks, self.spool, self.delivery = list(parts.sinks), parts.spool, parts.delivery
        self.metrics, self._notifier, self._calls = parts.metrics, parts.notifier, parts.calls
        self._poll, self._instance, self._heartbeats = parts.poll, parts.instance, parts.heartbeats
        self.prepare, self.approver = parts.prepare, parts.approver
        # Central commands and the local policy approve through the one Approver, so an event
        # approved by either is never approved again by the other.
        self.listener, self.local = parts.listener, parts.local
        self.drains = parts.drains
        self.state, dropped = restore(self.spool.load_state(StateKey.NORMALISER))
        # Spot rebalance recommendations seen (agent.spot_rebalance), and whether IMDS serves
        # the api-version that lists them: it is a preview, so not everywhere.
        self.advice = advisory.restore(self.spool.load_state(StateKey.ADVISORIES))
        self._rebalance_served = True
        for problem in dropped:
            log.warning("%s (in the spool %s)", problem, self.spool.path)
        self.metrics.watch(self.spool, self.delivery.status, lambda: self.state)
        self._telemetry: telemetry.Endpoint | None = None
        self._last_turn = time.monotonic()
        self._last_body: bytes | None = None
        self._last_commit = 0.0
        self._warned: set[str] = set()
        self._spool_failing = False
        self._pending: Pending[bytes] | None = None  # a poll IMDS has not answered yet
        self._started = False  # the Start heartbeat is written

    @property
    def origin(self) -> Origin:
        """What labels this agent's records: this VM's identity and host name."""
        return self._instance.origin

    # --- lifecycle ------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> int:
        """Poll until `stop` is set, then flush and return 0."""
        self._calls.stop = stop
        self.start()
        while not stop.is_set():
            stop.wait(self._guarded_cycle())
        self._notifier.stopping()
        self.shutdown()
        return 0

    def serve_telemetry(self) -> None:
        """Listen on agent.metrics_address, when set (OSError when it cannot)."""
        address = self.config.agent.metrics_address
        if address:
            self._telemetry = telemetry.Endpoint(
                address, self.metrics.registry, live=self.live, ready=self.ready
            ).start()

    @property
    def telemetry_port(self) -> int | None:
        return None if self._telemetry is None else self._telemetry.port

    def live(self) -> tuple[bool, str]:
        """/healthz: the poll loop turns."""
        idle = time.monotonic() - self._last_turn
        limit = max(30.0, 10 * self.config.agent.poll_interval)
        if idle > limit:
            return False, f"the poll loop has not turned for {idle:.0f} s"
        return True, f"the poll loop turned {idle:.1f} s ago"

    def ready(self) -> tuple[bool, str]:
        """/readyz: IMDS answers, the spool takes records, no sink fails for good."""
        answered = self._poll.last_success
        # A few polls and one slow answer (imds.timeout): longer without one is not a hiccup.
        limit = timedelta(
            seconds=max(10.0, 3 * self.config.agent.poll_interval + self.config.imds.timeout)
        )
        if answered is None:
            return False, "IMDS has not answered since the agent started"
        if self._now() - answered > limit:
            return False, f"IMDS has not answered since {answered:%Y-%m-%dT%H:%M:%SZ}"
        if self._spool_failing:
            return False, f"the spool {self.spool.path} does not take records"
        failing = [n for n, s in self.delivery.status().items() if s.get("failing_permanently")]
        if failing:
            return False, f"sink {', '.join(failing)} fails for good: see the log"
        return True, "IMDS answers, the spool takes records and every sink delivers"

    def _guarded_cycle(self) -> float:
        # Past start-up the agent holds unsent data: a bug in one cycle must not end it.
        try:
            return self.cycle()
        except Exception:
            log.exception("unexpected error in the poll loop; polling again")
            return self.config.agent.poll_interval

    def start(self) -> None:
        self.delivery.start()
        self.prepare.start()
        self.prepare.resume()
        # Ready before instance metadata, which may take imds.first_call_timeout (2 min) to
        # answer after IMDS idled, longer than systemd's default start timeout (90 s): the
        # agent is up, records carry null VM fields until it answers, and STATUS= says why.
        self._notifier.ready(
            f"waiting for instance metadata (up to {self.config.imds.first_call_timeout:g} s)"
        )
        self._refresh_identity()
        if not self._started:
            self._beat()
        if self.listener is not None:
            self.listener.start()
        self._notify_approvers()
        self._notifier.status("running")
        log.info(
            "polling %s every %gs; sinks: %s",
            self.imds.events_url,
            self.config.agent.poll_interval,
            ", ".join(s.name for s in self.sinks),
        )

    def cycle(self) -> float:
        """One poll and whatever housekeeping is due; the seconds to wait before the next."""
        started = self._last_turn = time.monotonic()
        self._notifier.watchdog()
        delay = self._poll_events()
        if self._instance.due(started) and self._pending is None:
            self._refresh_identity()  # not while a poll is stalled: it would queue behind it
        if self._heartbeats.due(started):
            self._heartbeats.beat("Periodic", self.origin, self.state)
        self.prepare.resubmit()
        if self.drains is not None and self.drains.take_change():
            self._heartbeats.beat("Node", self.origin, self.state)
        if self.local is not None:
            self.local.tick(self.state, self.origin)
        return max(0.0, delay - (time.monotonic() - started))

    def shutdown(self) -> None:
        log.info("stopping: flushing the spool to every sink")
        self.prepare.stop(timeout=10.0)
        if self.listener is not None:
            self.listener.stop()
        self._heartbeats.beat("Stop", self.origin, self.state)
        if not self.delivery.flush(timeout=10.0):
            log.warning(
                "stopped with %d records not yet delivered; they stay in the spool "
                "and are sent at the next start",
                self.spool.depth(),
            )
        self.delivery.stop(timeout=5.0)
        self.spool.close()
        self._calls.close()
        self.imds.close()
        if self.approval_imds is not self.imds:
            self.approval_imds.close()
        if self._telemetry is not None:
            self._telemetry.close()

    # --- scheduled events -------------------------------------------------------------------

    def _poll_events(self) -> float:
        # A poll IMDS is slow to answer is waited for a while, then left running while the
        # loop does its housekeeping (heartbeats, hooks, local mode), and taken up again next
        # cycle; the request's own deadline ends it (imds.timeout).
        if self._pending is None:
            if self._rebalance_version():
                self._pending = self._calls.polls.submit(self._rebalance_poll)
            else:  # every other VM: the one request it always made, at imds.api_version
                self._pending = self._calls.polls.submit(self.imds.scheduled_events)
        try:
            wait = max(STALL_WAIT, self.config.agent.poll_interval)
            body = self._calls.result(self._pending, wait)
        except FutureTimeout:
            return 0.0  # still waiting for IMDS
        except DeliveryError as err:
            self._pending = None
            self.metrics.polled(err)
            delay = self._poll.failed(err, self.config.agent.poll_interval, self._now())
            if self._poll.changed:
                self._heartbeats.imds_news()
            return delay
        self._pending = None
        now = self._now()
        self._poll.succeeded(now)
        if self._poll.changed:
            self._heartbeats.imds_news()
        self.metrics.polled(None, now)
        checkpoint_due = time.monotonic() - self._last_commit >= CHECKPOINT_SECONDS
        if body != self._last_body or checkpoint_due:
            self._last_body = body
            self._observe(body)
        return self.config.agent.poll_interval

    def _rebalance_version(self) -> bool:
        """Whether this poll asks for api-version 2024-07-09: agent.spot_rebalance is on,
        instance metadata says this is a Spot VM, and IMDS has not said it does not serve it."""
        return self.config.agent.spot_rebalance and self._instance.spot and self._rebalance_served

    def _rebalance_poll(self) -> bytes:
        """The document at api-version 2024-07-09, which lists the ordinary events (Preempt
        among them) and the recommendations: one request, as every poll. Where IMDS does not
        serve it, the GA version at once, and for the rest of this run (on the poll's worker)."""
        try:
            return self.imds.scheduled_events(advisory.REBALANCE_API_VERSION)
        except imds.Refused as err:
            if not advisory.not_served(err.status):
                raise
            self._rebalance_served = False
            log.warning(
                "IMDS does not serve Scheduled Events api-version %s here (%s): Spot "
                "rebalance recommendations are not read until the agent restarts, and polls "
                "go to api-version %s; the preview needs the Microsoft.Compute/SpotPlus "
                "feature on the subscription",
                advisory.REBALANCE_API_VERSION,
                err,
                self.imds.api_version,
            )
            return self.imds.scheduled_events()

    def _observe(self, body: bytes) -> None:
        try:
            raw = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than JSON allows
            self._problem(
                "not json", f"IMDS sent a body that is not JSON; skipped: {imds.excerpt(body)!r}"
            )
            return
        ctx = Context(self._now(), self.origin, self._boot_id, self._gap())
        advice = None
        if self.config.agent.spot_rebalance:
            # Out before the normaliser sees the document: a recommendation is never an
            # Event record, so nothing approves it and no StartRequests names it.
            raw, found = advisory.split(raw)
            advice = advisory.advise(self.advice, found, self.origin, ctx.now)
        result = normalise(self.state, raw, ctx)
        problems = [*result.problems, *(advice.problems if advice else [])]
        for problem in problems:
            self._problem(problem.partition(":")[0], problem)
        if not problems:
            self._warned.clear()  # a clean document ends every streak
        self._commit(result.records, result.state, advice)

    def _commit(
        self,
        records: list[rt.Event],
        state: NormaliserState,
        advice: advisory.Advice | None = None,
    ) -> None:
        advisories = advice.records if advice is not None else []
        jobs = self.prepare.plan(records) + self.prepare.advise(advisories)
        saved = [(j.job_id, j.to_payload()) for j in jobs]
        states: dict[str, Mapping[str, Any]] = {StateKey.NORMALISER: state}
        if advice is not None:
            states[StateKey.ADVISORIES] = advice.state
        try:
            self.spool.commit([*records, *advisories], state=states, jobs=saved)
        except SPOOL_ERRORS as err:
            # The state did not advance either, so the next poll observes the same change
            # again and makes the same records, with the same RecordIds.
            self._last_body = None
            if not self._spool_failing:
                log.error(
                    "cannot write %d records to the spool %s: %s; trying again at every poll",
                    len(records),
                    self.spool.path,
                    err,
                )
                self._spool_failing = True
            return
        if self._spool_failing:
            log.warning("the spool %s accepts records again", self.spool.path)
            self._spool_failing = False
        self.metrics.made([*records, *advisories])
        self.state = state
        if advice is not None:
            self.advice = advice.state
        self._last_commit = time.monotonic()
        for record in records:
            log.info("%s", describe(record))
        for advised in advisories:
            log.info("%s", describe_advisory(advised))
        self._notify_approvers()
        # After the steps know the new events (IMDS's view): a drain looks whether its event
        # is still open.
        self.prepare.submit(jobs)

    def _notify_approvers(self) -> None:
        """After each observation: wake the command listener, let local mode decide."""
        advised: frozenset[str] = frozenset()
        if self.config.agent.spot_rebalance:
            advised = frozenset(
                k for k, v in self.advice.items() if v["AffectsThisVm"] is not False
            )
            self.approver.advised(advised)
            if self.drains is not None:
                self.drains.advised(advised)
        self.approver.observe(self.state)
        self.prepare.observe(self.state, polled=self._poll.last_success is not None)
        if self.listener is not None:
            scheduled, affects = listener.scheduled_here(self.state)
            own = listener.own_events(self.state)
            if advised:  # a drain's grant may come for one: the inbox is read as for an event
                scheduled, affects, own = True, True, own | advised
            self.listener.update(self.origin.identity.vm_id, scheduled, affects, own)
        if self.local is not None:
            self.local.observe(self.state, self.origin)

    def _gap(self) -> timedelta:
        return timedelta(seconds=max(3 * CHECKPOINT_SECONDS, 5 * self.config.agent.poll_interval))

    def _problem(self, kind: str, message: str) -> None:
        self.metrics.invalid_document()
        # Said once per kind until a clean document: a bad body every second is one line.
        if kind not in self._warned:
            log.warning("%s", message)
            self._warned.add(kind)

    # --- instance metadata ----------------------------------------------------------------

    def _refresh_identity(self) -> None:
        if self._instance.refresh(self._instance_metadata):
            self._last_body = None  # AffectsThisVm depends on the name: look again

    def _instance_metadata(self) -> dict[str, Any]:
        # Its first answer may take imds.first_call_timeout, more than WatchdogSec (60 s):
        # waiting for a call that ends by its own deadline is no stuck loop. Past that deadline
        # (and a margin for the connection and the rate limiter) the watchdog hears nothing.
        call = self._calls.polls.submit(self.imds.instance_metadata)
        alive_for = self.config.imds.first_call_timeout + IDENTITY_WAIT_MARGIN
        started = time.monotonic()
        said = False
        while True:
            waited = time.monotonic() - started
            try:
                return self._calls.result(call, 1.0, alive_for=max(0.0, alive_for - waited))
            except FutureTimeout:
                pass
            if not said and time.monotonic() - started >= QUIET_LIMIT:
                said = True
                log.info(
                    "waiting for instance metadata from %s, which may take up to %g s "
                    "(imds.first_call_timeout) after IMDS idled; heartbeats go on meanwhile",
                    self.config.imds.url,
                    self.config.imds.first_call_timeout,
                )
            if said:
                self._beat()

    def _beat(self) -> None:
        """The Start heartbeat once, then a Periodic one whenever it is due."""
        if not self._started:
            self._started = True
            self._heartbeats.beat("Start", self.origin, self.state)
        elif self._heartbeats.due(time.monotonic()):
            self._heartbeats.beat("Periodic", self.origin, self.state)


def describe(record: rt.Event) -> str:
    """One line a person reads in the agent's log for each Event record."""
    affects = {True: "affects this VM", False: "not this VM", None: "VM name unknown"}
    parts = [
        f"{record['EventType']} {record['EventId']} {record['Transition']}",
        "(inferred)" if record.get("Inferred") else "",
        f"NotBefore {record['NotBefore']}" if record.get("NotBefore") else "",
        f"changed {', '.join(record['ChangedFields'])}" if record.get("ChangedFields") else "",
        affects[record.get("AffectsThisVm")],
        f"resources {_some(record['Resources'])}" if record.get("Resources") else "",
    ]
    return "; ".join(p for p in parts if p)


def describe_advisory(record: rt.Advisory) -> str:
    """One line a person reads in the agent's log for each Advisory record."""
    if record["AdvisoryState"] == "Cleared":
        return f"Spot rebalance recommendation {record['EventId']} is gone from the document"
    whose = {True: "this VM", False: "another VM", None: "no VM named: taken as this VM's"}
    return (
        f"Spot rebalance recommendation {record['EventId']} ({whose[record['AffectsThisVm']]}): "
        "the eviction risk of this Spot VM rose; nothing is approved, a Preempt may follow"
    )


SHOWN_RESOURCES = 20  # a log line is for a person: a scale set's 1,000 names are not


def _some(names: list[str]) -> str:
    shown = ", ".join(imds.excerpt(str(n), 64) for n in names[:SHOWN_RESOURCES])
    return shown if len(names) <= SHOWN_RESOURCES else f"{shown}, ... ({len(names)} in all)"
