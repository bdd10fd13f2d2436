"""The Resource Graph reconciler (issue 36, item 4): what a lost Event Grid delivery missed is
caught by a query of Resource Graph, through the same intake, refusals and fold, against the
real consumer core on SQLite and the real client code over HTTPS (the Resource Graph double)."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.core.credentials import AccessToken

from bridge.consumer.secondsource import EventGridIntake, FleetKnown
from bridge.consumer.sources import eventgrid
from bridge.consumer.sources.eventgrid import Parsed, Trust
from bridge.consumer.sources.resourcegraph import (
    Reconciler,
    RequestsTransport,
    ResourceGraph,
)
from bridge.retry import Backoff, PermanentError
from tests.component.consumer.test_core import E1, E2
from tests.component.consumer.test_second_source import TRUST, Rig
from tests.doubles.resourcegraph import ResourceGraphDouble, row_of
from tests.support import eventgrid as eg
from tests.support.fleetrecords import SUBSCRIPTION
from tests.support.wait import eventually


class Token:
    """The consumer's identity as the reconciler asks it (azure-core's TokenCredential)."""

    def __init__(self) -> None:
        self.scopes: list[str] = []

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.scopes += scopes
        return AccessToken("eyJ0eXAiOiJKV1QifQ.e30.c2ln", 2**31)


class Reconciled(Rig):
    """The second source's rig with a reconciler reading `graph`."""

    def __init__(self, path: Path, graph: ResourceGraphDouble, *agents: str,
                 trust: Trust = TRUST) -> None:  # fmt: skip
        super().__init__(path, *agents)
        self.intake = EventGridIntake(self.consumer, trust)
        self.graph = graph
        self.slept: list[float] = []
        self.token = Token()
        client = ResourceGraph(graph.url, self.token, RequestsTransport(),
                               sleep=self._sleep,
                               backoff=Backoff(initial=0.01, maximum=60.0))  # fmt: skip
        self.reconciler = Reconciler(client, self.intake, FleetKnown(self.consumer),
                                     lambda: self.fleet.now)  # fmt: skip

    def _sleep(self, seconds: float) -> bool:
        self.slept.append(seconds)
        return True

    def row(self, event_id: str, status: str, resources: list[str], **kw: Any) -> None:
        """Azure holds this event so (the row replaces the event's earlier one)."""
        rows = self.graph.tables["maintenanceresources"]
        rows[:] = [r for r in rows if r["name"] != event_id]
        rows.append(row_of(eg.scheduled(event_id, status, resources, self.fleet.now, **kw)))

    def health_row(self, name: str, state: str) -> None:
        rows = self.graph.tables["healthresources"]
        target = row_of(eg.health(name, state, self.fleet.now))
        rows[:] = [r for r in rows if r["id"] != target["id"]] + [target]


@pytest.fixture
def rec(tmp_path: Path, graph: ResourceGraphDouble) -> Reconciled:
    return Reconciled(tmp_path / "fleet.db", graph, "web_0", "web_1")


def test_a_lost_started_of_a_vm_without_an_agent_is_caught_and_holds_the_slot(
    rec: Reconciled,
) -> None:
    rec.row(E2, "Started", ["web_2"])  # Event Grid's delivery of it was lost
    chosen = rec.reconciler.reconcile()
    assert [e["EventId"] for e in chosen.events] == [E2]
    rec.fleet.advance(1)
    rec.agent("web_0", E1, resources=["web_0"])
    assert rec.approved() == []
    # What was read is asked as the consumer's identity, for ARM.
    assert rec.token.scopes
    assert set(rec.token.scopes) == {f"{rec.graph.url}/.default"}
    assert all(r.authorized for r in rec.graph.requests)


def test_a_lost_completed_is_caught_and_frees_the_slot(rec: Reconciled) -> None:
    rec.azure(E2, "Started", ["web_2"])  # delivered
    rec.fleet.advance(1)
    rec.agent("web_0", E1, resources=["web_0"])
    assert rec.approved() == []
    rec.fleet.advance(600)
    rec.row(E2, "Completed", ["web_2"])  # its Completed delivery was lost
    rec.reconciler.reconcile()
    rec.consumer.tick()
    assert rec.approved() == [E1]


