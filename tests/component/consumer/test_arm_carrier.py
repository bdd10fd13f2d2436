"""ARM's acknowledge as the carrier of last resort (issue 36, item 3): the real consumer core
over a real SQLite state, Event Grid deliveries through the intake `se-bridge consume` uses,
and the real ARM client against the ARM double over TLS with tokens the IMDS simulator's
identity endpoint issued. A live agent always carries an approval when one can; ARM only when
none can, under the same budgets, said in the same records."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from bridge.cloud.armack import ArmAcknowledge
from bridge.cloud.identity import credential
from bridge.config import IdentitySettings
from bridge.consumer import armcarrier, wiring
from bridge.retry import RetryableError
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import Fleet
from bridge.simulator.vms import demo_vms
from tests.component.consumer.test_core import E1, E2
from tests.component.consumer.test_second_source import Rig
from tests.doubles.arm import ArmDouble, client_environment, issued_for_arm
from tests.support import eventgrid as eg
from tests.support.records import assert_valid

WEB = eg.compute_id("rg-app", "virtualMachineScaleSets", "web")


@pytest.fixture
def arm(monkeypatch: pytest.MonkeyPatch) -> Iterator[ArmDouble]:
    simulator = Simulator(Fleet(demo_vms(seed=0)))
    with (
        SimulatorServer(simulator) as sim,
        ArmDouble(accept_token=issued_for_arm(simulator.issued)) as d,
    ):
        identity = sim.vm_url(simulator.vm_names[0])
        for name, value in client_environment(d, identity).items():
            monkeypatch.setenv(name, value)
        d.offer(WEB, E1, E2)
        yield d


class ArmRig(Rig):
    """The second source's rig with ARM's acknowledge on (eventgrid.acknowledge)."""

    def __init__(self, path: Path, arm: ArmDouble, *agents: str, **settings: Any) -> None:
        super().__init__(path, *agents, **settings)
        self.waits: list[float] = []
        client = ArmAcknowledge(credential(IdentitySettings(kind="managed")), arm.endpoint,
                                sleep=self.waits.append)  # fmt: skip
        self.approvals: list[Mapping[str, Any]] = []
        self.carrier = armcarrier.install(self.consumer, client, self.approvals.extend,
                                          lambda: self.fleet.now, "consumer")  # fmt: skip

    def through_agents(self) -> list[str]:
        return [c.event_id for c in self.sender.sent]


def test_no_agent_on_any_vm_of_the_event_approves_it_through_arm(
    tmp_path: Path, arm: ArmDouble
) -> None:
    rig = ArmRig(tmp_path / "fleet.db", arm, "web_0", "web_1")
    rig.azure(E1, "Scheduled", ["web_3"])  # web_3 has no agent
    assert arm.acknowledged() == [E1.lower()]
    assert rig.through_agents() == []
    (decision,) = [d for d in rig.decisions if d["DecisionAction"] == "Approve"]
    assert decision["TargetVmId"] is None
    assert "ARM's acknowledge" in decision["DecisionReason"]
    (approval,) = rig.approvals
    assert (approval["ApprovalSource"], approval["ApprovalOutcome"]) == ("ARM", "Approved")
    assert approval["CommandId"] == decision["CommandId"]
    assert approval["VmId"] is None
    for record in (decision, approval):
        assert_valid(record)
    # Confirmed in the ledger: later passes neither ask ARM again nor anyone else.
    rig.fleet.advance(120)
    rig.consumer.tick()
    assert len(arm.requests) == 1
    assert rig.through_agents() == []


def test_a_live_agent_is_always_preferred_to_arm(tmp_path: Path, arm: ArmDouble) -> None:
    rig = ArmRig(tmp_path / "fleet.db", arm, "web_0", "web_1")
    rig.azure(E1, "Scheduled", ["web_0"])
    rig.agent("web_0", E1, resources=["web_0"], source="Platform")
    rig.fleet.advance(1)
    rig.consumer.tick()
    assert rig.through_agents() == [E1]
    assert arm.requests == []


def test_every_agent_silent_hands_the_approval_to_arm(tmp_path: Path, arm: ArmDouble) -> None:
    rig = ArmRig(tmp_path / "fleet.db", arm, "web_0", "web_1", approval_timeout=30.0)
    rig.azure(E1, "Scheduled", ["web_0"])
    rig.agent("web_0", E1, resources=["web_0"], source="Platform")
    assert rig.through_agents() == [E1]
    # web_0 never answers (its agent stopped reading its queue): after approval_timeout the
    # approval is decided again, web_0 having been tried, and no other agent can carry it.
    rig.fleet.advance(31)
    rig.consumer.tick()
    assert arm.acknowledged() == [E1.lower()]
    approvals = [d for d in rig.decisions if d["DecisionAction"] == "Approve"]
    assert [d["Attempt"] for d in approvals] == [1, 2]
    assert approvals[1]["TargetVmId"] is None


def test_a_429_is_waited_out_as_arm_asks_then_the_event_is_approved(
    tmp_path: Path, arm: ArmDouble
) -> None:
    rig = ArmRig(tmp_path / "fleet.db", arm, "web_0")
    arm.script(429, retry_after="4")
    rig.azure(E1, "Scheduled", ["web_3"])
    assert [r.status for r in arm.requests] == [429, 200]
    assert rig.waits == [4.0]
    assert arm.acknowledged() == [E1.lower()]


def test_a_failure_is_an_error_and_a_count_and_the_approval_is_sent_again_not_doubled(
    tmp_path: Path, arm: ArmDouble, caplog: pytest.LogCaptureFixture
) -> None:
    rig = ArmRig(tmp_path / "fleet.db", arm, "web_0")
    arm.script(503, count=4)  # the client's own tries, all failing
    with caplog.at_level(logging.ERROR), pytest.raises(RetryableError):
        rig.azure(E1, "Scheduled", ["web_3"])
    assert arm.acknowledged() == []
    assert rig.carrier.outcomes["failed"] == 1
    assert any("ARM's acknowledge of event" in r.getMessage() and r.levelno == logging.ERROR
               for r in caplog.records)  # fmt: skip
    # The batch is handed over again (nothing checkpointed), and the next pass resends the
    # approval decided: the same command, one approval, one Decision record's id.
    rig.fleet.advance(11)
    rig.consumer.tick()
    assert arm.acknowledged() == [E1.lower()]
    approvals = [d for d in rig.decisions if d["DecisionAction"] == "Approve"]
    assert len({d["RecordId"] for d in approvals}) == 1
    assert [a["ApprovalOutcome"] for a in rig.approvals] == ["Approved"]
    assert len({r.event_ids for r in arm.requests if r.status == 200}) == 1


def test_arm_approvals_take_the_same_budget_as_an_agents(tmp_path: Path, arm: ArmDouble) -> None:
    # One VM of scale set web at a time: the second agent-less VM's event waits for the first.
    rig = ArmRig(tmp_path / "fleet.db", arm, "web_0")
    rig.azure(E1, "Scheduled", ["web_2"])
    rig.azure(E2, "Scheduled", ["web_3"])
    assert arm.acknowledged() == [E1.lower()]
    assert [d["DecisionAction"] for d in rig.decisions if d["EventId"] == E2][-1] == "Defer"
    rig.fleet.advance(60)
    rig.azure(E1, "Completed", ["web_2"])
    rig.fleet.advance(1)
    rig.consumer.tick()
    assert arm.acknowledged() == sorted([E1.lower(), E2.lower()])


def test_arm_refusing_is_tried_once_and_the_event_waits_for_an_agent(
    tmp_path: Path, arm: ArmDouble
) -> None:
    rig = ArmRig(tmp_path / "fleet.db", arm, "web_0")
    other = "22222222-2222-4222-8222-222222222222"  # not offered: ARM knows no such event
    rig.azure(other, "Scheduled", ["web_3"])
    assert [a["ApprovalOutcome"] for a in rig.approvals] == ["Refused"]
    rig.fleet.advance(5)
    rig.consumer.tick()
    rig.fleet.advance(5)
    rig.consumer.tick()
    assert len(arm.requests) == 1
    assert rig.decisions[-1]["DecisionAction"] == "Defer"


@pytest.mark.parametrize("on", [False, True])
def test_the_consumer_is_built_with_arm_in_front_only_when_eventgrid_acknowledge_is_on(
    tmp_path: Path, on: bool
) -> None:
    environ = {
        "SE_BRIDGE_COMMANDS_CHANNEL": f"local:{tmp_path / 'queues'}",
        "SE_BRIDGE_COMMANDS_ALLOW_UNSIGNED": "true",
        "SE_BRIDGE_CONSUMER_STATE": f"sqlite:{tmp_path / 'fleet.db'}",
        "SE_BRIDGE_EVENTGRID_ENABLED": "true",
        "SE_BRIDGE_EVENTGRID_HUB": "eventgrid",
        "SE_BRIDGE_EVENTGRID_SUBSCRIPTIONS": "8d5f9c8e-1111-4222-8333-444455556666",
        "SE_BRIDGE_EVENTGRID_ACKNOWLEDGE": "true" if on else "false",
    }
    config = wiring.load_config(environ=environ)
    consumer = wiring.build_consumer(config, lambda _: None)
    try:
        assert isinstance(consumer.dispatch.sender, armcarrier.ArmCarrier) is on
        assert consumer.decider.last_resort is on
    finally:
        consumer.close()


def test_a_spot_rebalance_recommendation_from_event_grid_is_never_acknowledged(
    tmp_path: Path, arm: ArmDouble
) -> None:
    # Before issue 40 it was an Event record like any other, and ARM approved it here.
    rig = ArmRig(tmp_path / "fleet.db", arm, "web_0", "web_1")
    rig.azure(E1, "Scheduled", ["web_3"], event_type="SpotRebalanceRecommendation")
    rig.fleet.advance(120)
    rig.consumer.tick()
    assert arm.acknowledged() == []
    assert rig.through_agents() == []
    assert not [d for d in rig.decisions if d["DecisionAction"] == "Approve"]
