"""The drain of this VM's Kubernetes node as a prepare step, and its uncordon as the recover
step ([kubernetes], docs/kubernetes.md; the drain itself is bridge.kubernetes.drain).

When a drain starts: in local mode (and with no command channel) when an event that affects
this VM appears; under a central policy when a verified Prepare command grants it (the
Approver calls `grant`); a Spot Preempt at once, with no grant, on the fast path. When the
event Completes or is Canceled, or this VM leaves its Resources, the node is uncordoned (only
what a drain set). Each is a job saved in the spool with the Event records that call for it,
or with the grant, and dropped with its outcome's Hook record, so a drain or an uncordon a
restart interrupts runs again. Each job runs on a thread of its own: a drain that waits for
its deadline, or an API server that does not answer, holds up neither the poll loop nor
another event. At start, once IMDS has answered, marks of a drain whose event is no longer
open (a stray taint) are removed the same way.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, cast

from bridge import recordtypes as rt
from bridge.agent.advisory import REBALANCE_EVENT_TYPE
from bridge.agent.document import is_started
from bridge.agent.hooks import hook_fields, phase_for
from bridge.agent.metrics import AgentMetrics
from bridge.agent.normalise import NormaliserState
from bridge.agent.prepare import Book, Job, StepName
from bridge.config import KubernetesSettings
from bridge.kubernetes.api import KubeApi, KubeError, Node
from bridge.kubernetes.drain import Drainer, DrainSettings, Report, cordoned_by_others
from bridge.kubernetes.plan import Rules
from bridge.outbox.spool import SPOOL_ERRORS, Spool, StateKey
from bridge.records import NodeHealth, Origin, is_event, iso, parse_time, record_id
from bridge.retry import Backoff, FailureStreak

log = logging.getLogger(__name__)

KIND = "drain"  # a drain job's payload says so: the hook step leaves it alone
HOOK_NAME = "drain"
MAX_OUTPUT = 4096
WATCH_INTERVAL = 60.0  # seconds between looks at the node (its pool, someone else's cordon)
OUTCOMES = {"Drained": "drained", "GaveUp": "gave_up", "Failed": "failed"}


@dataclass(frozen=True)
class DrainJob:
    """A drain (prepare) or an uncordon (recover) of this node for one event."""

    job_id: str
    phase: rt.HookPhase
    event_id: str
    event_type: str | None
    not_before: str | None
    transition: rt.Transition | None  # None: an advisory's (bridge.agent.advisory)
    trigger: str  # TriggerRecordId: the Event record, or the Prepare command, that called for it
    after: str | None = None  # the drain is the first step: it waits for none
    earlier_ok: bool = True

    @classmethod
    def make(
        cls,
        phase: rt.HookPhase,
        event_id: str,
        event_type: Any,
        not_before: Any,
        *,
        transition: rt.Transition | None,
        trigger: str,
    ) -> DrainJob:
        return cls(
            record_id(KIND, event_id.lower(), phase),
            phase,
            event_id,
            event_type if isinstance(event_type, str) else None,
            not_before if isinstance(not_before, str) else None,
            transition,
            trigger,
        )

    @property
    def preempt(self) -> bool:
        return self.event_type == "Preempt"

    def to_payload(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "job_id": self.job_id,
            "phase": self.phase,
            "event_id": self.event_id,
            "event_type": self.event_type,
            "not_before": self.not_before,
            "transition": self.transition,
            "trigger": self.trigger,
        }

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> DrainJob:
        try:
            return cls(
                str(payload["job_id"]),
                payload["phase"],
                str(payload["event_id"]),
                payload.get("event_type"),
                payload.get("not_before"),
                payload["transition"],
                str(payload["trigger"]),
            )
        except KeyError as err:
            raise ValueError(f"not a drain job payload: {err} missing") from err


def is_drain_job(payload: Mapping[str, Any]) -> bool:
    return payload.get("kind") == KIND


def drain_record(
    origin: Origin,
    job: DrainJob,
    report: Report,
    now: datetime,
    duration_ms: int,
    *,
    steps: Sequence[str] | None = None,
) -> rt.Hook:
    """The Hook record of a drain's progress or outcome; an outcome replayed after a crash
    keeps its RecordId, as a hook's does."""
    outcome = report.exit_code is not None
    rid = (
        record_id(job.job_id, "Hook") if outcome else record_id(job.job_id, report.status, iso(now))
    )
    blockers: list[dict[str, str | None]] = [b.to_record() for b in report.blockers]
    return hook_fields(
        origin.common("Hook", rid, now),
        event=(job.event_id, job.event_type, job.transition),
        phase=job.phase,
        trigger=job.trigger,
        exit_code=report.exit_code,
        timed_out=report.timed_out,
        duration_ms=max(0, duration_ms),
        output=report.detail[:MAX_OUTPUT],
        error=report.error,
        name=HOOK_NAME,
        drain_status=report.status,
        blockers=blockers or None,
        steps=steps,
    )


