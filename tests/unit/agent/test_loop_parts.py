"""The loop's smaller collaborators: HookJobs, the hook step of the Preparation (hook jobs in
and outcomes out), and ImdsCalls (IMDS calls on their own threads, abandoned when the agent
stops)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime, timezone
from pathlib import Path
from typing import cast

import pytest

from bridge import recordtypes as rt
from bridge import telemetry
from bridge.agent.hookjobs import HookJobs
from bridge.agent.hookproc import HookOutcome
from bridge.agent.hooks import HookJob
from bridge.agent.imdscalls import ImdsCalls
from bridge.agent.metrics import AgentMetrics
from bridge.agent.prepare import Book, Preparation
from bridge.config import HooksSettings
from bridge.outbox.spool import Spool
from bridge.retry import RetryableError
from tests.support.records import ORIGIN, event_record

NOW = datetime(2026, 11, 27, 5, 0, tzinfo=timezone.utc)


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Spool]:
    spool = Spool(tmp_path / "spool.db", ["jsonl"])
    yield spool
    spool.close()


def jobs(spool: Spool, settings: HooksSettings) -> tuple[Preparation, HookJobs]:
    def step(book: Book) -> HookJobs:
        return HookJobs(settings, book, AgentMetrics(telemetry.new_registry()),
                        origin=lambda: ORIGIN, now=lambda: NOW)  # fmt: skip

    prepare = Preparation(spool, [step])
    [hooks] = prepare.steps
    assert isinstance(hooks, HookJobs)
    return prepare, hooks


def test_without_hooks_no_job_is_planned_or_resumed(spool: Spool) -> None:
    prepare, unhooked = jobs(spool, HooksSettings())
    assert unhooked.runner is None
    assert prepare.plan([cast(rt.Event, event_record("Scheduled"))]) == []
    job = HookJob.for_event(cast(rt.Event, event_record("Scheduled")), "prepare")
    spool.commit([], jobs=[(job.job_id, job.to_payload())])
    prepare.resume()  # a job saved by an agent that had a hook stays saved
    assert [job_id for job_id, _ in spool.pending_jobs()] == [job.job_id]


def test_a_finished_hook_leaves_a_hook_record_and_leaves_the_spool(spool: Spool) -> None:
    prepare, hooked = jobs(spool, HooksSettings(prepare=["true"]))
    try:
        [job] = prepare.plan([cast(rt.Event, event_record("Scheduled"))])
        assert isinstance(job, HookJob)
        spool.commit([], jobs=[(job.job_id, job.to_payload())])
        hooked.done(job, HookOutcome(exit_code=3, duration_ms=12, output="no"))
    finally:
        prepare.stop(timeout=5)
    assert spool.pending_jobs() == []
    [record] = [json.loads(r.body) for r in spool.read_batch("jsonl", 10)]
    assert (record["RecordType"], record["HookPhase"], record["HookExitCode"]) == (
        "Hook", "prepare", 3)  # fmt: skip
    assert record["VmId"] == ORIGIN.identity.vm_id


def test_a_call_is_abandoned_when_the_agent_stops() -> None:
    calls = ImdsCalls(telemetry.SystemdNotifier())
    release = threading.Event()
    try:
        future = calls.polls.submit(release.wait)
        with pytest.raises(FutureTimeout):
            calls.result(future, seconds=0)  # not ready: the loop goes on with its housekeeping
        calls.stop.set()
        with pytest.raises(RetryableError, match="stopping before IMDS answered"):
            calls.result(future)
    finally:
        release.set()
        calls.close()


def test_an_approval_runs_on_its_own_thread() -> None:
    calls = ImdsCalls(telemetry.SystemdNotifier())
    release = threading.Event()
    try:
        calls.polls.submit(release.wait)  # a poll IMDS is slow to answer
        assert calls.approve(lambda: threading.current_thread().name) == "imds approvals"
    finally:
        release.set()
        calls.close()