def test_a_lagging_row_never_undoes_what_event_grid_said_since(rec: Reconciled) -> None:
    rec.azure(E2, "Started", ["web_2"])
    rec.row(E2, "Scheduled", ["web_2"])  # Resource Graph minutes behind
    rec.fleet.advance(1)
    assert rec.reconciler.reconcile().events == []
    rec.agent("web_0", E1, resources=["web_0"])
    assert rec.approved() == []
    # And what the fleet state holds already is not folded again, pass after pass.
    rec.row(E2, "Started", ["web_2"])
    assert rec.reconciler.reconcile().events == []
    assert rec.intake.events == 1


def test_an_end_of_an_event_nobody_holds_is_not_folded(rec: Reconciled) -> None:
    rec.row(E2, "Completed", ["web_2"])
    assert rec.reconciler.reconcile().events == []
    assert rec.consumer.explain(E2) is None


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"resource_group": "rg-other"}, "out-of-scope"),
        ({"resources": [f"web_{n}" for n in range(1001)]}, "too-many-resources"),
    ],
)
def test_rows_are_refused_as_deliveries_are_and_free_nothing(
    tmp_path: Path, graph: ResourceGraphDouble, change: dict[str, Any], code: str
) -> None:
    trust = Trust(frozenset({SUBSCRIPTION}), frozenset({"rg-app"}), health=True)
    rec = Reconciled(tmp_path / "fleet.db", graph, "web_0", "web_1", trust=trust)
    rec.agent("web_0", E1, "Started", resources=["web_0"])
    rec.fleet.advance(1)
    rec.agent("web_1", E2, resources=["web_1"])
    resources = change.pop("resources", ["web_0"])
    rec.row(E1, "Completed", resources, **change)
    if code == "out-of-scope":  # the query narrows to the fleet's groups: Azure sends it anyway
        graph.tables["maintenanceresources"][-1]["resourceGroup"] = "rg-app"
    rec.reconciler.reconcile()
    rec.consumer.tick()
    assert rec.approved() == []
    assert rec.intake.refused == {code: 1}


def test_a_row_about_another_subscription_is_refused(rec: Reconciled) -> None:
    rec.agent("web_0", E1, "Started", resources=["web_0"])
    rec.fleet.advance(1)
    rec.agent("web_1", E2, resources=["web_1"])
    rec.row(E1, "Completed", ["web_0"])
    row = rec.graph.tables["maintenanceresources"][-1]
    row["id"] = row["id"].replace(SUBSCRIPTION, "00000000-0000-4000-8000-000000000000")
    rec.reconciler.reconcile()
    rec.consumer.tick()
    assert rec.approved() == []
    assert rec.intake.refused == {"wrong-subscription": 1}


def test_a_lost_unavailable_holds_the_slot_and_a_lost_available_frees_it(rec: Reconciled) -> None:
    rec.health_row("web_1", "Unavailable")
    assert len(rec.reconciler.reconcile().health) == 1
    rec.fleet.advance(60)
    rec.agent("web_0", E1, resources=["web_0"])
    assert rec.approved() == []
    assert rec.reconciler.reconcile().health == []  # folded once, not pass after pass
    rec.fleet.advance(60)
    rec.health_row("web_1", "Available")
    assert len(rec.reconciler.reconcile().health) == 1
    rec.consumer.tick()
    assert rec.approved() == [E1]


def test_an_available_vm_never_held_down_is_not_folded(rec: Reconciled) -> None:
    for name in ("web_0", "web_1", "web_2"):
        rec.health_row(name, "Available")
    assert rec.reconciler.reconcile().health == []


