"""Local hooks: user commands run when an event starts to affect this VM and when it ends.

`plan` decides which Event records call for a hook and `hook_record` turns an outcome into a
Hook record; both are pure. `HookRunner` runs the commands on a few worker threads so the poll
loop never waits for a hook. The lead persists each HookJob in the spool before submitting it
and drops it after `on_done`, so a hook runs at least once even across a kill -9.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from bridge import recordtypes as rt
from bridge.agent.hookproc import KILL_WAIT_S, Command, HookOutcome, Popen, kill_tree, run_hook
from bridge.records import Origin, RecordView, is_event, record_id

log = logging.getLogger(__name__)

Phase = rt.HookPhase
PHASES: tuple[Phase, ...] = ("prepare", "recover")

_FIRST_SIGHT = frozenset({"Scheduled", "Started"})
_GONE = frozenset({"Completed", "Canceled"})

# Linux refuses an environment string over 128 KiB and Windows a variable over 32767
# characters; the whole record is on stdin anyway.
ENV_VALUE_MAX = 32_000

ENV_FIELDS: tuple[tuple[str, str], ...] = (
    ("SE_BRIDGE_EVENT_ID", "EventId"),
    ("SE_BRIDGE_EVENT_TYPE", "EventType"),
    ("SE_BRIDGE_EVENT_STATUS", "EventStatus"),
    ("SE_BRIDGE_TRANSITION", "Transition"),
    ("SE_BRIDGE_NOT_BEFORE", "NotBefore"),
    ("SE_BRIDGE_RESOURCES", "Resources"),
    ("SE_BRIDGE_EVENT_SOURCE", "EventSource"),
    ("SE_BRIDGE_DURATION_SECONDS", "DurationInSeconds"),
    ("SE_BRIDGE_DESCRIPTION", "Description"),
    ("SE_BRIDGE_AFFECTS_THIS_VM", "AffectsThisVm"),
    ("SE_BRIDGE_RECORD_ID", "RecordId"),
    ("SE_BRIDGE_VM_NAME", "VmName"),
    ("SE_BRIDGE_VM_ID", "VmId"),
)


@dataclass(frozen=True)
class HookJob:
    """One hook to run: `phase` for the Event record `trigger` (or, hooks.on_rebalance, a
    Raised Advisory record). Its id is deterministic."""

    job_id: str
    phase: Phase
    trigger: rt.Event | rt.Advisory = field(hash=False)
    # A prepare after the drain (bridge.agent.prepare): held until the step `after` ended for
    # the event; `earlier_ok`, once released: whether it succeeded.
    after: str | None = None
    earlier_ok: bool = True

    @classmethod
    def for_event(cls, record: rt.Event | rt.Advisory, phase: Phase) -> HookJob:
        return cls(record_id(record["RecordId"], phase), phase, record.copy())

    @property
    def event_id(self) -> str:
        event = self.trigger.get("EventId")
        return event if isinstance(event, str) else self.job_id

    def to_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "job_id": self.job_id,
            "phase": self.phase,
            "trigger": dict(self.trigger),
        }
        if self.after is not None or not self.earlier_ok:
            payload |= {"after": self.after, "earlier_ok": self.earlier_ok}
        return payload

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> HookJob:
        job_id, phase, trigger = payload.get("job_id"), payload.get("phase"), payload.get("trigger")
        if not isinstance(job_id, str) or phase not in PHASES or not isinstance(trigger, dict):
            raise ValueError("not a hook job payload")
        after = payload.get("after")
        # The record `for_event` kept, as the spool gave it back.
        return cls(
            job_id,
            phase,
            cast(rt.Event | rt.Advisory, dict(trigger)),
            after if isinstance(after, str) else None,
            payload.get("earlier_ok") is not False,
        )


# --- planning -------------------------------------------------------------------------------


def phase_for(record: rt.Event) -> Phase | None:
    """The hook an Event record calls for, if any."""
    transition = record.get("Transition")
    affects = record.get("AffectsThisVm")
    # None means the VM's name is unknown: prepare and recover to be safe.
    if transition in _FIRST_SIGHT and record.get("PreviousStatus") is None:
        return "prepare" if affects is not False else None
    if transition in _GONE:
        return "recover" if affects is not False else None
    if transition == "Updated" and "AffectsThisVm" in (record.get("ChangedFields") or ()):
        if affects is True:
            return "prepare"
        if affects is False:
            return "recover"
    return None


def plan(records: Sequence[RecordView], *, prepare: bool, recover: bool) -> list[HookJob]:
    """The hook jobs the normaliser's new Event records call for, given the configured hooks."""
    wanted = {"prepare": prepare, "recover": recover}
    jobs: dict[str, HookJob] = {}
    for record in records:
        if not is_event(record):
            continue
        phase = phase_for(record)
        if phase is None or not wanted[phase]:
            continue
        if not isinstance(record.get("RecordId"), str):
            log.warning("event record without a RecordId: no %s hook", phase)
            continue
        job = HookJob.for_event(record, phase)
        jobs.setdefault(job.job_id, job)
    return list(jobs.values())


