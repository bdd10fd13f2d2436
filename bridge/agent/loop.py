"""The agent: poll IMDS, normalise, spool (records and state in one transaction), deliver, hook.

Threads: this loop (polling, heartbeats, instance metadata), one delivery worker per
sink, and the hook workers. Only this loop produces Event records, so their order in
the spool is the order they were observed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime, timedelta
from typing import Any, TypeVar

from bridge import host, telemetry
from bridge.agent import imds, listener, localmode
from bridge.agent.approver import Approver
from bridge.agent.hookproc import HookOutcome
from bridge.agent.hooks import HookJob, HookRunner, hook_record, plan
from bridge.agent.metrics import AgentMetrics
from bridge.agent.normalise import (
    Context,
    NormaliserState,
    empty_state,
    normalise,
    pending_events,
    restore,
)
from bridge.channels import CommandInbox
from bridge.config import Config
from bridge.outbox.delivery import Delivery
from bridge.outbox.spool import SPOOL_ERRORS, Spool, SpoolError, StateKey
from bridge.policy.model import Policy
from bridge.records import Health, Origin, VmIdentity, heartbeat_record, iso, utc_now
from bridge.retry import Backoff, DeliveryError, FailureStreak, PermanentError, RetryableError
from bridge.sinks import Sink, build

log = logging.getLogger(__name__)
CHECKPOINT_SECONDS = 30.0  # how stale the saved "last observed" time may get
IDENTITY_RETRY_SECONDS = 60.0
MAX_POLL_BACKOFF = 5.0  # a Preempt may give only 30 s of notice: never back off long
STOP_CHECK_SECONDS = 0.1
IDENTITY_WAIT_MARGIN = 30.0
STALL_WAIT = 1.0  # how long a cycle waits for a poll's answer before its housekeeping
T = TypeVar("T")


class Agent:
    def __init__(
        self,
        config: Config,
        *,
        client: imds.ImdsClient | None = None,
        sinks: Sequence[Sink] | None = None,
        now: Callable[[], datetime] = utc_now,
        boot_id: str | None = None,
        policy: Policy | None = None,
        open_inbox: Callable[[str], CommandInbox] | None = None,
        delivery_backoff: Callable[[], Backoff] = Backoff,
    ) -> None:
        self.config = config
        self._now = now
        self._boot_id = boot_id if boot_id is not None else host.boot_id()
        self.imds = client or _client(config)
        # Approvals have their own connection and thread: one never waits behind a poll that
        # IMDS is slow to answer (each is bounded by its own deadline).
        self.approval_imds = client or _client(config, limiter=self.imds.limiter)
        self.sinks = (
            list(sinks) if sinks is not None else [build(s, config) for s in config.sink_specs()]
        )
        self.spool = Spool(
            config.agent.state_dir / "spool.db",
            [sink.name for sink in self.sinks],
            max_records=config.spool.max_records,
            max_bytes=config.spool.max_bytes,
        )
        self.delivery = Delivery(self.spool, self.sinks, backoff_factory=delivery_backoff)
        self.hooks = self._hook_runner()
        saved = VmIdentity.from_state(self.spool.load_state(StateKey.IDENTITY))
        self.origin = Origin(self._named(saved), host.host_name())
        self.state, dropped = restore(self.spool.load_state(StateKey.NORMALISER))
        for problem in dropped:
            log.warning("%s (in the spool %s)", problem, self.spool.path)
        self._poll = _PollHealth()
        self.metrics = AgentMetrics(telemetry.new_registry())
        self.metrics.watch(self.spool, self.delivery.status, lambda: self.state)
        self._telemetry: telemetry.Endpoint | None = None
        self._notifier = telemetry.Notifier()
        self._last_turn = time.monotonic()
        self._started_at: str | None = None  # the Start heartbeat's TimeGenerated
        self._last_body: bytes | None = None
        self._last_commit = 0.0
        self._waiting_jobs: list[HookJob] = []
        self._next_heartbeat = 0.0
        self._next_identity = 0.0
        self._identity_warned = False
        self._warned: set[str] = set()
        self._spool_failing = False
        self._stop = threading.Event()
        self._run = uuid.uuid4().hex  # this process, in heartbeat ids
        self._imds_thread = _Worker("imds")
        self._pending: Future[bytes] | None = None  # a poll IMDS has not answered yet
        self._approval_thread = _Worker("imds approvals")
        # Central commands and the local policy approve through one Approver, so an event
        # approved by either is never approved again by the other.
        self.approver = Approver(
            self.approval_imds,
            lambda call: self._interruptible(call, self._approval_thread),
            self.spool,
            lambda: self.origin,
            now,
            on_record=self.metrics.approval,
        )
        self.listener = listener.build(config, self.approver, now, open_inbox)
        self.local = localmode.build(config, self.approver, now, policy)

    # --- lifecycle ------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> int:
        """Poll until `stop` is set, then flush and return 0."""
        self._stop = stop
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
        limit = timedelta(seconds=max(10.0, 3 * self.config.agent.poll_interval
                                      + self.config.imds.timeout))  # fmt: skip
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
        self._resume_hooks()
        # Ready before instance metadata, which may take imds.first_call_timeout (2 min) to
        # answer after IMDS idled, longer than systemd's default start timeout (90 s): the
        # agent is up, records carry null VM fields until it answers, and STATUS= says why.
        self._notifier.ready(
            f"waiting for instance metadata (up to {self.config.imds.first_call_timeout:g} s)"
        )
        self._refresh_identity()
        self._heartbeat("Start")
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
        if started >= self._next_identity and self._pending is None:
            self._refresh_identity()  # not while a poll is stalled: it would queue behind it
        if started >= self._next_heartbeat:
            self._heartbeat("Periodic")
        self._resubmit_hooks()
        if self.local is not None:
            self.local.tick(self.state, self.origin)
        return max(0.0, delay - (time.monotonic() - started))

    def shutdown(self) -> None:
        log.info("stopping: flushing the spool to every sink")
        if self.hooks is not None:
            self.hooks.stop(timeout=10.0)
        if self.listener is not None:
            self.listener.stop()
        self._heartbeat("Stop")
        if not self.delivery.flush(timeout=10.0):
            log.warning("stopped with %d records not yet delivered; they stay in the spool "
                        "and are sent at the next start", self.spool.depth())  # fmt: skip
        self.delivery.stop(timeout=5.0)
        self.spool.close()
        self._imds_thread.stop()
        self._approval_thread.stop()
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
            self._pending = self._imds_thread.submit(self.imds.scheduled_events)
        try:
            body = self._result(self._pending, max(STALL_WAIT, self.config.agent.poll_interval))
        except FutureTimeout:
            return 0.0  # still waiting for IMDS
        except DeliveryError as err:
            self._pending = None
            self.metrics.polled(err)
            return self._poll.failed(err, self.config.agent.poll_interval)
        self._pending = None
        now = self._now()
        first = self._poll.last_success is None
        self._poll.succeeded(now)
        if first:
            self._first_answer(now)
        self.metrics.polled(None, now)
        checkpoint_due = time.monotonic() - self._last_commit >= CHECKPOINT_SECONDS
        if body != self._last_body or checkpoint_due:
            self._last_body = body
            self._observe(body)
        return self.config.agent.poll_interval

    def _result(self, future: Future[T], seconds: float = math.inf, alive_for: float = 0) -> T:
        """`future`'s result; FutureTimeout when it is not ready within `seconds`, and
        RetryableError if the agent is told to stop meanwhile. For the first `alive_for`
        seconds of the wait systemd's watchdog hears that the loop is alive."""
        started = time.monotonic()
        while True:
            try:
                return future.result(timeout=STOP_CHECK_SECONDS)
            except FutureTimeout:
                if self._stop.is_set():
                    raise RetryableError("stopping before IMDS answered") from None
                waited = time.monotonic() - started
                if waited >= seconds:
                    raise
                if waited < alive_for:
                    self._notifier.watchdog()

    def _interruptible(self, call: Callable[[], T], worker: _Worker | None = None) -> T:
        """`call()` on an IMDS thread (the poll's unless told), abandoned (RetryableError) if
        the agent is told to stop."""
        return self._result((worker or self._imds_thread).submit(call))

    def _observe(self, body: bytes) -> None:
        try:
            raw = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than JSON allows
            self._problem("not json", f"IMDS sent a body that is not JSON; skipped: "
                          f"{imds.excerpt(body)!r}")  # fmt: skip
            return
        ctx = Context(self._now(), self.origin, self._boot_id, self._gap())
        result = normalise(self.state, raw, ctx)
        for problem in result.problems:
            self._problem(problem.partition(":")[0], problem)
        if not result.problems:
            self._warned.clear()  # a clean document ends every streak
        self._commit(result.records, result.state)

    def _commit(self, records: list[dict[str, Any]], state: NormaliserState) -> None:
        jobs = self._plan_hooks(records)
        try:
            self.spool.commit(
                records,
                state={StateKey.NORMALISER: state},
                jobs=[(job.job_id, job.to_payload()) for job in jobs],
            )
        except SPOOL_ERRORS as err:
            # The state did not advance either, so the next poll observes the same change
            # again and makes the same records, with the same RecordIds.
            self._last_body = None
            if not self._spool_failing:
                log.error("cannot write %d records to the spool %s: %s; trying again at every "
                          "poll", len(records), self.spool.path, err)  # fmt: skip
                self._spool_failing = True
            return
        if self._spool_failing:
            log.warning("the spool %s accepts records again", self.spool.path)
            self._spool_failing = False
        self.metrics.made(records)
        self.state = state
        self._last_commit = time.monotonic()
        for record in records:
            log.info("%s", describe(record))
        for job in jobs:
            self._submit(job)
        self._notify_approvers()

    def _notify_approvers(self) -> None:
        """After each observation: wake the command listener, let local mode decide."""
        self.approver.observe(self.state)
        if self.listener is not None:
            scheduled, affects = listener.scheduled_here(self.state)
            own = listener.own_events(self.state)
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
        # Its first answer may take imds.first_call_timeout, more than WatchdogSec (60 s):
        # waiting for a call that ends by its own deadline is no stuck loop. Past that deadline
        # (and a margin for the connection and the rate limiter) the watchdog hears nothing.
        call = self._imds_thread.submit(self.imds.instance_metadata)
        alive_for = self.config.imds.first_call_timeout + IDENTITY_WAIT_MARGIN
        try:
            answer = self._result(call, alive_for=alive_for)
            identity = imds.parse_instance(answer)
        except DeliveryError as err:
            self._identity_failed(err)
            return
        if not identity.known:
            # JSON, but not this VM's metadata (no vmId): never trade a known identity for it.
            self._identity_failed(RetryableError("the answer holds no compute.vmId that is a GUID"))
            return
        self._next_identity = time.monotonic() + self.config.imds.instance_refresh
        identity = self._named(identity)
        if identity != self.origin.identity:
            log.info("this VM is %s (%s)", identity.vm_name, identity.vm_id)
            self.origin = Origin(identity, self.origin.host_name)
            self._last_body = None  # AffectsThisVm depends on the name: look again
            self._save_identity(identity)
        self._identity_warned = False

    def _named(self, identity: VmIdentity) -> VmIdentity:
        """`identity`, with agent.vm_name where instance metadata gave no name."""
        configured = self.config.agent.vm_name
        if identity.vm_name or not configured:
            return identity
        return dataclasses.replace(identity, vm_name=configured)

    def _save_identity(self, identity: VmIdentity) -> None:
        try:
            # Kept so a restart while instance metadata fails still labels records with the
            # VM: an event's end with VmId null would be lost to the consumer, and hold its
            # budget.
            self.spool.commit([], state={StateKey.IDENTITY: identity.to_state()})
        except SpoolError as err:  # kept in memory; saved again when it next changes
            log.warning("cannot save this VM's identity in the spool (%s)", err)

    def _identity_failed(self, err: DeliveryError) -> None:
        self._next_identity = time.monotonic() + IDENTITY_RETRY_SECONDS
        if not self._identity_warned and not self._stop.is_set():
            known = self.origin.identity
            carry = (f"the identity last seen ({known.vm_name}, {known.vm_id})" if known.known
                     else "null VM fields")  # fmt: skip
            log.warning(
                "instance metadata is unavailable (%s); records carry %s until it answers; "
                "retrying every %gs%s", err, carry, IDENTITY_RETRY_SECONDS, self._unnamed(),
            )  # fmt: skip
            self._identity_warned = True

    def _unnamed(self) -> str:
        """What a person should know while this VM has no name to match Resources with."""
        if self.origin.identity.vm_name:
            return ""
        return (f". Without a VM name, an event whose Resources names this host "
                f"({self.origin.host_name}) counts as this VM's and any other stays unknown "
                "(AffectsThisVm null): set agent.vm_name to this VM's name as Scheduled "
                "Events lists it")  # fmt: skip

    # --- heartbeats ----------------------------------------------------------------------

    def _heartbeat(self, reason: str) -> None:
        self._next_heartbeat = time.monotonic() + self.config.agent.heartbeat_interval
        state = self.state or empty_state()
        health = Health(
            incarnation=state["incarnation"],
            pending_events=pending_events(state),
            spool_depth=self.spool.depth(),
            spool_dropped=self.spool.dropped(),
            imds_healthy=self._poll.healthy,
            last_imds_success=self._poll.last_success,
            prepare_hook=self.config.hooks.prepare is not None,
        )
        try:
            beat = heartbeat_record(self.origin, reason, health, self._now(), run=self._run)
            # What `se-bridge status` reads: the heartbeat leaves the spool once delivered.
            if reason == "Start" or self._started_at is None:
                self._started_at = beat["TimeGenerated"]
            seen: dict[str, Any] = {
                "at": beat["TimeGenerated"],
                "started_at": self._started_at,
                "reason": reason,
                "imds_healthy": beat["ImdsHealthy"],
                "last_imds_success": beat["LastImdsSuccess"],
                "heartbeat_interval": self.config.agent.heartbeat_interval,
            }
            self.spool.commit([beat], state={StateKey.HEALTH: seen})
            self.metrics.made([beat])
        except SPOOL_ERRORS as err:
            log.warning("heartbeat not written to the spool %s: %s", self.spool.path, err)

    def _first_answer(self, now: datetime) -> None:
        """The Start heartbeat comes before the first poll: tell `se-bridge status` that IMDS
        answered now, not at the next heartbeat minutes later."""
        seen = self.spool.load_state(StateKey.HEALTH)
        if seen is None or seen.get("started_at") != self._started_at:
            return
        seen.update(imds_healthy=True, last_imds_success=iso(now))
        try:
            self.spool.commit([], state={StateKey.HEALTH: seen})
        except SPOOL_ERRORS as err:
            log.warning("IMDS health not written to the spool %s: %s", self.spool.path, err)

    # --- hooks ---------------------------------------------------------------------------

    def _hook_runner(self) -> HookRunner | None:
        hooks = self.config.hooks
        if hooks.prepare is None and hooks.recover is None:
            return None
        return HookRunner(
            prepare=hooks.prepare,
            recover=hooks.recover,
            timeout=hooks.timeout,
            max_concurrent=hooks.max_concurrent,
            on_done=self._hook_done,
            environment=hooks.environment,
        )

    def _plan_hooks(self, records: list[dict[str, Any]]) -> list[HookJob]:
        hooks = self.config.hooks
        if self.hooks is None:
            return []
        return plan(records, prepare=hooks.prepare is not None, recover=hooks.recover is not None)

    def _hook_done(self, job: HookJob, outcome: HookOutcome) -> None:
        self.metrics.hook(job.phase, "timeout" if outcome.timed_out else "ok" if outcome.ok
                          else "failed")  # fmt: skip
        if self.local is not None:
            self.local.hook_done(job.event_id, job.phase, outcome.ok)
        record = hook_record(self.origin, job, outcome, self._now())
        try:
            self.spool.finish_job(job.job_id, [record])
            self.metrics.made([record])
        except SPOOL_ERRORS as err:
            log.error("the outcome of the %s hook for event %s could not be saved (%s); the "
                      "hook stays due and runs again at the next start", job.phase,
                      job.event_id, err)  # fmt: skip

    def _submit(self, job: HookJob) -> None:
        if self.hooks is not None and not self.hooks.submit(job):
            self._waiting_jobs.append(job)

    def _resubmit_hooks(self) -> None:
        waiting, self._waiting_jobs = self._waiting_jobs, []
        for job in waiting:
            self._submit(job)

    def _resume_hooks(self) -> None:
        """Hooks that were due when the agent last stopped run now: hooks are at-least-once."""
        for _job_id, payload in self.spool.pending_jobs():
            if self.hooks is not None:
                self._submit(HookJob.from_payload(payload))