def test_pages_are_followed_with_the_skip_token(rec: Reconciled) -> None:
    rows = rec.graph.tables["healthresources"]
    for n in range(2500):
        rows.append(row_of(eg.health(f"web_{n}", "Degraded", rec.fleet.now)))
    rec.reconciler.reconcile()
    pages = [r.page for r in rec.graph.requests if r.table == "healthresources"]
    assert pages == [0, 1, 2]
    assert rec.reconciler.cost.rows == 2500


def test_a_429_waits_its_retry_after_through_the_backoff(rec: Reconciled) -> None:
    rec.graph.throttle, rec.graph.retry_after = 2, 7
    rec.row(E2, "Started", ["web_2"])
    rec.reconciler.reconcile()
    assert [r.status for r in rec.graph.requests][:3] == [429, 429, 200]
    assert rec.slept[:2] == [pytest.approx(7, abs=0.01)] * 2
    assert rec.reconciler.cost.throttled == 2
    assert rec.intake.events == 1


def test_a_spent_quota_is_waited_out_before_the_next_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ResourceGraphDouble(quota=2, window=30) as graph:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(graph.ca_bundle))
        rec = Reconciled(tmp_path / "fleet.db", graph, "web_0")
        rec.reconciler.reconcile()  # two queries: the quota is spent by the second
        assert [r.status for r in graph.requests] == [200, 200]
        assert rec.slept
        assert 0 < rec.slept[-1] <= 30


def test_a_refused_identity_fails_the_pass_and_folds_nothing(rec: Reconciled) -> None:

    class NoToken(Token):
        def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            return AccessToken("", 2**31)

    rec.reconciler.graph._credential = NoToken()
    rec.row(E2, "Started", ["web_2"])
    with pytest.raises(PermanentError, match="401"):
        rec.reconciler.reconcile()
    assert rec.reconciler.cost.failed_passes == 1
    assert rec.intake.events == 0


def test_a_delivery_read_after_a_row_still_wins_when_it_is_newer_than_resource_graphs_lag(
    rec: Reconciled,
) -> None:
    """After a restart the reconciler may pass before the hub's backlog is read: a row folded
    then must not hide a delivery Azure made after Resource Graph last saw the event."""
    rec.row(E2, "Scheduled", ["web_2"])
    rec.reconciler.reconcile()
    started = eg.scheduled(E2, "Started", ["web_2"], rec.fleet.now - timedelta(minutes=2))
    rec.intake.handle([started])  # the backlog: Azure started it two minutes ago
    found = rec.consumer.explain(E2)
    assert found is not None
    assert found.view.status == "Started"