def advisory_jobs(records: Sequence[RecordView]) -> list[HookJob]:
    """The prepare hooks these records' Raised Advisories call for (hooks.on_rebalance): one
    naming this VM, or naming no VM (AffectsThisVm null: run, to be safe, as for an event).
    Never a recover: nothing was approved, and a Cleared recommendation means the VM was
    evicted or the risk passed."""
    jobs: dict[str, HookJob] = {}
    for record in records:
        if record.get(rt.RECORD_TYPE) != "Advisory" or record.get("AdvisoryState") != "Raised":
            continue
        if record.get("AffectsThisVm") is False or not isinstance(record.get("RecordId"), str):
            continue
        job = HookJob.for_event(cast(rt.Advisory, record), "prepare")
        jobs.setdefault(job.job_id, job)
    return list(jobs.values())


# --- records --------------------------------------------------------------------------------


def hook_record_id(job: HookJob) -> str:
    return record_id(job.job_id, "Hook")


def hook_record(
    origin: Origin,
    job: HookJob,
    outcome: HookOutcome,
    now: datetime,
    steps: Sequence[str] | None = None,
) -> rt.Hook:
    """The Hook record of a finished job; a replay of the job after a crash keeps its RecordId.
    `steps`: the agent's prepare steps (PrepareSteps), None to leave them out."""
    trigger = job.trigger
    return hook_fields(
        origin.common("Hook", hook_record_id(job), now),
        event=(trigger.get("EventId"), trigger.get("EventType"), trigger.get("Transition")),
        phase=job.phase,
        trigger=trigger.get("RecordId"),
        exit_code=outcome.exit_code,
        timed_out=outcome.timed_out,
        duration_ms=int(outcome.duration_ms),
        output=outcome.output,
        error=outcome.error,
        steps=steps,
    )


def hook_fields(
    common: rt.Common,
    *,
    event: tuple[Any, Any, Any],
    phase: rt.HookPhase,
    trigger: Any,
    exit_code: int | None,
    timed_out: bool,
    duration_ms: int,
    output: str,
    error: str | None,
    name: str | None = None,
    drain_status: rt.DrainStatus | None = None,
    blockers: list[dict[str, str | None]] | None = None,
    steps: Sequence[str] | None = None,
) -> rt.Hook:
    """A Hook record: of a hooks.prepare or hooks.recover command (`name` None), or of the
    built-in drain (bridge.agent.drains). `event`: its EventId, EventType and Transition;
    `steps`: the agent's prepare steps, which the consumer reads readiness by (PrepareSteps)."""
    event_id, event_type, transition = event
    record: rt.Hook = {
        **common,
        rt.RECORD_TYPE: "Hook",
        "EventId": event_id,
        "EventType": event_type,
        "Transition": transition,
        "HookPhase": phase,
        "TriggerRecordId": trigger,
        "HookExitCode": exit_code,
        "HookTimedOut": timed_out,
        "HookDurationMs": duration_ms,
        "HookOutput": output,
        "HookError": error,
        "HookName": name,
        "DrainStatus": drain_status,
        "DrainBlockers": blockers,
        "PrepareSteps": list(steps or ()),
    }
    if steps is None:
        del record["PrepareSteps"]
    return record


# --- running one hook -----------------------------------------------------------------------


