"""`se-bridge consume`'s periodic threads keep turning (issue 36's review): a pass that fails is
said once per kind at ERROR with what to do, counted in se_bridge_consumer_failures_total, and
the next pass runs on schedule, against the real ConsumerService on SQLite and a local hub."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge.consumer import wiring
from bridge.consumer.secondsource import FleetKnown
from bridge.consumer.service import ConsumerService
from bridge.consumer.sources import hub
from tests.component.consumer.test_resource_graph import FailingKnown
from tests.support.wait import eventually


def built(tmp_path: Path, **settings: str) -> ConsumerService:
    """A consumer on SQLite and a local hub under `tmp_path`, with `settings` (SE_BRIDGE_...)."""
    environ = {
        "SE_BRIDGE_COMMANDS_CHANNEL": f"local:{tmp_path / 'queues'}",
        "SE_BRIDGE_COMMANDS_ALLOW_UNSIGNED": "true",
        "SE_BRIDGE_CONSUMER_STATE": f"sqlite:{tmp_path / 'fleet.db'}",
        "SE_BRIDGE_CONSUMER_STATE_DIR": str(tmp_path / "consumer"),
        "SE_BRIDGE_CONSUMER_HUB": str(tmp_path / "hub"),
        "SE_BRIDGE_EVENTGRID_HUB": str(tmp_path / "eventgrid"),
        "SE_BRIDGE_EVENTGRID_SUBSCRIPTIONS": "8d5f9c8e-1111-4222-8333-444455556666",
        **{f"SE_BRIDGE_{key.upper()}": value for key, value in settings.items()},
    }
    return ConsumerService(wiring.load_config(environ=environ))


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ConsumerService]:
    made = built(tmp_path, consumer_reevaluate_interval="0.2")
    try:
        yield made
    finally:
        made.close()


def failures(service: ConsumerService, activity: str, kind: str) -> float | None:
    labels = {"activity": activity, "kind": kind}
    return service.metrics.registry.get_sample_value("se_bridge_consumer_failures_total", labels)


def test_a_failed_re_evaluation_is_said_once_at_error_counted_and_the_next_one_runs(
    service: ConsumerService, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="bridge.consumer.service")
    tick = service.consumer.tick
    calls: list[int] = []

    def failing_twice() -> None:
        calls.append(1)
        if len(calls) <= 2:
            raise sqlite3.OperationalError("database is locked")
        tick()

    monkeypatch.setattr(service.consumer, "tick", failing_twice)
    stop = threading.Event()
    ticks = threading.Thread(target=service._ticks, args=(stop,))
    ticks.start()
    try:
        eventually(lambda: len(calls) >= 4 or not ticks.is_alive(), 60, "later passes")
        assert ticks.is_alive()
    finally:
        stop.set()
        ticks.join(timeout=30)
    said = [r for r in caplog.records if "re-evaluating" in r.getMessage()]
    errors = [r for r in said if r.levelno >= logging.WARNING]
    assert [r.levelno for r in errors] == [logging.ERROR], [r.getMessage() for r in said]
    assert "OperationalError" in errors[0].getMessage()
    assert "consumer.state" in errors[0].getMessage()  # what to check
    assert failures(service, "reevaluate", "OperationalError") == 2
    assert any("works again" in r.getMessage() for r in said)
    assert service.ready()[0]  # /readyz is ready again once a pass went through


def test_a_failed_event_grid_reader_is_started_again_and_the_consumer_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the consumer stopped, with exit code 0, which systemd's Restart=on-failure
    does not restart: every approval of the fleet stopped for good."""
    caplog.set_level(logging.INFO, logger="bridge.consumer.service")
    service = built(tmp_path, eventgrid_enabled="true")
    real = hub.run_local
    started: list[int] = []

    def failing_once(*args: Any, **kwargs: Any) -> None:
        started.append(1)
        if len(started) == 1:
            raise sqlite3.DatabaseError("file is not a database")
        real(*args, **kwargs)

    monkeypatch.setattr("bridge.consumer.service.run_local", failing_once)
    stop = threading.Event()
    reader = threading.Thread(target=service._read_azure, args=(stop,))
    reader.start()
    try:
        eventually(lambda: len(started) >= 2 or stop.is_set(), 60, "the reader started again")
        assert not stop.is_set(), "the consumer was stopped"
        eventually(lambda: failures(service, "eventgrid_read", "DatabaseError") == 1, 60)
    finally:
        stop.set()
        reader.join(timeout=30)
        service.close()
    said = [r for r in caplog.records if r.name == "bridge.consumer.service"]
    errors = [r.getMessage() for r in said if r.levelno >= logging.WARNING]
    assert len(errors) == 1, errors
    assert "DatabaseError" in errors[0]
    assert "eventgrid.hub" in errors[0]


def test_the_reconcilers_failed_passes_are_in_the_consumers_metrics(tmp_path: Path) -> None:
    service = built(
        tmp_path,
        eventgrid_enabled="true",
        eventgrid_health="true",
        eventgrid_reconcile_interval="300",
    )
    try:
        reconciler = service.reconciler
        assert reconciler is not None
        # The fleet state fails before Resource Graph is asked anything.
        reconciler.known = FailingKnown(FleetKnown(service.consumer), failures=1)
        reconciler.once(300)
        assert failures(service, "reconcile", "OperationalError") == 1
    finally:
        service.close()
