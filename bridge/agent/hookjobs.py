"""The hooks' side of the poll loop: which new Event records call for a hook, handing the jobs
to the HookRunner (holding those it has no room for until the next cycle), running again at
start those due when the agent last stopped, and writing each outcome as a Hook record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from bridge import recordtypes as rt
from bridge.agent.drains import is_drain_job
from bridge.agent.hookproc import HookOutcome
from bridge.agent.hooks import HookJob, HookRunner, hook_record, plan
from bridge.agent.localmode import LocalApprover
from bridge.agent.metrics import AgentMetrics
from bridge.config import HooksSettings
from bridge.outbox.spool import SPOOL_ERRORS, Spool
from bridge.records import Origin

# The poll loop's lines, whichever of its collaborators says them.
log = logging.getLogger("bridge.agent.loop")


class HookJobs:
    """The jobs of hooks.prepare and hooks.recover; with neither set, it plans none."""

    def __init__(
        self,
        settings: HooksSettings,
        spool: Spool,
        metrics: AgentMetrics,
        local: LocalApprover | None,
        *,
        origin: Callable[[], Origin],
        now: Callable[[], datetime],
    ) -> None:
        self._settings, self._spool, self._metrics = settings, spool, metrics
        self._local, self._origin, self._now = local, origin, now
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

    def plan(self, records: Sequence[rt.Event]) -> list[HookJob]:
        """The jobs these new Event records call for (saved in the spool with them)."""
        if self.runner is None:
            return []
        settings = self._settings
        return plan(records, prepare=settings.prepare is not None,
                    recover=settings.recover is not None)  # fmt: skip

    def submit(self, job: HookJob) -> None:
        if self.runner is not None and not self.runner.submit(job):
            self._waiting.append(job)

    def resubmit(self) -> None:
        """Jobs the runner had no room for, once more (each cycle)."""
        waiting, self._waiting = self._waiting, []
        for job in waiting:
            self.submit(job)

    def resume(self) -> None:
        """Hooks that were due when the agent last stopped run now: hooks are at-least-once."""
        for _job_id, payload in self._spool.pending_jobs():
            if self.runner is not None and not is_drain_job(payload):  # drains resume theirs
                self.submit(HookJob.from_payload(payload))

    def stop(self, timeout: float) -> None:
        if self.runner is not None:
            self.runner.stop(timeout=timeout)

    def done(self, job: HookJob, outcome: HookOutcome) -> None:
        """A hook finished (on a hook worker): its Hook record, and the job off the spool."""
        self._metrics.hook(job.phase, "timeout" if outcome.timed_out else "ok" if outcome.ok
                           else "failed")  # fmt: skip
        if self._local is not None:
            self._local.hook_done(job.event_id, job.phase, outcome.ok)
        record = hook_record(self._origin(), job, outcome, self._now())
        try:
            self._spool.finish_job(job.job_id, [record])
            self._metrics.made([record])
        except SPOOL_ERRORS as err:
            log.error("the outcome of the %s hook for event %s could not be saved (%s); the "
                      "hook stays due and runs again at the next start", job.phase,
                      job.event_id, err)  # fmt: skip