class _Worker:
    """One daemon thread running calls in turn.

    IMDS calls run here so a stop signal never waits for a slow answer (the first may take
    two minutes). Daemon, unlike a ThreadPoolExecutor's workers, so an abandoned call
    cannot hold the process at exit.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def submit(self, call: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._calls.put((call, future))
        return future

    def stop(self) -> None:
        self._calls.put(None)

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            call, future = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as err:  # handed to the caller, who decides
                    future.set_exception(err)


class _PollHealth:
    """Whether IMDS answers, and how long to wait after it did not."""

    def __init__(self) -> None:
        self.healthy = False
        self.last_success: datetime | None = None
        self._streak = FailureStreak(Backoff(initial=0.5, maximum=MAX_POLL_BACKOFF))

    def succeeded(self, now: datetime) -> None:
        if ended := self._streak.succeeded():
            log.info("IMDS answers again after %d failed polls", ended)
        self.healthy, self.last_success = True, now

    def failed(self, err: DeliveryError, interval: float) -> float:
        self.healthy = False
        first, delay = self._streak.failed(err)
        if first:
            level = logging.ERROR if isinstance(err, PermanentError) else logging.WARNING
            log.log(level, "cannot read scheduled events: %s; retrying with backoff", err)
        return max(interval, delay)


def describe(record: dict[str, Any]) -> str:
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


SHOWN_RESOURCES = 20  # a log line is for a person: a scale set's 1,000 names are not


def _some(names: list[str]) -> str:
    shown = ", ".join(imds.excerpt(str(n), 64) for n in names[:SHOWN_RESOURCES])
    return shown if len(names) <= SHOWN_RESOURCES else f"{shown}, ... ({len(names)} in all)"


def _client(config: Config, limiter: imds.RateLimiter | None = None) -> imds.ImdsClient:
    settings = config.imds
    return imds.ImdsClient(
        settings.url,
        settings.api_version,
        timeout=settings.timeout,
        first_call_timeout=settings.first_call_timeout,
        max_rps=settings.max_requests_per_second,
        limiter=limiter,
    )
