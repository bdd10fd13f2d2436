"""Heartbeats and PollHealth: the records that say how the agent is, and what `se-bridge status`
reads beside them in the spool's state."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from bridge import telemetry
from bridge.agent.heartbeats import Heartbeats, PollHealth
from bridge.agent.metrics import AgentMetrics
from bridge.outbox.spool import Spool, StateKey
from bridge.records import NodeHealth
from bridge.retry import PermanentError, RetryableError
from tests.support.records import ORIGIN, assert_valid

T0 = datetime(2026, 11, 27, 5, 0, tzinfo=timezone.utc)
INTERVAL = 300.0


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.spool = Spool(tmp_path / "spool.db", ["jsonl"])
        self.poll = PollHealth()
        self.metrics = AgentMetrics(telemetry.new_registry())
        self.clock = [1000.0]  # the monotonic clock
        self.now = [T0]
        self.beats = Heartbeats(self.spool, self.poll, self.metrics, lambda: self.now[0],
                                interval=INTERVAL, prepare_steps=("hook",),
                                clock=lambda: self.clock[0])  # fmt: skip

    def records(self) -> list[dict[str, Any]]:
        found = [json.loads(r.body) for r in self.spool.read_batch("jsonl", 100)]
        for record in found:
            assert_valid(record)
        return found

    def health(self) -> dict[str, Any]:
        return self.spool.load_state(StateKey.HEALTH) or {}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path)
    yield rig
    rig.spool.close()


def test_a_heartbeat_reports_the_polls_health_and_is_kept_for_status(rig: Rig) -> None:
    rig.beats.beat("Start", ORIGIN, None)
    rig.poll.succeeded(T0 + timedelta(seconds=1))
    rig.now[0] = T0 + timedelta(seconds=2)
    rig.beats.beat("Periodic", ORIGIN, None)
    start, periodic = rig.records()
    assert (start["HeartbeatReason"], start["ImdsHealthy"], start["LastImdsSuccess"]) == (
        "Start", False, None)  # fmt: skip
    assert (periodic["ImdsHealthy"], periodic["LastImdsSuccess"]) == (
        True, "2026-11-27T05:00:01.000Z")  # fmt: skip
    assert (start["HasPrepareHook"], start["VmId"]) == (True, ORIGIN.identity.vm_id)
    assert start["RecordId"] != periodic["RecordId"]
    health = rig.health()
    assert (health["reason"], health["at"]) == ("Periodic", periodic["TimeGenerated"])
    assert health["started_at"] == start["TimeGenerated"]  # kept from the Start heartbeat
    assert health["heartbeat_interval"] == INTERVAL
    made = rig.metrics.registry.get_sample_value(
        "se_bridge_records_total", {"type": "Heartbeat", "transition": ""}
    )
    assert made == 2


def test_the_periodic_heartbeat_is_due_an_interval_after_the_last(rig: Rig) -> None:
    assert rig.beats.due(rig.clock[0])  # none yet
    rig.beats.beat("Start", ORIGIN, None)
    assert not rig.beats.due(rig.clock[0] + INTERVAL - 0.001)
    assert rig.beats.due(rig.clock[0] + INTERVAL)


def test_the_first_answer_of_imds_reaches_status_before_the_next_heartbeat(rig: Rig) -> None:
    rig.beats.beat("Start", ORIGIN, None)
    rig.poll.succeeded(T0 + timedelta(seconds=3))
    assert rig.poll.changed
    rig.beats.imds_news()
    health = rig.health()
    assert (health["imds_healthy"], health["last_imds_success"]) == (
        True, "2026-11-27T05:00:03.000Z")  # fmt: skip
    assert len(rig.records()) == 1  # no record of its own
    rig.poll.succeeded(T0 + timedelta(seconds=4))
    assert not rig.poll.changed  # still answering: no news


def test_a_failing_imds_reaches_status_with_its_address_and_error(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.db", ["jsonl"])
    poll = PollHealth("http://169.254.169.254")
    beats = Heartbeats(spool, poll, AgentMetrics(telemetry.new_registry()), lambda: T0,
                       interval=INTERVAL, prepare_steps=())  # fmt: skip
    beats.beat("Start", ORIGIN, None)
    poll.failed(RetryableError("IMDS answered 503"), 1.0, T0 + timedelta(seconds=1))
    assert poll.changed
    beats.imds_news()
    health = spool.load_state(StateKey.HEALTH) or {}
    assert health["imds_url"] == "http://169.254.169.254"
    assert (health["imds_healthy"], health["last_imds_success"]) == (False, None)
    assert health["last_imds_error"] == {"at": "2026-11-27T05:00:01.000Z",
                                         "error": "IMDS answered 503"}  # fmt: skip
    poll.failed(RetryableError("IMDS answered 503"), 1.0, T0 + timedelta(seconds=2))
    assert not poll.changed  # the same streak: written once
    spool.close()


def test_the_first_answer_leaves_another_runs_health_alone(rig: Rig, tmp_path: Path) -> None:
    earlier = {"started_at": "2026-11-26T00:00:00.000Z", "imds_healthy": False}
    rig.spool.commit([], state={StateKey.HEALTH: earlier})
    rig.beats.imds_news()  # this run wrote no Start heartbeat: nothing of its own to mend
    assert rig.health() == earlier


def test_a_spool_that_refuses_the_heartbeat_is_a_warning(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def full(*_args: Any, **_kwargs: Any) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(rig.spool, "commit", full)
    with caplog.at_level(logging.WARNING, logger="bridge.agent.loop"):
        rig.beats.beat("Start", ORIGIN, None)
    assert "heartbeat not written to the spool" in caplog.text
    assert "disk is full" in caplog.text


def test_poll_health_backs_off_and_says_a_streak_once(caplog: pytest.LogCaptureFixture) -> None:
    poll = PollHealth()
    with caplog.at_level(logging.INFO, logger="bridge.agent.loop"):
        first = poll.failed(RetryableError("503"), 0.1, T0)
        poll.failed(RetryableError("503"), 0.1, T0)
        later = poll.failed(RetryableError("503"), 0.1, T0)
        assert poll.failed(RetryableError("503"), 60.0, T0) == 60.0  # never sooner than a poll
        poll.succeeded(T0)
    assert first <= 0.5
    assert later >= 1.0  # the backoff grew
    said = [r.getMessage() for r in caplog.records]
    assert said == ["cannot read scheduled events: 503; retrying with backoff",
                    "IMDS answers again after 4 failed polls"]  # fmt: skip
    assert (poll.healthy, poll.last_success) == (True, T0)


def test_a_permanent_failure_of_the_poll_is_an_error(caplog: pytest.LogCaptureFixture) -> None:
    poll = PollHealth()
    with caplog.at_level(logging.WARNING, logger="bridge.agent.loop"):
        poll.failed(PermanentError("IMDS answered 400"), 1.0, T0)
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert not poll.healthy


def test_a_heartbeat_names_the_node_of_an_agent_that_drains_it(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "node.db", ["jsonl"])
    node = NodeHealth("aks-pool1-0", pool="pool1", draining="E1", cordoned=False)
    beats = Heartbeats(spool, PollHealth(), AgentMetrics(telemetry.new_registry()), lambda: T0,
                       interval=INTERVAL, prepare_steps=("hook",), node=lambda: node)  # fmt: skip
    beats.beat("Node", ORIGIN, None)
    [beat] = [json.loads(r.body) for r in spool.read_batch("jsonl", 10)]
    spool.close()
    assert_valid(beat)
    assert (beat["HeartbeatReason"], beat["NodeName"], beat["NodePool"]) == (
        "Node", "aks-pool1-0", "pool1")  # fmt: skip
    assert (beat["NodeDraining"], beat["NodeCordoned"]) == ("E1", False)
