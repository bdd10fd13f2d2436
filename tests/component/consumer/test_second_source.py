"""Event Grid as a second source beside the agents (issue 36): the fold's reconciliation of the
two views of one event, resource health in the budgets, and the refusals, each driving the
real consumer core over a real SQLite state through the intake `se-bridge consume` uses."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bridge.config import ConsumerSettings
from bridge.consumer.core import Consumer
from bridge.consumer.secondsource import EventGridIntake
from bridge.consumer.sources.eventgrid import Trust
from bridge.consumer.state.sqlite import SqliteStore
from bridge.policy.model import Action, Budget, Match, Policy, Rule
from tests.component.consumer.test_core import E1, E2
from tests.support import eventgrid as eg
from tests.support.fleetrecords import SUBSCRIPTION, FleetRecords
from tests.support.records import T0, Sender, assert_valid

ONE_PER_SET = Policy(
    rules=(Rule("all", Match(), Action("approve")),),
    budgets=(Budget("one", "scale_set", max_vms=1),),
)
TRUST = Trust(frozenset({SUBSCRIPTION}), health=True)


class Rig:
    """A consumer with a second source: agents on `agents` of scale set web (rg-app)."""

    def __init__(self, path: Path, *agents: str, health: bool = True, **settings: Any) -> None:
        self.fleet = FleetRecords(T0)
        self.store = SqliteStore(path)
        self.sender = Sender()
        self.decisions: list[Mapping[str, Any]] = []
        self.consumer = Consumer(self.store, self.sender, ONE_PER_SET, self.decisions.extend,
                                 ConsumerSettings(**settings), now=lambda: self.fleet.now,
                                 health=health)  # fmt: skip
        self.intake = EventGridIntake(self.consumer, TRUST)
        for name in agents:
            self.fleet.vm(name, scale_set="web")
        self.consumer.process([self.fleet.heartbeat(name) for name in agents])

    def agent(self, name: str, event_id: str, transition: str = "Scheduled", **kw: Any) -> None:
        self.consumer.process([self.fleet.event(name, event_id, transition=transition, **kw)])

    def azure(self, event_id: str, status: str, resources: list[str], **kw: Any) -> None:
        self.intake.handle([eg.scheduled(event_id, status, resources, self.fleet.now, **kw)])

    def health(self, name: str, state: str) -> None:
        self.intake.handle([eg.health(name, state, self.fleet.now)])

    def approved(self) -> list[str]:
        return [c.event_id for c in self.sender.sent]

    def explain(self, event_id: str) -> list[str]:
        found = self.consumer.explain(event_id)
        assert found is not None
        assert found.verdict is not None
        return list(found.verdict.explanation)


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path / "fleet.db", "web_0", "web_1")


# --- one event, two views --------------------------------------------------------------------


def test_event_grids_records_go_to_the_sinks_beside_the_decisions(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db", "web_0")
    shipped: list[Mapping[str, Any]] = []
    rig.intake = EventGridIntake(rig.consumer, TRUST, shipped.extend)
    rig.azure(E1, "Scheduled", ["web_0"])
    assert [(r["RecordType"], r["Source"], r["EventId"]) for r in shipped] == [
        ("Event", "EventGrid", E1)
    ]
    for record in shipped:
        assert_valid(record)


def test_an_event_reported_by_agents_and_by_event_grid_is_one_event(rig: Rig) -> None:
    rig.azure(E1, "Scheduled", ["web_0"])
    rig.agent("web_0", E1, resources=["web_0"])
    rig.azure(E1, "Scheduled", ["web_0"])  # a documented duplicate
    assert rig.approved() == [E1]
    assert [d["DecisionAction"] for d in rig.decisions] == ["Approve"]
    assert [doc.key for doc in rig.store.scan("event")] == [E1.lower()]


def test_an_event_of_a_vm_without_an_agent_counts_in_its_scale_sets_budget(rig: Rig) -> None:
    rig.azure(E2, "Started", ["web_2"])  # web_2 has no agent: only Azure tells of it
    rig.fleet.advance(1)
    rig.agent("web_0", E1, resources=["web_0"])
    assert rig.approved() == []
    assert "Defer" in [d["DecisionAction"] for d in rig.decisions]


def test_names_resolve_through_the_full_resource_ids(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db")
    # A flexible scale set's VM whose instance metadata names no scale set: its scope is not
    # the scale set's, but its resource id is the one Azure builds from the event's.
    rig.fleet.vm("web_0")
    rig.fleet.vm("web_1")
    beat = rig.fleet.heartbeat("web_0")
    beat["ResourceId"] = eg.compute_id("rg-app", "virtualMachines", "web_0")
    rig.consumer.process([beat, rig.fleet.heartbeat("web_1")])
    rig.azure(E1, "Started", ["web_0"])
    found = rig.consumer.explain(E1)
    assert found is not None
    assert found.view.affected == (rig.fleet.vm_id("web_0"),)


def test_a_completed_from_event_grid_ends_an_event_whose_agent_is_silent(rig: Rig) -> None:
    rig.agent("web_0", E1, "Started", resources=["web_0"])
    rig.azure(E1, "Started", ["web_0"])
    rig.fleet.advance(1)
    rig.agent("web_1", E2, resources=["web_1"])
    assert rig.approved() == []
    rig.fleet.advance(30)  # web_0 rebooting: its agent says nothing yet
    rig.azure(E1, "Completed", ["web_0"])
    rig.consumer.tick()
    assert rig.approved() == [E2]


def test_a_completed_from_the_agents_ends_it_though_event_grid_is_late(rig: Rig) -> None:
    rig.agent("web_0", E1, "Started", resources=["web_0"])
    rig.azure(E1, "Started", ["web_0"])
    rig.fleet.advance(1)
    rig.agent("web_1", E2, resources=["web_1"])
    rig.fleet.advance(30)
    rig.agent("web_0", E1, "Completed", resources=["web_0"])
    rig.consumer.tick()
    assert rig.approved() == [E2]
    # Event Grid's own Started, delivered late, does not bring the event back.
    rig.azure(E1, "Started", ["web_0"])
    found = rig.consumer.explain(E1)
    assert found is not None
    assert found.view.status == "Gone"


def test_an_event_grid_started_is_never_released_by_silence(rig: Rig) -> None:
    rig.azure(E2, "Started", ["web_2"])
    rig.fleet.advance(6 * 3600 - 60)  # far past alive_within and the event's due time
    rig.consumer.process([rig.fleet.heartbeat("web_0"), rig.fleet.heartbeat("web_1")])
    rig.agent("web_0", E1, resources=["web_0"])
    rig.consumer.tick()
    assert rig.approved() == []


def test_disagreements_are_kept_shown_counted_and_the_budget_takes_the_worse(rig: Rig) -> None:
    rig.azure(E1, "Scheduled", ["web_0", "web_1"], event_type="Freeze")
    rig.agent("web_0", E1, resources=["web_0"], event_type="Reboot")
    lines = rig.explain(E1)
    said = [line for line in lines if "Event Grid" in line]
    assert said, lines
    assert any("Freeze" in line and "Reboot" in line for line in said), said
    assert any("web_1" in line for line in said), said
    assert rig.consumer.disagreements["EventType"] == 1
    assert rig.consumer.disagreements["Resources"] == 1
    # Two VMs of a set with one allowed: the event alone breaks the budget (both counted).
    assert [d["DecisionAction"] for d in rig.decisions][-1] == "Hold"


# --- what is refused never frees a slot ------------------------------------------------------


def test_a_forged_completed_from_an_untrusted_topic_frees_nothing(rig: Rig) -> None:
    rig.agent("web_0", E1, "Started", resources=["web_0"])
    rig.fleet.advance(1)
    rig.agent("web_1", E2, resources=["web_1"])
    forged = "/subscriptions/00000000-0000-4000-8000-000000000000"
    rig.azure(E1, "Completed", ["web_0"], topic=forged)
    rig.azure(E1, "Completed", ["web_0"], subscription="00000000-0000-4000-8000-000000000000")
    rig.consumer.tick()
    assert rig.approved() == []
    assert rig.intake.refused == {"untrusted-topic": 2}


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"resource_group": "rg-other"}, "out-of-scope"),
        ({"resources": [f"vm_{n}" for n in range(1001)]}, "too-many-resources"),
    ],
)
def test_a_completed_out_of_scope_or_too_big_frees_nothing(
    tmp_path: Path, change: dict[str, Any], code: str
) -> None:
    rig = Rig(tmp_path / "fleet.db", "web_0", "web_1")
    rig.intake = EventGridIntake(
        rig.consumer, Trust(frozenset({SUBSCRIPTION}), frozenset({"rg-app"}), health=True)
    )
    rig.agent("web_0", E1, "Started", resources=["web_0"])
    rig.fleet.advance(1)
    rig.agent("web_1", E2, resources=["web_1"])
    resources = change.pop("resources", ["web_0"])
    rig.azure(E1, "Completed", resources, **change)
    rig.consumer.tick()
    assert rig.approved() == []
    assert rig.intake.refused == {code: 1}


def test_a_delivery_of_another_type_is_refused_and_counted(rig: Rig) -> None:
    other = ('{"eventType": "Microsoft.Storage.BlobCreated", "topic": "x", '
             '"eventTime": "2022-04-11T22:10:00Z", "data": {"a": 1}}')  # fmt: skip
    rig.intake.handle([other, "not json"])
    assert rig.intake.refused == {"wrong-type": 1, "not-json": 1}


# --- resource health -------------------------------------------------------------------------


def test_a_vm_azure_reports_unavailable_counts_as_impacted_until_available(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db", "web_0", "web_1", "web_2", "web_3")
    rig.health("web_2", "Unavailable")  # its agent still heartbeats: whatever it says
    rig.fleet.advance(60)
    rig.consumer.process([rig.fleet.heartbeat("web_2")])
    rig.agent("web_0", E1, resources=["web_0"])
    assert rig.approved() == []
    assert any("web_2 unavailable since 22:10 (resource health)" in line
               for line in rig.explain(E1)), rig.explain(E1)  # fmt: skip
    rig.fleet.advance(60)
    rig.health("web_2", "Available")
    rig.consumer.tick()
    assert rig.approved() == [E1]


def test_degraded_counts_and_a_vm_without_an_agent_counts_by_its_name(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db", "web_0", "web_1")
    rig.health("web_3", "Degraded")  # no agent on web_3
    rig.agent("web_0", E1, resources=["web_0"])
    assert rig.approved() == []


def test_without_the_health_source_the_present_rule_stands(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db", "web_0", "web_1", health=False)
    rig.health("web_1", "Unavailable")
    rig.agent("web_0", E1, resources=["web_0"])
    assert rig.approved() == [E1]


def test_a_silent_vm_azure_reports_available_is_not_impacted(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db", "web_0", "web_1")
    rig.health("web_1", "Unavailable")
    rig.fleet.advance(3600)  # web_1's agent silent for an hour; web_0's heartbeats on
    rig.health("web_1", "Available")
    rig.consumer.process([rig.fleet.heartbeat("web_0")])
    rig.agent("web_0", E1, resources=["web_0"])
    assert rig.approved() == [E1]


def test_an_event_grid_event_past_its_not_before_counts_as_started(rig: Rig) -> None:
    """Azure starts an unapproved event at NotBefore; its Started delivery may come minutes
    later. Until it does, the event of a VM no agent reports counts as if started, from the
    next re-evaluation pass (every consumer.reevaluate_interval)."""
    rig.azure(E2, "Scheduled", ["web_2"], not_before=rig.fleet.now + timedelta(minutes=1))
    rig.fleet.advance(61)
    rig.consumer.tick()
    rig.agent("web_0", E1, resources=["web_0"])
    rig.consumer.tick()
    assert rig.approved() == []
    found = rig.consumer.explain(E2)
    assert found is not None
    assert found.view.status == "Started"


def test_an_unavailable_report_counts_however_old_it_is(tmp_path: Path) -> None:
    """Azure reports a change of health, not its state again: a VM down for a long repair
    sends nothing more, and its report is all that counts it (its agent is silent). It counts
    until Available, however long that takes (a review of this stop's change)."""
    rig = Rig(tmp_path / "fleet.db", "web_0", "web_1", stale_after=3600)
    rig.health("web_3", "Unavailable")  # no agent on web_3
    rig.agent("web_0", E1, resources=["web_0"])
    assert rig.approved() == []
    rig.fleet.advance(3601)
    rig.consumer.process([rig.fleet.heartbeat("web_0"), rig.fleet.heartbeat("web_1")])
    rig.agent("web_1", E2, resources=["web_1"])
    assert rig.approved() == []
    rig.health("web_3", "Available")
    assert len(rig.approved()) == 1  # the slot web_3 held, to one of the two