# What a hook inherits from the agent's environment: what a program needs to run (the search
# path, home, locale, time zone, temporary directory; on Windows the system's own variables),
# and nothing else. The agent's environment may hold cloud credentials (AZURE_CLIENT_SECRET,
# IDENTITY_HEADER, MSI_SECRET, an SE_BRIDGE_* connection string): a hook gets the event, not
# the agent's credentials. `hooks.environment` names more variables to pass.
BASE_ENVIRONMENT = (
    "PATH",
    "HOME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "USER",
    "LOGNAME",
    "SHELL",
    "SYSTEMROOT",
    "WINDIR",
    "SYSTEMDRIVE",
    "COMSPEC",
    "PATHEXT",
    "TEMP",
    "TMP",
    "USERPROFILE",
    "PROGRAMDATA",
    "PROGRAMFILES",
    "PROGRAMFILES(X86)",
    "ALLUSERSPROFILE",
)
LOCALE_PREFIX = "LC_"
OWN_PREFIX = "SE_BRIDGE_"


def hook_environment(
    job: HookJob, base: Mapping[str, str], allow: Sequence[str] = ()
) -> dict[str, str]:
    """The documented environment of a hook: BASE_ENVIRONMENT and the locale (LC_*) from
    `base`, the variables `allow` names, and the event's SE_BRIDGE_* variables."""
    wanted = {_env_name(name) for name in (*BASE_ENVIRONMENT, *allow)}
    env = {
        k: v
        for k, v in base.items()
        if not _env_name(k).startswith(OWN_PREFIX)
        and (_env_name(k) in wanted or k.startswith(LOCALE_PREFIX))
    }
    env["SE_BRIDGE_HOOK_PHASE"] = job.phase
    for name, key in ENV_FIELDS:
        env[name] = _env_value(job.trigger.get(key))[:ENV_VALUE_MAX]
    return env


def _env_name(name: str) -> str:
    # Windows matches environment names in any case; POSIX exactly.
    return name.upper() if os.name == "nt" else name


def _env_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    # The OS refuses NUL in the environment; one odd Description must not stop the hook.
    return str(value).replace("\0", "")


# --- the runner -----------------------------------------------------------------------------