def test_a_run_of_failed_passes_is_said_once_and_the_next_pass_tries_again(
    rec: Reconciled, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bridge.consumer.sources.resourcegraph")
    rec.graph.throttle = 10**6  # Resource Graph throttles every query: every pass fails
    rec.reconciler.graph._sleep = lambda seconds: True
    stop = threading.Event()
    runner = threading.Thread(target=rec.reconciler.run, args=(stop, 0.01))
    runner.start()
    try:
        eventually(lambda: rec.reconciler.cost.failed_passes >= 3, 60, "three failed passes")
        rec.row(E2, "Started", ["web_2"])
        rec.graph.throttle = 0
        eventually(lambda: rec.intake.events == 1, 60, "a pass that folds the row")
    finally:
        stop.set()
        runner.join(timeout=30)
    said = [r.getMessage() for r in caplog.records if "reconciler's pass failed" in r.getMessage()]
    assert len(said) == 1, said
    assert any("reconciler works again" in r.getMessage() for r in caplog.records)


# --- a pass that fails for another reason than Resource Graph's (issue 36, review) ------------

E3 = "B2C3D4E5-0000-4000-8000-000000000003"


class FailingKnown:
    """The fleet state as the reconciler reads it, failing the first `failures` reads (a
    SQLite database locked, a Table Storage outage)."""

    def __init__(self, inner: FleetKnown, failures: int) -> None:
        self.inner, self.failures = inner, failures

    def events(self, event_ids: Sequence[str]) -> Mapping[str, Mapping[str, Any]]:
        return self.inner.events(event_ids)

    def health(self) -> Mapping[str, Mapping[str, Any]]:
        if self.failures:
            self.failures -= 1
            raise sqlite3.OperationalError("database is locked")
        return self.inner.health()


def test_a_pass_the_fleet_state_fails_is_said_at_error_once_and_the_next_pass_runs(
    rec: Reconciled, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bridge.consumer.sources.resourcegraph")
    rec.reconciler.known = FailingKnown(FleetKnown(rec.consumer), failures=2)
    rec.row(E2, "Started", ["web_2"])  # Event Grid's delivery of it was lost
    stop = threading.Event()
    runner = threading.Thread(target=rec.reconciler.run, args=(stop, 0.01))
    runner.start()
    try:
        # A reconciler thread that died would never fold the row: not waited for past its death.
        eventually(lambda: rec.intake.events == 1 or not runner.is_alive(), 60, "a later pass")
        assert runner.is_alive(), "the reconciler's thread ended on a failed pass"
        assert rec.intake.events == 1
    finally:
        stop.set()
        runner.join(timeout=30)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "OperationalError" in errors[0].getMessage()
    assert "the next pass" in errors[0].getMessage()
    assert rec.reconciler.guard.counts() == {"OperationalError": 2}
    assert rec.reconciler.cost.failed_passes == 2
    assert any("works again" in r.getMessage() for r in caplog.records)


def test_one_row_that_cannot_be_folded_keeps_no_other_row_of_its_pass_out(
    rec: Reconciled, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    process = rec.consumer.process

    def buggy(records: Sequence[Any], position: Any = None) -> None:
        if any(r.get("EventId") == E2 for r in records):
            raise KeyError("a bug in the handling of one event")
        process(records, position)

    monkeypatch.setattr(rec.consumer, "process", buggy)
    rec.row(E2, "Started", ["web_2"])
    rec.row(E3, "Started", ["web_3"])
    rec.health_row("web_1", "Unavailable")
    rec.reconciler.once(300)  # raises nothing
    assert rec.consumer.explain(E2) is None
    assert rec.consumer.explain(E3) is not None  # the other row of the pass is folded
    assert rec.intake.health == 1  # and so is the health row
    assert rec.reconciler.rows.counts() == {"KeyError": 1}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert E2 in errors[0]


def test_one_row_the_parser_fails_on_keeps_no_other_row_of_its_pass_out(
    rec: Reconciled, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = eventgrid.parse

    def buggy(body: str, trust: Trust) -> Parsed:
        if E2 in body:
            raise TypeError("a bug in the parser")
        return real(body, trust)

    monkeypatch.setattr("bridge.consumer.secondsource.parse", buggy)
    rec.row(E2, "Started", ["web_2"])
    rec.row(E3, "Started", ["web_3"])
    rec.reconciler.once(300)
    assert rec.consumer.explain(E3) is not None
    assert rec.intake.guard.counts() == {"TypeError": 1}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert "a Resource Graph row" in errors[0]


def test_a_lost_rebalance_recommendation_is_carried_as_an_advisory_never_approved(
    rec: Reconciled,
) -> None:
    # Before: the reconciler planned Event records only, and dropped the recommendation that
    # the Event Grid path carries (issue 40's leftover 6).
    rec.row(E2, "Scheduled", ["web_0"], event_type="SpotRebalanceRecommendation")
    chosen = rec.reconciler.reconcile()
    assert [(e["RecordType"], e["EventId"]) for e in chosen.events] == [("Advisory", E2)]
    found = rec.consumer.explain(E2)
    assert found is not None
    assert found.view.advisory
    rec.fleet.advance(120)
    rec.consumer.tick()
    assert rec.approved() == []
    # Told once: the next pass finds it held and folds it no more.
    assert rec.reconciler.reconcile().events == []
    # Its Completed, lost too, clears it.
    rec.row(E2, "Completed", ["web_0"], event_type="SpotRebalanceRecommendation")
    assert [e["AdvisoryState"] for e in rec.reconciler.reconcile().events] == ["Cleared"]  # type: ignore[typeddict-item]
    assert rec.approved() == []
