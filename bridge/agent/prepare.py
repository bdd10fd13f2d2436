"""The prepare step of this VM: what runs before an event may be approved, and after it ends.

A step is one `PrepareStep`: the drain of this VM's Kubernetes node ([kubernetes],
bridge.agent.drains) or the hooks.prepare and hooks.recover commands (bridge.agent.hookjobs).
`Preparation` is the one runner over the steps this VM has, in the order they run (the drain
first, then the hook). It keeps their jobs in the spool with the Event records that call for
them, resumes them at start, and says when the VM is ready for an event: when the prepare job
of its last step succeeded and every step before it did. Each step still runs its own jobs on
its own threads and writes its own Hook records, progress and failures alike.

A later step's prepare job for an event waits for the step before it: saved at sight as held
(`Job.after` names the step it waits for), it is released, in the one transaction that ends
the earlier step's job, when that job ends, whatever its outcome (the hook runs after a drain
that failed: the event comes at its NotBefore all the same, and the VM is not ready). A
restart between the two steps finds the hook's job released in the spool and runs it; one
before the earlier job ended finds both and runs them in order. A held job whose event ends
first (a drain the consumer never granted) is dropped without running.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

from bridge import recordtypes as rt
from bridge.agent.normalise import NormaliserState
from bridge.outbox.spool import SPOOL_ERRORS, Spool
from bridge.records import RecordView

# The poll loop's lines, whichever of its collaborators says them.
log = logging.getLogger("bridge.agent.loop")

StepName = Literal["drain", "hook"]  # in PrepareSteps (record.schema.json)


class Job(Protocol):
    """One job of a step: its prepare or recover for one event, saved in the spool."""

    @property
    def job_id(self) -> str: ...

    @property
    def phase(self) -> rt.HookPhase: ...

    @property
    def event_id(self) -> str: ...

    @property
    def after(self) -> str | None:
        """The step this prepare job waits for (held), or None: it may run."""

    @property
    def earlier_ok(self) -> bool:
        """Whether every step before this one succeeded for the event."""

    def to_payload(self) -> dict[str, Any]: ...


class PrepareStep(Protocol):
    """One step: plans jobs from new Event records, runs them, and reports each job's end to
    the Preparation that made it (`Book.finish`)."""

    name: StepName
    # A Prepare command (the consumer's grant) starts this step's prepare job (`awaits`: under
    # a central policy it waits for one).
    granted: bool

    @property
    def prepares(self) -> bool:
        """Whether it has a prepare job to run (hooks.recover alone has none)."""

    def plan(self, records: Sequence[rt.Event]) -> list[Job]:
        """The jobs these new Event records call for, prepare and recover."""

    def advise(self, records: Sequence[rt.Advisory]) -> list[Job]:
        """The jobs these new Advisory records call for (run at once, never held: an
        advisory is approved by nobody, so nothing waits for the VM to be ready)."""

    def awaits(self, record: rt.Event) -> bool:
        """Whether this step's prepare job for `record`'s event comes later (on a grant)."""

    def load(self, payload: Mapping[str, Any]) -> Job | None:
        """A saved job of this step; None when `payload` is another step's."""

    def held(self, job: Job, after: str) -> Job:
        """`job` held until the step `after` ended for its event."""

    def released(self, job: Job, earlier_ok: bool) -> Job:
        """`job` free to run, knowing whether the steps before it succeeded."""

    def grant(self, event_id: str, command_id: str, state: NormaliserState | None) -> Job:
        """The prepare job a verified Prepare command grants."""

    def submit(self, job: Job) -> None: ...

    def resubmit(self) -> None:
        """Jobs it had no room for, once more (each cycle)."""

    def start(self) -> None: ...

    def observe(self, state: NormaliserState | None, polled: bool) -> None: ...

    def stop(self, timeout: float) -> None: ...

    def active(self) -> int: ...