class HookRunner:
    """Runs hook jobs on `max_concurrent` daemon worker threads; `submit` never blocks.

    Jobs of the same event run one after another in submission order, so a recover never
    overtakes the prepare of its event; jobs of different events run side by side.
    `on_done` is called from a worker thread. A hook killed by `stop` is not reported, so
    it stays pending in the spool and runs again after the restart.
    """

    def __init__(
        self,
        *,
        prepare: Command | None,
        recover: Command | None,
        timeout: float,
        max_output: int = 4096,
        max_concurrent: int = 4,
        max_pending: int = 64,
        on_done: Callable[[HookJob, HookOutcome], None],
        system: str | None = None,
        environment: Sequence[str] = (),
    ) -> None:
        if timeout <= 0 or max_concurrent < 1 or max_pending < 1:
            raise ValueError("hook timeout, max_concurrent and max_pending must be positive")
        self._commands: dict[str, Command | None] = {"prepare": prepare, "recover": recover}
        self._environment = tuple(environment)
        self._timeout = timeout
        self._max_output = max_output
        self._max_pending = max_pending
        self._on_done = on_done
        self._system = system or platform.system()
        # Room for the stop sentinels on top of the pending jobs: put_nowait never fails.
        self._queue: queue.Queue[HookJob | None] = queue.Queue(max_pending + max_concurrent)
        self._lock = threading.Lock()
        self._accepted: set[str] = set()  # job ids queued, waiting or running
        self._behind: dict[str, deque[HookJob]] = {}  # per busy event: jobs waiting their turn
        self._pending = 0  # accepted jobs not started yet
        self._procs: dict[str, Popen] = {}
        self._killed: set[str] = set()
        self._stopping = False
        self._killing = False
        self._workers = [
            threading.Thread(target=self._work, name=f"hook-worker-{i}", daemon=True)
            for i in range(max_concurrent)
        ]
        for worker in self._workers:
            worker.start()

    def configured(self, phase: Phase) -> bool:
        return self._commands[phase] is not None

    def submit(self, job: HookJob) -> bool:
        """Queue `job`; False when refused (full or stopping): keep it pending and retry later."""
        with self._lock:
            if self._stopping:
                return False
            if job.job_id in self._accepted:
                return True  # already queued or running: once is enough
            full = self._pending >= self._max_pending
            if not full:
                self._enqueue(job)
        if full:
            log.warning(
                "hook queue full (%d pending): %s hook for event %s stays pending",
                self._max_pending,
                job.phase,
                job.event_id,
            )
        return not full

    def active(self) -> int:
        """Jobs accepted and not finished: queued, waiting behind their event, or running."""
        with self._lock:
            return len(self._accepted)

    def stop(self, timeout: float) -> None:
        """Drop queued jobs, wait up to `timeout` for running hooks, then kill what is left."""
        if not self._close():
            return
        for _ in self._workers:
            self._queue.put_nowait(None)
        self._join(time.monotonic() + max(0.0, timeout))
        if any(w.is_alive() for w in self._workers):
            self._kill_running()
            self._join(time.monotonic() + KILL_WAIT_S)

    # -- bookkeeping, under the lock --

    def _enqueue(self, job: HookJob) -> None:
        waiting = self._behind.get(job.event_id)
        if waiting is not None:
            waiting.append(job)
        else:
            self._behind[job.event_id] = deque()
            self._queue.put_nowait(job)
        self._accepted.add(job.job_id)
        self._pending += 1

    def _close(self) -> bool:
        """Refuse new jobs and forget the queued ones (the spool still has them)."""
        with self._lock:
            if self._stopping:
                return False
            self._stopping = True
            dropped = [j.job_id for q in self._behind.values() for j in q]
            self._behind.clear()
            with suppress(queue.Empty):
                while True:
                    job = self._queue.get_nowait()
                    if job is not None:
                        dropped.append(job.job_id)
            self._accepted.difference_update(dropped)
            self._pending = 0
        return True

    def _start(self, job: HookJob) -> bool:
        with self._lock:
            if self._stopping:
                return False
            self._pending -= 1
            return True

    def _next_after(self, job: HookJob) -> HookJob | None:
        with self._lock:
            self._accepted.discard(job.job_id)
            waiting = self._behind.get(job.event_id)
            if self._stopping or not waiting:
                self._behind.pop(job.event_id, None)
                return None
            return waiting.popleft()

    def _register(self, job: HookJob, proc: Popen) -> None:
        with self._lock:
            self._procs[job.job_id] = proc
            kill = self._killing
            if kill:
                self._killed.add(job.job_id)
        if kill:
            kill_tree(proc, self._system)

    def _finish(self, job: HookJob) -> bool:
        """Forget the job's process; True when stop killed it."""
        with self._lock:
            self._procs.pop(job.job_id, None)
            return job.job_id in self._killed

    def _kill_running(self) -> None:
        with self._lock:
            self._killing = True
            procs = list(self._procs.items())
            self._killed.update(job_id for job_id, _ in procs)
        for job_id, proc in procs:
            log.warning("hook job %s still running at stop: killing it", job_id)
            kill_tree(proc, self._system)

    def _join(self, deadline: float) -> None:
        for worker in self._workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    # -- workers --

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            current: HookJob | None = job
            while current is not None:
                if self._start(current):
                    self._run(current)
                current = self._next_after(current)

    def _run(self, job: HookJob) -> None:
        try:
            outcome = self._execute(job)
        except Exception as exc:
            log.exception("%s hook for event %s failed in the runner", job.phase, job.event_id)
            outcome = HookOutcome(None, error=f"hook runner failed: {exc}")
        if self._finish(job):
            log.info("%s hook for event %s was stopped: it stays pending", job.phase, job.event_id)
            return
        _log_outcome(job, outcome)
        try:
            self._on_done(job, outcome)
        except Exception:
            log.exception("on_done failed for hook job %s", job.job_id)

    def _execute(self, job: HookJob) -> HookOutcome:
        command = self._commands[job.phase]
        if command is None:
            return HookOutcome(None, error=f"no {job.phase} hook configured")
        return run_hook(
            command,
            stdin=(json.dumps(job.trigger, default=str) + "\n").encode("utf-8"),
            env=hook_environment(job, os.environ, self._environment),
            timeout=self._timeout,
            max_output=self._max_output,
            system=self._system,
            on_spawn=lambda proc: self._register(job, proc),
        )


def _log_outcome(job: HookJob, outcome: HookOutcome) -> None:
    what = f"{job.phase} hook for event {job.event_id}"
    if outcome.error is not None:
        log.warning("%s could not run: %s", what, outcome.error)
    elif outcome.timed_out:
        log.warning("%s timed out after %d ms and was killed", what, outcome.duration_ms)
    elif outcome.exit_code != 0:
        log.warning("%s exited with %s after %d ms", what, outcome.exit_code, outcome.duration_ms)
    else:
        log.info("%s succeeded in %d ms", what, outcome.duration_ms)
