"""`se-bridge status` judges a spool as a monitoring check would (pure `assess`)."""

from __future__ import annotations

import unicodedata
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from bridge.agent.status import assess, render
from bridge.monitoring import CRITICAL, OK, WARNING
from bridge.outbox.inspect import SinkStatus, SpoolStatus
from bridge.outbox.spool import StateKey

NOW = datetime(2026, 11, 26, 7, 0, tzinfo=timezone.utc)
AGE = timedelta(minutes=15)


def spool(
    health: dict[str, Any] | None,
    *,
    shed: int = 0,
    sink: SinkStatus | None = None,
    state: dict[str, dict[str, Any]] | None = None,
) -> SpoolStatus:
    state = {**({StateKey.HEALTH: health} if health else {}), **(state or {})}
    sinks = (sink or SinkStatus("jsonl:/x", 0, None, 0),)
    return SpoolStatus(Path("/s/spool.db"), 0, 0, shed, sinks, state, ())


def health(at: datetime, success: datetime | None, reason: str = "Periodic") -> dict[str, Any]:
    iso = "%Y-%m-%dT%H:%M:%S.000Z"
    return {
        "at": at.strftime(iso),
        "reason": reason,
        "imds_healthy": success is not None,
        "last_imds_success": success.strftime(iso) if success else None,
        "started_at": (at - timedelta(hours=1)).strftime(iso),
        "heartbeat_interval": 300,
    }


@pytest.mark.parametrize(
    ("status", "level", "said"),
    [
        (spool(health(NOW - timedelta(minutes=4), NOW - timedelta(minutes=4))), OK, ""),
        (spool(None), CRITICAL, "no heartbeat recorded"),
        (spool(health(NOW - timedelta(minutes=12), NOW - timedelta(minutes=12))), CRITICAL,
         "no heartbeat since"),
        (spool(health(NOW, NOW, reason="Stop")), CRITICAL, "the agent stopped"),
        (spool(health(NOW, NOW - timedelta(minutes=20))), CRITICAL, "IMDS had not answered"),
        (spool(health(NOW, None)), CRITICAL, "since the agent started"),
        (spool(health(NOW, NOW), shed=3), WARNING, "3 records were shed"),
        (spool(health(NOW, NOW), sink=SinkStatus("eventhubs", 9, "2026-11-26T06:30:00.000Z", 0)),
         WARNING, "eventhubs has 9 records waiting"),
        (spool(health(NOW, NOW), sink=SinkStatus("eventhubs", 0, None, 2)), WARNING,
         "2 records aside as dead letters"),
    ],
)  # fmt: skip
def test_each_condition_sets_its_level(status: SpoolStatus, level: int, said: str) -> None:
    report = assess(status, NOW, AGE, AGE)
    assert report.level == level
    assert said in " ".join(report.problems)


def test_imds_that_never_answered_is_never_ok() -> None:
    beat = health(NOW, None)
    beat["started_at"] = beat["at"]  # the Start heartbeat, written before the first poll
    report = assess(spool(beat), NOW, AGE, AGE)
    assert report.level == WARNING
    assert "IMDS has not answered since the agent started" in " ".join(report.problems)


def test_a_sinks_last_error_is_shown_and_a_permanent_one_warns() -> None:
    trouble = {"error": "no token for Event Hubs (ManagedIdentityCredential unavailable)",
               "kind": "permanent", "since": "2026-11-26T06:58:00.000Z"}  # fmt: skip
    status = spool(
        health(NOW, NOW),
        sink=SinkStatus("eventhubs", 0, None, 0),
        state={StateKey.DELIVERY: {"sinks": {"eventhubs": trouble}}},
    )
    report = assess(status, NOW, AGE, AGE)
    assert report.level == WARNING
    assert "sink eventhubs cannot deliver since 2026-11-26T06:58:00.000Z: no token" in " ".join(
        report.problems
    )
    assert report.spool["sinks"][0]["last_error"] == trouble
    assert "failing since 2026-11-26T06:58:00.000Z: no token for Event Hubs" in render(report)
    retrying = {**trouble, "kind": "retryable", "error": "503 from Event Hubs"}
    status = spool(health(NOW, NOW), sink=SinkStatus("eventhubs", 0, None, 0),
                   state={StateKey.DELIVERY: {"sinks": {"eventhubs": retrying}}})  # fmt: skip
    shown = assess(status, NOW, AGE, AGE)
    assert shown.level == OK
    assert "503 from Event Hubs" in render(shown)


def test_text_from_the_spool_cannot_drive_the_terminal() -> None:
    hostile = "vm\x1b]0;owned\x07\x1b[2J\nOK: all well\u202e"
    status = spool(
        health(NOW, NOW),
        sink=SinkStatus(f"jsonl:/x{hostile}", 0, None, 0),
        state={StateKey.IDENTITY: {"vm_name": hostile}},
    )
    text = render(assess(status, NOW, AGE, AGE))
    assert not [ch for ch in text if unicodedata.category(ch) in ("Cc", "Cf") and ch != "\n"]
    assert "vm\\x1b]0;owned\\x07\\x1b[2J\\nOK: all well\\u202e" in text
    assert not [line for line in text.splitlines() if line.startswith("OK: all well")]


def drain_status(status: str, jobs: tuple[tuple[str, dict[str, Any]], ...]) -> SpoolStatus:
    blocker = {"Namespace": "shop", "Pod": "web-1", "Reason": "eviction refused",
               "PodDisruptionBudget": "web-pdb"}  # fmt: skip
    last = {"node": "aks-pool1-0", "event": "E1", "phase": "prepare", "status": status,
            "at": "2026-11-26T06:58:00.000Z", "detail": "drain ... is blocked",
            "blockers": [blocker]}  # fmt: skip
    base = spool(health(NOW, NOW), state={StateKey.DRAIN: last})
    return SpoolStatus(base.path, 0, 0, 0, base.sinks, base.state, jobs)


def test_a_drain_blocked_now_warns_and_names_its_blockers() -> None:
    job = ("j1", {"kind": "drain", "job_id": "j1", "phase": "prepare", "event_id": "E1",
                  "transition": "Scheduled", "trigger": "c1"})  # fmt: skip
    report = assess(drain_status("Blocked", (job,)), NOW, AGE, AGE)
    assert report.level == WARNING
    assert "the drain of node aks-pool1-0 for event E1 is blocked" in report.problems[0]
    text = render(report)
    assert "node drains running: 1" in text
    assert "  drain for E1" in text
    assert "pod shop/web-1: eviction refused (PodDisruptionBudget web-pdb)" in text
    assert report.hooks == []  # a drain is no hooks.prepare command


def test_a_drain_that_ended_is_shown_but_is_ok() -> None:
    report = assess(drain_status("Blocked", ()), NOW, AGE, AGE)
    assert report.level == OK
    assert "last: node aks-pool1-0, event E1: Blocked" in render(report)


def test_a_prepare_hook_held_behind_the_drain_says_what_it_waits_for() -> None:
    trigger = {"EventId": "E1"}
    held = ("h1", {"job_id": "h1", "phase": "prepare", "trigger": trigger, "after": "drain",
                   "earlier_ok": True})  # fmt: skip
    free = ("h2", {"job_id": "h2", "phase": "recover", "trigger": trigger})
    report = assess(drain_status("Drained", (held, free)), NOW, AGE, AGE)
    text = render(report)
    assert "hooks running: 2" in text
    assert "  prepare for E1 (waits for the drain)" in text
    assert "  recover for E1\n" in text + "\n"