class Book(Protocol):
    """What a step reports to: the jobs it saves and ends (the Preparation that made it)."""

    @property
    def names(self) -> tuple[StepName, ...]:
        """The steps this VM has, in the order they run (PrepareSteps of its Hook records)."""

    def save(self, job: Job, what: str) -> None: ...

    def finish(self, job: Job, records: Sequence[RecordView], *, ok: bool) -> None: ...


StepFactory = Callable[[Book], PrepareStep]


class Preparation:
    """The one runner over this VM's prepare steps (none, the drain, the hook, or both)."""

    def __init__(self, spool: Spool, steps: Sequence[StepFactory]) -> None:
        self._spool = spool
        self.steps: tuple[PrepareStep, ...] = tuple(make(self) for make in steps)
        # The steps that run before an event (in order): the ones a VM is ready after.
        self._preparing = tuple(step for step in self.steps if step.prepares)
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str], Job] = {}  # (step, event lower case) -> held job
        self._ready: set[str] = set()  # events (lower case) this VM is prepared for
        self._state: NormaliserState | None = None

    # --- what the VM has -------------------------------------------------------------------

    @property
    def names(self) -> tuple[StepName, ...]:
        """The steps, in the order they run (HasPrepareHook, PrepareSteps)."""
        return tuple(step.name for step in self._preparing)

    @property
    def granted(self) -> bool:
        """Whether a Prepare command has a step to start (else the agent refuses it)."""
        return bool(self._preparing) and self._preparing[0].granted

    def ready_events(self) -> frozenset[str]:
        """Events (lower case) whose every prepare step succeeded on this VM, this run."""
        with self._lock:
            return frozenset(self._ready)

    # --- planning --------------------------------------------------------------------------

    def plan(self, records: Sequence[rt.Event]) -> list[Job]:
        """The jobs these new Event records call for, a later step's prepare held behind the
        step before it; saved in the spool with the records, then handed to `submit`."""
        jobs: list[Job] = []
        for step in self.steps:
            before = self._before(step)
            for job in step.plan(records):
                if (
                    before is not None
                    and job.phase == "prepare"
                    and self._takes(before, records, job.event_id)
                ):
                    job = step.held(job, before.name)  # noqa: PLW2901 - the held form of it
                jobs.append(job)
        return jobs

    def advise(self, records: Sequence[rt.Advisory]) -> list[Job]:
        """The jobs these new Advisory records call for, each step's own; saved and submitted
        as `plan`'s are."""
        return [job for step in self.steps for job in step.advise(records)]

    @staticmethod
    def _takes(step: PrepareStep, records: Sequence[rt.Event], event_id: str) -> bool:
        key = event_id.lower()
        mine = [r for r in records if str(r.get("EventId", "")).lower() == key]
        return any(j.phase == "prepare" for j in step.plan(mine)) or any(
            step.awaits(r) for r in mine
        )

    def submit(self, jobs: Sequence[Job]) -> None:
        """Run the jobs `plan` gave, once saved; held ones wait for the step before them."""
        ending: list[str] = []
        for job in jobs:
            step = self._step_of(job)
            if step is None:
                continue
            if job.after is not None:
                with self._lock:
                    self._held[(step.name, job.event_id.lower())] = job
                continue
            if job.phase == "recover":
                ending.append(job.event_id.lower())
            step.submit(job)
        self._end(ending)

    def _end(self, events: Sequence[str]) -> None:
        """These events ended: a held prepare of theirs will never run."""
        with self._lock:
            dropped = [j for (_, key), j in self._held.items() if key in events]
            for job in dropped:
                del self._held[(self._name_of(job), job.event_id.lower())]
        for job in dropped:
            log.info(
                "event %s ended before its %s step did: its %s prepare job is dropped "
                "without running",
                job.event_id,
                job.after,
                self._name_of(job),
            )
            self._finish_quietly(job)

    def resume(self) -> None:
        """Jobs that were due when the agent last stopped run now; held ones wait again."""
        saved: list[Job] = []
        for _job_id, payload in self._spool.pending_jobs():
            for step in self.steps:
                try:
                    job = step.load(payload)
                except ValueError as err:
                    log.warning("a saved %s job could not be read (%s): skipped", step.name, err)
                    break
                if job is not None:
                    saved.append(job)
                    break
        self.submit(saved)

    # --- running ---------------------------------------------------------------------------

    def grant(self, event_id: str, command_id: str) -> bool:
        """A verified Prepare (from the command listener) starts the first step; False when
        no step starts on a grant."""
        if not self.granted:
            return False
        first = self._preparing[0]
        job = first.grant(event_id, command_id, self._state)
        self.save(job, f"the {first.name} granted for event {event_id}")
        first.submit(job)
        return True

    def save(self, job: Job, what: str) -> None:
        """Save `job` in the spool (a restart resumes it); it runs, saved or not."""
        try:
            self._spool.commit([], jobs=[(job.job_id, job.to_payload())])
        except SPOOL_ERRORS as err:
            log.error(
                "%s could not be saved in the spool (%s); it runs, but a restart will "
                "not resume it",
                what,
                err,
            )

    def finish(self, job: Job, records: Sequence[RecordView], *, ok: bool) -> None:
        """A step's job ended with `records` (from its worker thread): off the spool with
        them, in one transaction with the release of the next step's job for the event, which
        then runs. SPOOL_ERRORS when the spool did not take them: the job runs again at start
        (and releases the next one then)."""
        step = self._step_of(job)
        after = self._next(step) if job.phase == "prepare" else None
        key = job.event_id.lower()
        with self._lock:
            held = self._held.pop((after.name, key), None) if after is not None else None
        then: list[Job] = []
        if held is not None and after is not None:
            then = [after.released(held, earlier_ok=ok and job.earlier_ok)]
        try:
            self._spool.finish_job(
                job.job_id, records, then=[(j.job_id, j.to_payload()) for j in then]
            )
        except SPOOL_ERRORS:
            if held is not None:
                with self._lock:
                    self._held[(self._name_of(held), key)] = held
            raise
        if then and after is not None:
            after.submit(then[0])
        if job.phase == "prepare" and after is None and ok and job.earlier_ok:
            with self._lock:
                self._ready.add(key)

    def _finish_quietly(self, job: Job) -> None:
        try:
            self._spool.finish_job(job.job_id, [])
        except SPOOL_ERRORS as err:
            log.warning(
                "the %s job of event %s stays in the spool (%s)",
                self._name_of(job),
                job.event_id,
                err,
            )

    def resubmit(self) -> None:
        for step in self.steps:
            step.resubmit()

    def start(self) -> None:
        for step in self.steps:
            step.start()

    def observe(self, state: NormaliserState | None, polled: bool) -> None:
        """The agent's last observation (from the poll loop): which events are open."""
        self._state = state
        present = {str(k).lower() for k in (state["events"] if state is not None else {})}
        with self._lock:
            self._ready &= present
        for step in self.steps:
            step.observe(state, polled)

    def stop(self, timeout: float) -> None:
        """Stop every step's jobs where they stand: they stay in the spool."""
        for step in self.steps:
            step.stop(timeout)

    def active(self) -> int:
        return sum(step.active() for step in self.steps)

    # --- which step -------------------------------------------------------------------------

    def _step_of(self, job: Job) -> PrepareStep | None:
        payload = job.to_payload()
        return next((s for s in self.steps if s.load(payload) is not None), None)

    def _name_of(self, job: Job) -> str:
        step = self._step_of(job)
        return step.name if step is not None else "prepare"

    def _next(self, step: PrepareStep | None) -> PrepareStep | None:
        """The preparing step after `step`, if any."""
        if step is None or step not in self._preparing:
            return None
        n = self._preparing.index(step)
        return self._preparing[n + 1] if n + 1 < len(self._preparing) else None

    def _before(self, step: PrepareStep) -> PrepareStep | None:
        """The preparing step before `step`, if any."""
        if step not in self._preparing:
            return None
        n = self._preparing.index(step)
        return self._preparing[n - 1] if n else None
