"""Fixtures the component tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import Fleet
from bridge.simulator.vms import demo_vms
from tests.doubles.keyvault import KeyVaultDouble
from tests.doubles.resourcegraph import ResourceGraphDouble
from tests.support.approvals import Harness


@pytest.fixture
def sim() -> Iterator[tuple[Simulator, SimulatorServer]]:
    """The demo fleet's simulator in real time, serving on a free port."""
    simulator = Simulator(Fleet(demo_vms(seed=0), time_scale=1.0))
    with SimulatorServer(simulator) as server:
        yield simulator, server


@pytest.fixture
def harness(sim: tuple[Simulator, SimulatorServer], tmp_path: Path) -> Iterator[Harness]:
    """An in-process agent with a command listener against `sim` (test modules may override)."""
    made = Harness(sim[1], tmp_path)
    yield made
    made.stop()


@pytest.fixture
def key_vault(
    sim: tuple[Simulator, SimulatorServer], monkeypatch: pytest.MonkeyPatch
) -> Iterator[KeyVaultDouble]:
    """An empty Key Vault double this process reaches, read as the managed identity of the
    simulator's vm-0 (SE_BRIDGE_IDENTITY_KIND=managed; its token from the IMDS simulator)."""
    with KeyVaultDouble() as vault:
        vault.reachable(monkeypatch)
        monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", sim[1].vm_url("vm-0"))
        yield vault


@pytest.fixture
def graph(monkeypatch: pytest.MonkeyPatch) -> Iterator[ResourceGraphDouble]:
    """The Resource Graph double on HTTPS, its throwaway CA trusted by the real client."""
    with ResourceGraphDouble() as double:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(double.ca_bundle))
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        yield double
