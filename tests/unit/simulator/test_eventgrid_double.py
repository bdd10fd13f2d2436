"""The simulator's Event Grid double (issue 36, item 5): the deliveries Azure sends for the
simulated fleet's events, read back by the consumer's own parser, and its faults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.consumer.sources.eventgrid import Trust, parse
from bridge.localhub import PARTITIONS, LocalHub
from bridge.simulator import Simulator
from bridge.simulator.eventgrid import EventGridDouble, GridFaults
from bridge.simulator.fleet import EventSpec, Fleet
from bridge.simulator.vms import vms_from_spec

SPEC = {"scaleSets": [{"name": "web", "count": 4}], "vms": [{"name": "solo"}]}


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def rig(faults: GridFaults | None = None, seed: int = 0) -> tuple[Simulator, Clock, Trust]:
    clock = Clock()
    sim = Simulator(Fleet(vms_from_spec(SPEC, seed=1), time_scale=60), clock=clock)
    sub = sim.fleet.vm("web_0").subscription_id
    return sim, clock, Trust(frozenset({sub}), health=True)


def hub_bodies(directory: Path) -> list[str]:
    with LocalHub(directory) as hub:
        return [body for p in range(PARTITIONS) for _, body in hub.read(p, -1, 10_000)]


def test_each_change_of_an_event_is_the_delivery_azure_sends(tmp_path: Path) -> None:
    sim, clock, trust = rig()
    grid = EventGridDouble(sim, tmp_path / "grid")
    event_id = sim.add_event(EventSpec("Reboot", ("web_2",), event_source="User", notice=60))
    clock.now += 61  # NotBefore: Azure starts it
    sim.tick()
    clock.now += 600  # its run time is over
    sim.tick()
    grid.pump()
    statuses = []
    for body in hub_bodies(tmp_path / "grid"):
        parsed = parse(body, trust)
        assert parsed.refused == []
        [record] = parsed.events
        assert record["EventId"] == event_id
        assert record["Resources"] == ["web_2"]
        assert record["VmScaleSetName"] == "web"
        statuses.append(record["Transition"])
    assert sorted(statuses) == ["Completed", "Scheduled", "Started"]


def test_a_standalone_vms_event_and_a_health_change_parse(tmp_path: Path) -> None:
    sim, _, trust = rig()
    grid = EventGridDouble(sim, tmp_path / "grid")
    sim.add_event(EventSpec("Freeze", ("solo",)))
    grid.health("web_3", "Unavailable")
    grid.pump()
    found = [parse(body, trust) for body in hub_bodies(tmp_path / "grid")]
    events = [e for p in found for e in p.events]
    health = [h for p in found for h in p.health]
    assert [e["VmName"] for e in events] == ["solo"]
    assert [(h.resource.vm_name, h.state) for h in health] == [("web_3", "Unavailable")]


def test_deliveries_wait_their_delay(tmp_path: Path) -> None:
    sim, clock, _ = rig()
    grid = EventGridDouble(sim, tmp_path / "grid", GridFaults(delay=5))
    sim.add_event(EventSpec("Reboot", ("web_0",)))
    assert grid.pump() == 0
    clock.now += 10.01  # at most twice the delay
    assert grid.pump() == 1


def test_loss_duplicates_and_reordering_are_drawn_as_asked(tmp_path: Path) -> None:
    sim, clock, _ = rig()
    faults = GridFaults(delay=1, duplicate=0.3, reorder=0.3, reorder_by=30, loss=0.2)
    grid = EventGridDouble(sim, tmp_path / "grid", faults, seed=7)
    for n in range(200):
        grid.health(f"web_{n % 4}", "Unavailable" if n % 2 else "Available")
        clock.now += 1
    clock.now += 100
    grid.pump()
    counts = grid.counts
    assert 20 < counts["lost"] < 60
    assert 30 < counts["duplicated"] < 80
    assert 30 < counts["reordered"] < 90
    assert counts["sent"] == 200 - counts["lost"] + counts["duplicated"]
    # Held back deliveries come after later ones: the order Azure made them in is not kept.
    made = [json.loads(b)["time"] for b in hub_bodies(tmp_path / "grid")]
    sent = [d["time"] for d in grid.sent]
    assert sorted(made) == sorted(sent)
    assert sent != sorted(sent)


@pytest.mark.parametrize("bad", [{"loss": 1.5}, {"duplicate": -0.1}, {"delay": -1}])
def test_a_fault_out_of_range_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="Event Grid"):
        GridFaults(**bad)
