"""hooks.prepare and hooks.recover as a prepare step (bridge.agent.prepare): which new Event
records call for a hook, handing the jobs to the HookRunner (holding those it has no room for
until the next cycle), and writing each outcome as a Hook record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from bridge import recordtypes as rt
from bridge.agent.hookproc import HookOutcome
from bridge.agent.hooks import HookJob, HookRunner, advisory_jobs, hook_record, plan
from bridge.agent.metrics import AgentMetrics
from bridge.agent.normalise import NormaliserState
from bridge.agent.prepare import Book, Job, StepName
from bridge.config import HooksSettings
from bridge.outbox.spool import SPOOL_ERRORS
from bridge.records import Origin

# The poll loop's lines, whichever of its collaborators says them.
log = logging.getLogger("bridge.agent.loop")

KIND = "hook"  # a hook job's payload may say so; one saved before the drain says nothing


class HookJobs:
    """The jobs of hooks.prepare and hooks.recover; with neither set, it plans none."""

    name: StepName = "hook"
    granted = False  # a hook starts when the event appears (or when the drain before it ended)

    def __init__(
        self,
        settings: HooksSettings,
        book: Book,
        metrics: AgentMetrics,
        *,
        origin: Callable[[], Origin],
        now: Callable[[], datetime],
    ) -> None:
        self._settings, self._book, self._metrics = settings, book, metrics
        self._origin, self._now = origin, now
        self._waiting: list[HookJob] = []
        # The runner calls `done` from its workers: it comes with what handles its outcomes.
        self.runner: HookRunner | None = None
        if settings.prepare is not None or settings.recover is not None:
            self.runner = HookRunner(
                prepare=settings.prepare,
                recover=settings.recover,
                timeout=settings.timeout,
                max_concurrent=settings.max_concurrent,
                on_done=self.done,
                environment=settings.environment,
            )

    @property
    def prepares(self) -> bool:
        return self._settings.prepare is not None

    def plan(self, records: Sequence[rt.Event]) -> list[Job]:
        """The jobs these new Event records call for (saved in the spool with them)."""
        if self.runner is None:
            return []
        settings = self._settings
        return list(
            plan(
                records, prepare=settings.prepare is not None, recover=settings.recover is not None
            )
        )

    def advise(self, records: Sequence[rt.Advisory]) -> list[Job]:
        """The prepare hooks new Advisory records call for, with hooks.on_rebalance."""
        if self.runner is None or self._settings.prepare is None:
            return []
        return list(advisory_jobs(records)) if self._settings.on_rebalance else []

    def awaits(self, record: rt.Event) -> bool:
        return False  # never granted: its prepare is planned at sight

    def load(self, payload: Mapping[str, Any]) -> Job | None:
        """A saved hook job; None for another step's (a drain's says its kind)."""
        if payload.get("kind", KIND) != KIND:
            return None
        return HookJob.from_payload(payload)

    def held(self, job: Job, after: str) -> Job:
        return replace(_hook(job), after=after)

    def released(self, job: Job, earlier_ok: bool) -> Job:
        return replace(_hook(job), after=None, earlier_ok=earlier_ok)

    def grant(self, event_id: str, command_id: str, state: NormaliserState | None) -> Job:
        raise ValueError(f"a hook is not granted (event {event_id}, command {command_id})")

    def submit(self, job: Job) -> None:
        hook = _hook(job)
        if self.runner is not None and not self.runner.submit(hook):
            self._waiting.append(hook)

    def resubmit(self) -> None:
        """Jobs the runner had no room for, once more (each cycle)."""
        waiting, self._waiting = self._waiting, []
        for job in waiting:
            self.submit(job)

    def start(self) -> None:
        pass  # its workers started with it

    def observe(self, state: NormaliserState | None, polled: bool) -> None:
        pass  # a hook's command reads the event from its own record

    def stop(self, timeout: float) -> None:
        if self.runner is not None:
            self.runner.stop(timeout=timeout)

    def active(self) -> int:
        return 0 if self.runner is None else self.runner.active()

    def done(self, job: HookJob, outcome: HookOutcome) -> None:
        """A hook finished (on a hook worker): its Hook record, and the job off the spool."""
        self._metrics.hook(
            job.phase, "timeout" if outcome.timed_out else "ok" if outcome.ok else "failed"
        )
        record = hook_record(self._origin(), job, outcome, self._now(), self._book.names)
        try:
            self._book.finish(job, [record], ok=outcome.ok)
            self._metrics.made([record])
        except SPOOL_ERRORS as err:
            log.error(
                "the outcome of the %s hook for event %s could not be saved (%s); the "
                "hook stays due and runs again at the next start",
                job.phase,
                job.event_id,
                err,
            )


def _hook(job: Job) -> HookJob:
    if not isinstance(job, HookJob):
        raise TypeError(f"not a hook job: {job.job_id}")
    return job
