"""Cancelling a patch run (bridge.cloud.applyupdates, issue 40) against the ARM double over TLS,
with a real managed-identity token from the IMDS simulator's identity endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from bridge.cloud.applyupdates import API_VERSION, ArmCancel
from bridge.cloud.identity import credential
from bridge.config import IdentitySettings
from bridge.retry import PermanentError
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import Fleet
from bridge.simulator.vms import demo_vms
from tests.doubles.arm import ArmDouble, client_environment, issued_for_arm

CONFIG = ("/subscriptions/8d5f9c8e-1111-4222-8333-444455556666/resourceGroups/rg-patch/"
          "providers/Microsoft.Maintenance/maintenanceConfigurations/tuesday")  # fmt: skip
RUN = "20261208020000"


@pytest.fixture
def sim() -> Iterator[SimulatorServer]:
    with SimulatorServer(Simulator(Fleet(demo_vms(seed=0)))) as server:
        yield server


@pytest.fixture
def arm(sim: SimulatorServer) -> Iterator[ArmDouble]:
    with ArmDouble(accept_token=issued_for_arm(sim.simulator.issued)) as d:
        yield d


@pytest.fixture
def client(
    arm: ArmDouble, sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ArmCancel]:
    for name, value in client_environment(arm, sim.vm_url(sim.simulator.vm_names[0])).items():
        monkeypatch.setenv(name, value)
    waits: list[float] = []
    c = ArmCancel(credential(IdentitySettings(kind="managed")), arm.endpoint, sleep=waits.append)
    c.waits = waits  # type: ignore[attr-defined]
    yield c
    c.close()


def later(minutes: int) -> datetime:
    return datetime.now(timezone.utc) + timedelta(minutes=minutes)


def test_a_run_is_cancelled_with_a_put_of_status_cancel_and_a_real_token(
    arm: ArmDouble, client: ArmCancel
) -> None:
    arm.offer_run(CONFIG, RUN, later(20))
    said = client.cancel(CONFIG, RUN)
    assert said.done
    assert said.said == "Cancelled"
    assert arm.cancels(CONFIG, RUN) == 1
    (request,) = arm.requests
    assert request.method == "PUT"
    assert request.path.endswith(f"/applyUpdates/{RUN}?api-version={API_VERSION}")
    assert len(arm.tokens_seen) == 1


def test_cancelling_again_is_the_same_answer(arm: ArmDouble, client: ArmCancel) -> None:
    arm.offer_run(CONFIG, RUN, later(20))
    assert client.cancel(CONFIG, RUN).done
    assert client.cancel(CONFIG, RUN).done


def test_a_cancel_after_the_cut_off_is_refused_and_said(arm: ArmDouble, client: ArmCancel) -> None:
    arm.offer_run(CONFIG, RUN, later(-1))
    said = client.cancel(CONFIG, RUN)
    assert not said.done
    assert said.said.startswith("HTTP 409 Conflict")
    assert arm.cancels(CONFIG, RUN) == 0


def test_an_unknown_run_is_refused(client: ArmCancel) -> None:
    said = client.cancel(CONFIG, RUN)
    assert not said.done
    assert "404" in said.said


def test_a_429_waits_its_retry_after(arm: ArmDouble, client: ArmCancel) -> None:
    arm.offer_run(CONFIG, RUN, later(20))
    arm.script(429, retry_after="3")
    assert client.cancel(CONFIG, RUN).done
    assert client.waits[0] >= 3  # type: ignore[attr-defined]
    assert [r.status for r in arm.requests] == [429, 200]


def test_what_is_not_a_configurations_run_is_never_sent(arm: ArmDouble, client: ArmCancel) -> None:
    with pytest.raises(PermanentError):
        client.cancel(CONFIG + "/../other", RUN)
    with pytest.raises(PermanentError):
        client.cancel(CONFIG, "tomorrow")
    assert arm.requests == []
