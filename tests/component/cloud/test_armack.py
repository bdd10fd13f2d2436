"""ARM's acknowledge (bridge.cloud.armack) against the strict ARM double over TLS, with a real
managed-identity token from the IMDS simulator's identity endpoint: the production client runs
unchanged (its credential is the consumer's, bridge.cloud.identity)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bridge.cloud.armack import API_VERSION, ArmAcknowledge
from bridge.cloud.identity import credential
from bridge.config import IdentitySettings
from bridge.retry import PermanentError, ThrottledError
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import Fleet
from bridge.simulator.vms import demo_vms
from tests.doubles.arm import ArmDouble, client_environment, issued_for_arm

SCALE_SET = ("/subscriptions/8d5f9c8e-1111-4222-8333-444455556666/resourceGroups/rg-web/"
             "providers/Microsoft.Compute/virtualMachineScaleSets/web")  # fmt: skip
E1 = "c7061bac-afdc-4513-b24b-aa5f13a16123"
E2 = "11111111-1111-4111-8111-111111111111"


@pytest.fixture
def sim() -> Iterator[SimulatorServer]:
    with SimulatorServer(Simulator(Fleet(demo_vms(seed=0)))) as server:
        yield server


@pytest.fixture
def arm(sim: SimulatorServer) -> Iterator[ArmDouble]:
    # Only a token the identity endpoint issued for ARM's audience is taken.
    with ArmDouble(accept_token=issued_for_arm(sim.simulator.issued)) as d:
        yield d


@pytest.fixture
def client(
    arm: ArmDouble, sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ArmAcknowledge]:
    for name, value in client_environment(arm, sim.vm_url(sim.simulator.vm_names[0])).items():
        monkeypatch.setenv(name, value)
    waits: list[float] = []
    c = ArmAcknowledge(credential(IdentitySettings(kind="managed")), arm.endpoint,
                       sleep=waits.append)  # fmt: skip
    c.waits = waits  # type: ignore[attr-defined]
    yield c
    c.close()


def test_one_event_is_approved_with_the_single_form_and_a_real_token(
    arm: ArmDouble, client: ArmAcknowledge
) -> None:
    arm.offer(SCALE_SET, E1)
    said = client.acknowledge(SCALE_SET, [E1])
    assert said.approved == (E1,)
    assert not said.refused
    assert arm.acknowledged() == [E1]
    (request,) = arm.requests
    assert request.path.endswith(f"/scheduledevents/{E1}/acknowledge?api-version={API_VERSION}")
    assert request.status == 200
    assert len(arm.tokens_seen) == 1


def test_several_events_go_in_one_list_acknowledge_and_a_207_says_which_were_refused(
    arm: ArmDouble, client: ArmAcknowledge
) -> None:
    arm.offer(SCALE_SET, E1)  # E2 is not there (over, or not opted in)
    said = client.acknowledge(SCALE_SET, [E1, E2])
    assert said.approved == (E1,)
    assert said.refused[E2].startswith("NotFound")
    (request,) = arm.requests
    assert request.status == 207
    assert request.event_ids == (E1, E2)


def test_a_429_waits_its_retry_after_and_then_succeeds(
    arm: ArmDouble, client: ArmAcknowledge
) -> None:
    arm.offer(SCALE_SET, E1)
    arm.script(429, retry_after="7")
    said = client.acknowledge(SCALE_SET, [E1])
    assert said.approved == (E1,)
    assert [r.status for r in arm.requests] == [429, 200]
    assert client.waits == [7.0]  # type: ignore[attr-defined]
    assert client.throttled == 1


def test_throttling_that_lasts_is_handed_to_the_callers_retry_with_bounded_waits(
    arm: ArmDouble, client: ArmAcknowledge
) -> None:
    arm.offer(SCALE_SET, E1)
    arm.script(429, retry_after="3600", count=10)
    with pytest.raises(ThrottledError):
        client.acknowledge(SCALE_SET, [E1])
    assert len(arm.requests) == 4
    assert arm.acknowledged() == []
    assert client.waits == [10.0, 10.0, 10.0]  # type: ignore[attr-defined]


def test_a_refused_token_is_a_permanent_error_that_names_the_role(
    arm: ArmDouble, client: ArmAcknowledge
) -> None:
    arm.accept_token = lambda token: False
    with pytest.raises(PermanentError, match="Scheduled Events Contributor"):
        client.acknowledge(SCALE_SET, [E1])
    assert len(arm.requests) == 1


def test_an_event_arm_does_not_know_is_refused_not_retried(
    arm: ArmDouble, client: ArmAcknowledge
) -> None:
    said = client.acknowledge(SCALE_SET, [E1])
    assert said.approved == ()
    assert said.refused[E1].startswith("HTTP 404 NotFound")
    assert len(arm.requests) == 1


def test_what_is_not_a_compute_resource_or_an_event_id_is_never_sent(
    arm: ArmDouble, client: ArmAcknowledge
) -> None:
    with pytest.raises(PermanentError):
        client.acknowledge("/subscriptions/x/resourceGroups/y", [E1])
    with pytest.raises(PermanentError):
        client.acknowledge(SCALE_SET, ["not-a-guid"])
    assert arm.requests == []
