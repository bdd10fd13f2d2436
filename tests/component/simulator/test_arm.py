"""The simulator's ARM acknowledge (bridge.simulator.arm, issue 36 item 5): the consumer's real
client (bridge.cloud.armack) approves a simulated event from outside its VMs, over HTTPS, with a
token the simulator's own identity endpoint issued for ARM; the event is then approved exactly as
an IMDS StartRequests POST approves it, and starts."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import pytest
from azure.core.credentials import AccessToken, TokenCredential

from bridge.cloud.armack import ArmAcknowledge
from bridge.cloud.managedidentity import ImdsManagedIdentity
from bridge.retry import PermanentError
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.arm import ArmServer
from bridge.simulator.fleet import EventSpec, Fleet
from bridge.simulator.vms import vms_from_spec
from tests.support.wait import eventually

FLEET = {"scaleSets": [{"name": "web", "count": 2}], "vms": [{"name": "solo"}]}
WAIT = 30.0


@dataclass
class Rig:
    sim: Simulator
    server: SimulatorServer
    arm: ArmServer

    def client(self, resource_vm: str = "web_0") -> ArmAcknowledge:
        # The managed identity of a simulated VM: its token endpoint is the simulator's.
        return ArmAcknowledge(ImdsManagedIdentity(host=self.server.vm_url(resource_vm)),
                              self.arm.endpoint, sleep=lambda _: None)  # fmt: skip

    def scope(self, vm: str) -> str:
        return self.sim.fleet.vm(vm).events_scope

    def reboot(self, *vms: str) -> str:
        return self.sim.add_event(EventSpec("Reboot", vms, event_source="User", notice=600))

    def event(self, event_id: str) -> dict[str, object]:
        return next(e for e in self.sim.events() if e["eventId"] == event_id)


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    sim = Simulator(Fleet(vms_from_spec(FLEET, seed=1), time_scale=60))
    with SimulatorServer(sim) as server, ArmServer.for_simulator(sim) as arm:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", arm.ca_bundle)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        yield Rig(sim, server, arm)


def test_an_acknowledge_approves_the_event_as_a_start_requests_post_and_it_starts(
    rig: Rig,
) -> None:
    event_id = rig.reboot("web_1")
    said = rig.client().acknowledge(rig.scope("web_1"), [event_id])
    assert said.approved == (event_id,)
    assert rig.event(event_id)["approvedBy"] == "ARM"
    [approval] = rig.sim.approvals()
    assert (approval.vm, approval.event_id, approval.status, approval.via) == (
        "web_1", event_id, 200, "ARM")  # fmt: skip
    eventually(lambda: rig.event(event_id)["startedAt"], WAIT, "the acknowledged event started")
    # The token was one the simulator's identity endpoint issued for ARM's audience.
    [token] = rig.arm.tokens_seen
    assert rig.sim.issued[token] == "https://management.azure.com"


def test_a_list_acknowledge_approves_what_is_kept_under_the_scope_and_names_the_rest(
    rig: Rig,
) -> None:
    here, there = rig.reboot("web_0"), rig.reboot("solo")
    said = rig.client().acknowledge(rig.scope("web_0"), [here, there])
    assert said.approved == (here,)
    assert said.refused[there].startswith("NotFound")
    assert rig.event(here)["approvedBy"] == "ARM"
    assert rig.event(there)["approvedAt"] is None
    assert rig.arm.requests[-1].status == 207


def test_an_event_under_another_resource_or_over_is_not_found_and_nothing_changes(
    rig: Rig,
) -> None:
    event_id = rig.reboot("web_0")
    vm_itself = rig.sim.fleet.vm("web_0").resource_id.rsplit("/virtualMachines/", 1)[0]
    wrong = [rig.scope("solo"), vm_itself + "x"]
    for scope in wrong:
        said = rig.client().acknowledge(scope, [event_id])
        assert said.approved == ()
    assert rig.event(event_id)["approvedAt"] is None
    rig.sim.start_event(event_id)
    rig.sim.complete_event(event_id)
    assert rig.client().acknowledge(rig.scope("web_0"), [event_id]).approved == ()
    assert [r.status for r in rig.arm.requests] == [404, 404, 404]
    assert rig.sim.approvals() == []


class Given:
    """A credential that presents a token as it is: one issued for another audience, or none."""

    def __init__(self, token: str) -> None:
        self.token = token

    def get_token(self, *scopes: str, **kwargs: object) -> AccessToken:
        return AccessToken(self.token, 2**31)


def test_a_token_for_another_audience_or_none_the_simulator_issued_is_refused(rig: Rig) -> None:
    event_id = rig.reboot("web_0")
    for_storage = rig.sim.token("web_0", "https://storage.azure.com")["access_token"]
    for token in (for_storage, "made-up"):
        client = ArmAcknowledge(cast("TokenCredential", Given(token)), rig.arm.endpoint)
        with pytest.raises(PermanentError, match="Scheduled Events Contributor"):
            client.acknowledge(rig.scope("web_0"), [event_id])
    assert [r.status for r in rig.arm.requests] == [401, 401]
    assert rig.event(event_id)["approvedAt"] is None