class DrainJobs:
    """The drain and uncordon jobs of this VM's node, the first prepare step (a PrepareStep);
    `on_sight`: drain when an event appears (local mode, or no command channel), else only when
    a Prepare grants it. `book` saves and ends its jobs; the spool keeps its own state."""

    name: StepName = "drain"
    granted = True  # a Prepare command starts it (at sight too in local mode: once is enough)
    prepares = True

    def __init__(
        self,
        settings: KubernetesSettings,
        api: KubeApi,
        book: Book,
        spool: Spool,
        metrics: AgentMetrics,
        *,
        origin: Callable[[], Origin],
        now: Callable[[], datetime],
        on_sight: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings, self.api, self._spool, self._metrics = settings, api, spool, metrics
        self._book, self._origin, self._now, self._on_sight = book, origin, now, on_sight
        self._clock = clock
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._saving = threading.Lock()
        self._running: dict[str, tuple[DrainJob, threading.Thread]] = {}  # by job id
        self._ended: set[str] = set()  # events (lower case) whose uncordon is due
        # Events whose drain began here and whose uncordon has not finished: the node's one
        # taint names one of them, and the end of that one hands the marks to another.
        self._holding: list[str] = []
        self._open: frozenset[str] | None = None  # events of the last observation
        self._events: frozenset[str] = frozenset()  # of them, the normaliser's
        # Of them, the Spot rebalance recommendations naming this VM (or none) now open: a
        # drain the consumer granted for one holds the node until it clears.
        self._advised: frozenset[str] = frozenset()
        self._polled = False  # IMDS answered since start: the open events are current
        self._health = NodeHealth(name="")
        self._changed = False
        self._watcher: threading.Thread | None = None
        rules = Rules(
            settings.skip_label,
            settings.wait_label,
            settings.order_label,
            settings.evict_without_controller,
        )
        drain = DrainSettings(
            rules,
            on_deadline=cast(Any, settings.on_deadline),
            eviction_retry=settings.eviction_retry,
            blocked_report_interval=settings.blocked_report_interval,
            poll=settings.pod_poll_interval,
        )
        self.drainer = Drainer(
            api,
            "",
            drain,
            wait=self._stop.wait,
            clock=clock,
            on_refused=metrics.evictions_refused.inc,
        )

    # --- what the node is ---------------------------------------------------------------

    def node_name(self) -> str:
        """kubernetes.node_name, else NODE_NAME (the downward API), else the VM's name."""
        origin = self._origin()
        return (
            self.settings.node_name
            or os.environ.get("NODE_NAME", "").strip()
            or origin.identity.vm_name
            or origin.host_name
        )

    def node_health(self) -> NodeHealth:
        with self._lock:
            return replace(self._health, name=self.node_name())

    def take_change(self) -> bool:
        """True once after what a heartbeat says of the node changed (a Node heartbeat)."""
        with self._lock:
            changed, self._changed = self._changed, False
            return changed

    def _set_health(self, **change: Any) -> None:
        with self._lock:
            new = replace(self._health, **change)
            if new != self._health:
                self._health, self._changed = new, True

    # --- planning -------------------------------------------------------------------------

    def plan(self, records: Sequence[Mapping[str, Any]]) -> list[Job]:
        """The jobs these new Event records call for (saved in the spool with them)."""
        jobs: dict[str, Job] = {}
        for record in records:
            if not is_event(record):
                continue
            event = record
            phase = phase_for(event)
            if phase is None or (phase == "prepare" and not self._drains_at_sight(event)):
                continue
            job = DrainJob.make(
                phase,
                event["EventId"],
                event.get("EventType"),
                event.get("NotBefore"),
                transition=event["Transition"],
                trigger=str(event.get("RecordId") or ""),
            )
            jobs.setdefault(job.job_id, job)
        return list(jobs.values())

    def _drains_at_sight(self, event: Mapping[str, Any]) -> bool:
        """Whether an event calling for a prepare drains the node now (not on a grant)."""
        if is_started(event.get("EventStatus")):
            return False  # the platform has begun: a drain now only cordons for nothing
        return self._on_sight or event.get("EventType") == "Preempt"

    def advise(self, records: Sequence[rt.Advisory]) -> list[Job]:
        """The uncordon of each recommendation that cleared (it finds nothing to undo when
        no drain was granted for it). Its drain is never planned here: the consumer grants
        it (rebalance.drain, docs/policy.md#spot-rebalance-recommendations), and the Preempt
        that may follow drains at once, on its fast path, as before."""
        jobs: list[Job] = []
        for record in records:
            if record["AdvisoryState"] != "Cleared" or record["AffectsThisVm"] is False:
                continue
            jobs.append(
                DrainJob.make(
                    "recover",
                    record["EventId"],
                    record["EventType"],
                    None,
                    transition=None,
                    trigger=record["RecordId"],
                )
            )
        return jobs

    def advised(self, keys: frozenset[str]) -> None:
        """The recommendations naming this VM (or none) open now (EventIds, lower case)."""
        with self._lock:
            self._advised = keys
            if self._open is not None:
                self._open = self._events | keys

    def awaits(self, record: rt.Event) -> bool:
        """Whether the drain of this event's prepare comes on a grant (a central policy)."""
        return (
            phase_for(record) == "prepare"
            and not is_started(record.get("EventStatus"))
            and not self._drains_at_sight(record)
        )

    def load(self, payload: Mapping[str, Any]) -> Job | None:
        return DrainJob.from_payload(payload) if is_drain_job(payload) else None

    def held(self, job: Job, after: str) -> Job:
        raise ValueError(f"the drain is the first prepare step: it waits for no {after}")

    def released(self, job: Job, earlier_ok: bool) -> Job:
        return job

    def grant(self, event_id: str, command_id: str, state: NormaliserState | None) -> Job:
        """The drain of `event_id` a verified Prepare granted (from the command listener)."""
        saved = state["events"].get(event_id.lower()) if state is not None else None
        event: Mapping[str, Any] = saved or {}
        with self._lock:
            if event_id.lower() in self._advised:
                event = {"EventType": REBALANCE_EVENT_TYPE}
        return DrainJob.make(
            "prepare",
            event_id,
            event.get("EventType"),
            event.get("NotBefore"),
            transition="Scheduled",
            trigger=command_id,
        )

    def resubmit(self) -> None:
        pass  # every job has a thread of its own: none waits for room

    # --- running ---------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        if not isinstance(job, DrainJob):
            raise TypeError(f"not a drain job: {job.job_id}")
        with self._lock:
            if self._stop.is_set() or job.job_id in self._running:
                return
            if job.phase == "recover":
                self._ended.add(job.event_id.lower())
            thread = threading.Thread(
                target=self._run,
                args=(job,),
                daemon=True,
                name=f"drain-{job.phase}-{job.event_id[:8]}",
            )
            self._running[job.job_id] = (job, thread)
        thread.start()

    def start(self) -> None:
        """Which events hold the node, as saved; then watch the node: its pool, someone
        else's cordon, and stray marks once IMDS answered. Before the saved jobs resume."""
        try:
            saved = self._spool.load_state(StateKey.DRAIN_HOLDS) or {}
        except SPOOL_ERRORS as err:
            log.warning(
                "which events hold node %s could not be read (%s); the end of one of "
                "them may uncordon it early",
                self.node_name(),
                err,
            )
            saved = {}
        events = saved.get("events")
        with self._lock:
            self._holding = [str(e) for e in events] if isinstance(events, list) else []
        for _job_id, payload in self._spool.pending_jobs():
            if is_drain_job(payload) and payload.get("phase") == "recover":
                # The node is se-bridge's until this uncordon is done: the heartbeats say so,
                # and the consumer keeps its pool's slot until then.
                self._set_health(draining=str(payload.get("event_id")))
                break
        self._watcher = threading.Thread(target=self._watch, name="drain-watch", daemon=True)
        self._watcher.start()

    def observe(self, state: NormaliserState | None, polled: bool) -> None:
        """The agent's last observation: which events are open (from the poll loop)."""
        events = state["events"] if state is not None else {}
        with self._lock:
            self._events = frozenset(str(k).lower() for k in events)
            self._open = self._events | self._advised
            self._polled = self._polled or polled

    def stop(self, timeout: float) -> None:
        """Stop every job where it stands: it stays in the spool and runs again at start."""
        self._stop.set()
        deadline = self._clock() + timeout
        with self._lock:
            threads = [thread for _, thread in self._running.values()]
        for thread in [*threads, self._watcher]:
            if thread is not None:
                thread.join(max(0.0, deadline - self._clock()))
        self.api.close()

    def active(self) -> int:
        with self._lock:
            return len(self._running)

    def _run(self, job: DrainJob) -> None:
        started = self._clock()
        try:
            report = self._prepare(job) if job.phase == "prepare" else self._recover(job)
        except Exception as exc:
            log.exception(
                "the %s of node %s for event %s failed",
                _what(job),
                self.drainer.node_name,
                job.event_id,
            )
            report = Report(
                "Failed", f"the {_what(job)} failed: {exc}", exit_code=1, error=str(exc)
            )
        finally:
            with self._lock:
                self._running.pop(job.job_id, None)
        if report is None and self._stop.is_set():
            return  # stopped: the job stays in the spool
        self._finish(job, report, started)

    def _prepare(self, job: DrainJob) -> Report | None:
        self.drainer.node_name = self.node_name()
        # A recommendation's drain is the policy's own ask (rebalance.drain): not a type of
        # kubernetes.event_types, it drains all the same.
        if (
            job.event_type not in self.settings.event_types
            and job.event_type != REBALANCE_EVENT_TYPE
        ):
            return Report(
                "Drained",
                f"event type {job.event_type} does not drain the node "
                f"(kubernetes.event_types): ready at once",
                exit_code=0,
            )
        self._metrics.drains.labels("started").inc()
        self._hold(job.event_id, True)
        self._set_health(draining=job.event_id)
        started = self._clock()
        report = self.drainer.drain(
            job.event_id,
            self._remaining(job),
            preempt=job.preempt,
            report=lambda progress: self._progress(job, progress, started),
            ended=lambda: self._has_ended(job.event_id),
        )
        if report is not None:
            self._metrics.drains.labels(OUTCOMES.get(report.status, "failed")).inc()
            if report.others_cordon:
                self._set_health(cordoned=True)
        return report

    def _remaining(self, job: DrainJob) -> float:
        """Seconds until the drain must stop: NotBefore less give_up_before (a Preempt: its
        NotBefore, 30 s away at most); none when the event has no NotBefore. A rebalance
        recommendation has no NotBefore and nothing waits for it: its drain goes on until the
        node is empty, the recommendation clears (`ended`), or kubernetes.rebalance_drain_for
        passes (an hour by default, as pods a PodDisruptionBudget holds may take; the Preempt
        that may come meanwhile drains on its own)."""
        if job.event_type == REBALANCE_EVENT_TYPE:
            return self.settings.rebalance_drain_for
        not_before = parse_time(job.not_before)
        if not_before is None:
            return 0.0
        margin = 0.0 if job.preempt else self.settings.give_up_before
        return (not_before - self._now()).total_seconds() - margin

    def _has_ended(self, event_id: str) -> bool:
        key = event_id.lower()
        with self._lock:
            return key in self._ended or (
                self._polled and self._open is not None and key not in self._open
            )

    def _recover(self, job: DrainJob) -> Report | None:
        self.drainer.node_name = self.node_name()
        self._wait_for_prepare(job.event_id)
        if not self._wait_for_observation():
            return None  # stopped: the job stays in the spool
        streak = FailureStreak(Backoff(initial=1.0, maximum=30.0))
        successor = self._successor(job.event_id)
        while True:
            try:
                report = self.drainer.uncordon(job.event_id, successor)
                break
            except KubeError as err:
                first, wait = streak.failed(err)
                if first:
                    log.warning(
                        "cannot uncordon node %s after event %s yet (%s); trying again "
                        "until it answers",
                        self.drainer.node_name,
                        job.event_id,
                        err,
                    )
                if self._stop.wait(wait):
                    return None
        if streak.succeeded():
            log.info(
                "node %s: the marks of event %s were removed once the API answered",
                self.drainer.node_name,
                job.event_id,
            )
        with self._lock:
            self._ended.discard(job.event_id.lower())
        self._hold(job.event_id, False)
        if self.node_health().draining == job.event_id:
            self._set_health(draining=successor)
        if report is not None:
            self._set_health(cordoned=report.others_cordon)
        return report

    def _hold(self, event_id: str, holds: bool) -> None:
        """Note that `event_id`'s drain holds the node (or no longer does), in the spool too:
        once both drains have finished no job is left to say so, and after a restart the end
        of one event must still hand the node to the other."""
        key = event_id.lower()
        with self._saving:  # saved in the order they were made; the poll loop never waits
            with self._lock:
                # An event over since (its recover's own save failed) is dropped on the way.
                kept = [
                    e
                    for e in self._holding
                    if e.lower() != key
                    and (not self._polled or self._open is None or e.lower() in self._open)
                ]
                holding = [*kept, event_id] if holds else kept
                if holding == self._holding:
                    return
                self._holding = holding
            try:
                self._spool.commit([], state={StateKey.DRAIN_HOLDS: {"events": holding}})
            except SPOOL_ERRORS as err:
                log.warning(
                    "which events hold node %s could not be saved (%s); after a "
                    "restart the end of one of them may uncordon it early",
                    self.drainer.node_name,
                    err,
                )

    def _successor(self, event_id: str) -> str | None:
        """Another open event whose drain holds the node, if any: it keeps the node cordoned."""
        key = event_id.lower()
        with self._lock:
            return next(
                (
                    e
                    for e in self._holding
                    if e.lower() != key
                    and e.lower() not in self._ended
                    and (self._open is None or e.lower() in self._open)
                ),
                None,
            )

    def _wait_for_observation(self) -> bool:
        """Wait until IMDS has answered since the start (False: stopped first): which events
        are open decides whether another one holds the node, and before that answer an event
        that ended while the agent was down would still look open."""
        while not self._stop.is_set():
            with self._lock:
                if self._polled and self._open is not None:
                    return True
            self._stop.wait(0.2)
        return False

    def _wait_for_prepare(self, event_id: str) -> None:
        """A recover never overtakes its event's drain: the drain sees the event ended and
        stops, then the node is uncordoned."""
        prepare = record_id(KIND, event_id.lower(), "prepare")
        with self._lock:
            thread = self._running[prepare][1] if prepare in self._running else None
        while thread is not None and thread.is_alive() and not self._stop.is_set():
            thread.join(0.2)

    def _progress(self, job: DrainJob, report: Report, started: float) -> None:
        if report.status == "Blocked":
            self._metrics.drain_blocked.inc()
        if report.others_cordon:
            self._set_health(cordoned=True)
        self._write(job, report, started, finish=False)

    def _finish(self, job: DrainJob, report: Report | None, started: float) -> None:
        if report is None:  # nothing of a drain was on the node: no record
            self._drop(job)
            return
        self._write(job, report, started, finish=True)

    def _write(self, job: DrainJob, report: Report, started: float, *, finish: bool) -> None:
        now = self._now()
        took = int((self._clock() - started) * 1000)
        record = drain_record(self._origin(), job, report, now, took, steps=self._book.names)
        shown = {
            "node": self.drainer.node_name,
            "event": job.event_id,
            "phase": job.phase,
            "status": report.status,
            "at": iso(now),
            "detail": record["HookOutput"],
            "blockers": record["DrainBlockers"] or [],
        }
        try:
            if finish:
                self._book.finish(job, [record], ok=report.ready)
            self._spool.commit([] if finish else [record], state={StateKey.DRAIN: shown})
            self._metrics.made([record])
        except SPOOL_ERRORS as err:
            log.error(
                "the %s record of the %s for event %s could not be saved (%s)%s",
                report.status,
                _what(job),
                job.event_id,
                err,
                "; it runs again at the next start" if finish else "",
            )
            return
        level = (
            logging.WARNING if report.status in ("Blocked", "GaveUp", "Failed") else (logging.INFO)
        )
        log.log(level, "%s", report.detail)

    def _drop(self, job: DrainJob) -> None:
        try:
            self._book.finish(job, [], ok=False)
        except SPOOL_ERRORS as err:
            log.warning(
                "the %s job for event %s stays in the spool (%s)", _what(job), job.event_id, err
            )

    # --- watching the node ----------------------------------------------------------------

    def _watch(self) -> None:
        cleaned = False
        failing = False
        while not self._stop.is_set():
            try:
                self.drainer.node_name = self.node_name()
                node = self.api.node(self.drainer.node_name)
                pool = node.labels.get(self.settings.pool_label)
                self._set_health(pool=pool, cordoned=cordoned_by_others(node))
                if not cleaned and self._polled:
                    self._clean_strays(node)
                    cleaned = True
                failing = False
            except KubeError as err:
                if not failing:
                    log.warning(
                        "cannot read node %s (%s); the agent keeps polling and looks again",
                        self.drainer.node_name,
                        err,
                    )
                failing = True
            wait = 1.0 if (failing or not cleaned) else WATCH_INTERVAL
            self._stop.wait(min(wait, WATCH_INTERVAL))

    def _clean_strays(self, node: Node) -> None:
        def held(event_id: str) -> bool:
            key = event_id.lower()
            with self._lock:
                running = {job.event_id.lower() for job, _ in self._running.values()}
                return key in running or (self._open is not None and key in self._open)

        for event_id in self.drainer.strays(held, node):
            log.warning(
                "node %s carries the marks of a drain for event %s, which is no longer "
                "open: removing them",
                self.drainer.node_name,
                event_id,
            )
            job = DrainJob.make(
                "recover",
                event_id,
                None,
                None,
                transition="Completed",
                trigger=record_id(KIND, event_id.lower(), "stray"),
            )
            self._book.save(job, "the uncordon of a stray mark")
            self.submit(job)


def _what(job: DrainJob) -> str:
    return "drain" if job.phase == "prepare" else "uncordon"
