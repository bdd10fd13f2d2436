"""The pure fleet model, scenarios and fleet specs, driven by a fake clock (plain floats)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from bridge.simulator import scenarios
from bridge.simulator.fleet import (
    SCHEDULED_EVENTS_VERSIONS,
    EventSpec,
    EventStateError,
    Fleet,
    SimulationError,
    UnknownEventError,
    UnknownVmError,
)
from bridge.simulator.vms import (
    FleetSpecError,
    demo_vms,
    load_fleet_file,
    numbered_vms,
    vms_from_spec,
)

T0 = 1_650_000_000.0  # Fri, 15 Apr 2022 05:20:00 GMT
GUID = re.compile(
    r"^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-4[0-9A-Fa-f]{3}-[89ABab][0-9A-Fa-f]{3}-[0-9A-Fa-f]{12}$"
)


def demo_fleet(time_scale: float = 1.0, approval_delay: float = 0.0) -> Fleet:
    return Fleet(demo_vms(), time_scale=time_scale, approval_delay=approval_delay)


def reboot(*resources: str, **overrides: Any) -> EventSpec:
    return EventSpec("Reboot", tuple(resources), **overrides)


def events_of(fleet: Fleet, vm: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = fleet.document(vm)["Events"]
    return events


def incarnations(fleet: Fleet) -> dict[str, int]:
    return {name: fleet.incarnation(name) for name in fleet.names}


# -- fleet specs -------------------------------------------------------------------------


def test_demo_fleet_has_the_documented_names_and_sets() -> None:
    vms = {vm.name: vm for vm in demo_vms()}
    assert list(vms) == ["vm-0", "vm-1", "db-0", "db-1", "db-2", "web_0", "web_1", "web_2"]
    assert {vms[n].availability_set for n in ("db-0", "db-1", "db-2")} == {"db"}
    assert [vms[n].vm_scale_set_name for n in ("web_0", "web_1", "web_2")] == ["web"] * 3
    assert [vm.name for vm in vms.values() if vm.priority == "Spot"] == ["web_2"]
    assert vms["vm-0"].group == ""


def test_the_same_seed_gives_the_same_ids_and_another_seed_does_not() -> None:
    first, again, other = demo_vms(seed=7), demo_vms(seed=7), demo_vms(seed=8)
    assert [vm.vm_id for vm in first] == [vm.vm_id for vm in again]
    assert {vm.vm_id for vm in first}.isdisjoint(vm.vm_id for vm in other)
    assert all(GUID.match(vm.vm_id) for vm in first)
    assert len({vm.vm_id for vm in first}) == len(first)


@pytest.mark.parametrize(
    ("name", "suffix"),
    [
        ("vm-0", "/providers/Microsoft.Compute/virtualMachines/vm-0"),
        ("db-1", "/providers/Microsoft.Compute/virtualMachines/db-1"),
        ("web_2", "/providers/Microsoft.Compute/virtualMachineScaleSets/web/virtualMachines/2"),
    ],
)
def test_resource_ids_use_the_vm_or_the_scale_set_form(name: str, suffix: str) -> None:
    vm = next(vm for vm in demo_vms() if vm.name == name)
    prefix = f"/subscriptions/{vm.subscription_id}/resourceGroups/rg-se-bridge-sim"
    assert vm.resource_id == prefix + suffix


def test_instance_metadata_looks_like_imds_with_string_leaves() -> None:
    vm = next(vm for vm in demo_vms() if vm.name == "web_2")
    compute = vm.instance_metadata()["compute"]
    assert compute["name"] == "web_2"
    assert compute["vmScaleSetName"] == "web"
    assert compute["priority"] == "Spot"
    assert compute["zone"] == "3"
    assert compute["platformFaultDomain"] == "2"
    assert compute["resourceId"] == vm.resource_id
    assert compute["vmId"] == vm.vm_id
    db = next(vm for vm in demo_vms() if vm.name == "db-0").instance_metadata()["compute"]
    assert db["tagsList"] == [{"name": "role", "value": "db"}]
    assert db["tags"] == "role:db"
    nic = vm.instance_metadata()["network"]["interface"][0]
    assert nic["ipv4"]["ipAddress"][0]["privateIpAddress"].startswith("10.0.")


def test_numbered_vms_are_standalone_and_named_in_order() -> None:
    vms = numbered_vms(3)
    assert [vm.name for vm in vms] == ["vm-0", "vm-1", "vm-2"]
    assert all(vm.group == "" for vm in vms)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({}, "defines no VMs"),
        ({"vms": {"name": "a"}}, "'vms' must be a list"),
        ({"vms": [{"zone": "1"}]}, "vms[0]: 'name' is required"),
        ({"vms": [{"name": "a"}, {"name": "a"}]}, "used twice"),
        ({"vms": [{"name": "a", "priority": "Low"}]}, "'priority' must be"),
        ({"vms": [{"name": "a", "tags": ["x"]}]}, "'tags' must be an object"),
        ({"scaleSets": [{"name": "s", "count": 0}]}, "'count' must be an integer"),
        ({"scaleSets": [{"name": "s", "spot": 1}]}, "must be lists"),
        ([], "must be a JSON object"),
    ],
)
def test_bad_fleet_specs_say_what_is_wrong(spec: Any, fragment: str) -> None:
    with pytest.raises(FleetSpecError, match=re.escape(fragment)):
        vms_from_spec(spec)


def test_a_fleet_file_builds_every_kind_of_vm(tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    spec = {
        "location": "northeurope",
        "vms": [{"name": "solo", "documentIncarnation": 40}],
        "availabilitySets": [{"name": "sql", "count": 2}],
        "scaleSets": [{"name": "api", "count": 2, "spot": [0]}],
    }
    path.write_text(json.dumps(spec), encoding="utf-8")
    vms = load_fleet_file(path)
    assert [vm.name for vm in vms] == ["solo", "sql-0", "sql-1", "api_0", "api_1"]
    assert {vm.location for vm in vms} == {"northeurope"}
    assert vms[0].initial_incarnation == 40
    assert [vm.priority for vm in vms[3:]] == ["Spot", "Regular"]


def test_an_unreadable_fleet_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(FleetSpecError, match=r"broken\.json"):
        load_fleet_file(path)


# -- lifecycle ---------------------------------------------------------------------------


def test_a_scheduled_event_shows_in_its_audience_with_rfc1123_not_before() -> None:
    fleet = demo_fleet(time_scale=60)
    before = incarnations(fleet)
    event, changes = fleet.add_event(reboot("db-1", notice=900), T0)
    assert [c.kind for c in changes] == ["scheduled"]
    [doc_event] = events_of(fleet, "db-0")  # same availability set, not in Resources
    assert doc_event["Resources"] == ["db-1"]
    assert doc_event["EventStatus"] == "Scheduled"
    assert parsedate_to_datetime(doc_event["NotBefore"]).timestamp() == T0 + 15
    assert doc_event["NotBefore"].endswith(" GMT")
    assert events_of(fleet, "vm-0") == []
    after = incarnations(fleet)
    assert {n for n in fleet.names if after[n] != before[n]} == {"db-0", "db-1", "db-2"}
    assert all(after[n] == before[n] + 1 for n in ("db-0", "db-1", "db-2"))
    assert GUID.match(event.event_id)


def test_an_event_starts_by_itself_at_not_before_and_is_removed_after_its_run_time() -> None:
    fleet = demo_fleet(time_scale=10)
    event, _ = fleet.add_event(reboot("vm-0", notice=600, run_time=100), T0)
    start = incarnations(fleet)["vm-0"]
    assert fleet.advance(T0 + 59.9) == []
    [started] = fleet.advance(T0 + 60)
    assert (started.kind, started.reason) == ("started", "NotBefore reached")
    [doc_event] = events_of(fleet, "vm-0")
    assert (doc_event["EventStatus"], doc_event["NotBefore"]) == ("Started", "")
    assert fleet.advance(T0 + 69.9) == []
    assert [c.kind for c in fleet.advance(T0 + 70)] == ["completed"]
    assert events_of(fleet, "vm-0") == []
    assert fleet.incarnation("vm-0") == start + 2
    assert event.outcome == "completed"


def test_a_long_gap_applies_every_due_transition_at_the_time_it_fell_due() -> None:
    fleet = demo_fleet()
    event, _ = fleet.add_event(reboot("vm-1", notice=30, run_time=5), T0)
    start = fleet.incarnation("vm-1")
    changes = fleet.advance(T0 + 1000)
    assert [(c.kind, c.at) for c in changes] == [("started", T0 + 30), ("completed", T0 + 35)]
    assert fleet.incarnation("vm-1") == start + 2
    assert event.started_at == T0 + 30


def test_approval_starts_the_event_for_every_vm_in_its_audience() -> None:
    fleet = demo_fleet()
    event, _ = fleet.add_event(reboot("web_0", "web_1"), T0)
    changes = fleet.approve("web_2", [event.event_id.lower()], T0 + 5)
    assert [c.kind for c in changes] == ["approved", "started"]
    assert changes[1].reason == "approved by web_2"
    for vm in ("web_0", "web_1", "web_2"):
        assert events_of(fleet, vm)[0]["EventStatus"] == "Started"
    assert event.approved_by == "web_2"


def test_approving_an_already_started_event_is_accepted_and_changes_nothing() -> None:
    fleet = demo_fleet()
    event, _ = fleet.add_event(reboot("vm-0"), T0)
    fleet.approve("vm-0", [event.event_id], T0 + 1)
    before = fleet.incarnation("vm-0")
    assert fleet.approve("vm-0", [event.event_id], T0 + 2) == []
    assert fleet.incarnation("vm-0") == before


@pytest.mark.parametrize(
    ("vm", "ids"),
    [
        ("vm-1", ["known"]),  # the event exists but vm-1 cannot see it
        ("vm-0", ["known", "00000000-0000-4000-8000-000000000000"]),
        ("vm-0", ["not-a-guid"]),
    ],
)
def test_an_unknown_event_id_rejects_the_whole_request(vm: str, ids: list[str]) -> None:
    fleet = demo_fleet()
    event, _ = fleet.add_event(reboot("vm-0"), T0)
    ids = [event.event_id if i == "known" else i for i in ids]
    with pytest.raises(UnknownEventError):
        fleet.approve(vm, ids, T0 + 1)
    assert event.status == "Scheduled"
    assert event.approved_at is None


def test_an_approval_delay_holds_the_event_in_scheduled_for_that_long() -> None:
    fleet = demo_fleet(time_scale=2, approval_delay=20)
    event, _ = fleet.add_event(reboot("vm-0", notice=900), T0)
    assert [c.kind for c in fleet.approve("vm-0", [event.event_id], T0 + 1)] == ["approved"]
    assert fleet.advance(T0 + 10.9) == []
    [started] = fleet.advance(T0 + 11)
    assert started.at == T0 + 11
    assert started.reason == "approved by vm-0"


@pytest.mark.parametrize(
    ("action", "status_needed"),
    [("start", "Scheduled"), ("cancel", "Scheduled"), ("complete", "Started")],
)
def test_control_actions_check_the_event_state(action: str, status_needed: str) -> None:
    fleet = demo_fleet()
    status = "Started" if status_needed == "Scheduled" else "Scheduled"
    event, _ = fleet.add_event(reboot("vm-0", status=status), T0)
    with pytest.raises(EventStateError, match=f"not {status_needed}"):
        getattr(fleet, action)(event.event_id, T0 + 1)


@pytest.mark.parametrize(
    ("status", "action", "kinds", "left"),
    [
        ("Scheduled", "start", ["started"], ["Started"]),
        ("Scheduled", "cancel", ["canceled"], []),
        ("Started", "complete", ["completed"], []),
    ],
)
def test_control_actions_change_what_the_vms_see(
    status: str, action: str, kinds: list[str], left: list[str]
) -> None:
    fleet = demo_fleet()
    event, _ = fleet.add_event(reboot("db-0", status=status), T0)
    before = fleet.incarnation("db-2")
    changes = getattr(fleet, action)(event.event_id, T0 + 1)
    assert [c.kind for c in changes] == kinds
    assert [e["EventStatus"] for e in events_of(fleet, "db-2")] == left
    assert fleet.incarnation("db-2") == before + 1


def test_an_event_can_appear_directly_as_started() -> None:
    fleet = demo_fleet()
    _, changes = fleet.add_event(reboot("vm-0", status="Started", notice=0), T0)
    assert changes[0].kind == "started"
    [doc_event] = events_of(fleet, "vm-0")
    assert (doc_event["EventStatus"], doc_event["NotBefore"]) == ("Started", "")


def test_cancel_after_removes_the_event_before_it_starts() -> None:
    fleet = demo_fleet()
    fleet.add_event(reboot("vm-0", notice=900, cancel_after=300), T0)
    assert fleet.advance(T0 + 299) == []
    [canceled] = fleet.advance(T0 + 2000)  # far past NotBefore: it never started
    assert (canceled.kind, canceled.at) == ("canceled", T0 + 300)


def test_the_24_hour_reset_makes_the_incarnation_go_backwards() -> None:
    fleet = demo_fleet()
    before = fleet.incarnation("vm-0")
    [change] = fleet.reset("vm-0", T0)
    assert change.kind == "reset"
    assert fleet.incarnation("vm-0") == 1 < before
    assert fleet.reset_generation("vm-0") == 1
    fleet.add_event(reboot("vm-0"), T0 + 1)
    assert fleet.incarnation("vm-0") == 2


def test_each_vm_has_its_own_incarnation_counter() -> None:
    fleet = demo_fleet()
    assert len(set(incarnations(fleet).values())) > 1
    fleet.add_event(reboot("vm-0"), T0)
    fleet.add_event(reboot("vm-0"), T0)
    assert fleet.incarnation("vm-0") == demo_vms()[0].initial_incarnation + 2
    assert fleet.incarnation("vm-1") == demo_vms()[1].initial_incarnation


def test_now_may_be_a_datetime() -> None:
    fleet = demo_fleet()
    when = datetime.fromtimestamp(T0, timezone.utc)
    event, _ = fleet.add_event(reboot("vm-0", notice=60), when)
    assert event.not_before == T0 + 60
    assert fleet.advance(when.replace(tzinfo=None)) == []  # naive is read as UTC


_BASE_KEYS = ["EventId", "EventStatus", "EventType", "ResourceType", "Resources", "NotBefore"]
_SHAPES = {
    "2017-03-01": _BASE_KEYS,
    "2017-08-01": _BASE_KEYS,
    "2017-11-01": _BASE_KEYS,
    "2019-01-01": _BASE_KEYS,
    "2019-04-01": [*_BASE_KEYS, "Description"],
    "2019-08-01": [*_BASE_KEYS, "Description", "EventSource"],
    "2020-07-01": [*_BASE_KEYS, "Description", "EventSource", "DurationInSeconds"],
    "2024-07-09": [*_BASE_KEYS, "Description", "EventSource", "DurationInSeconds"],
}


@pytest.mark.parametrize(("version", "keys"), _SHAPES.items())
def test_each_api_version_returns_its_own_shape(version: str, keys: list[str]) -> None:
    fleet = demo_fleet()
    fleet.add_event(reboot("web_1", description="Host server is undergoing maintenance."), T0)
    [doc_event] = fleet.document("web_1", version)["Events"]
    assert list(doc_event) == keys
    if version == "2017-03-01":
        assert doc_event["Resources"] == ["_web_1"]
        assert doc_event["NotBefore"] == "2022-04-15T05:35:00Z"
    else:
        assert doc_event["Resources"] == ["web_1"]
        assert doc_event["NotBefore"] == "Fri, 15 Apr 2022 05:35:00 GMT"


def test_every_supported_version_has_a_shape_test() -> None:
    assert set(_SHAPES) == set(SCHEDULED_EVENTS_VERSIONS)


def test_messy_documents_can_be_scripted() -> None:
    fleet = demo_fleet()
    spec = EventSpec(
        "Unheard-Of",
        (),
        audience=("vm-1",),
        not_before_raw="Tue, 11 Apr 2022 22:26:58 GMT",  # wrong weekday, as in the docs
        omit_fields=("Description",),
        event_id="c7061bac-afdc-4513-b24b-aa5f13a16123",
    )
    fleet.add_event(spec, T0)
    [doc_event] = events_of(fleet, "vm-1")
    assert doc_event["Resources"] == []
    assert doc_event["EventType"] == "Unheard-Of"
    assert doc_event["NotBefore"] == "Tue, 11 Apr 2022 22:26:58 GMT"
    assert "Description" not in doc_event
    assert doc_event["EventId"] == "c7061bac-afdc-4513-b24b-aa5f13a16123"


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (reboot("nope"), UnknownVmError),
        (EventSpec("Reboot", ()), SimulationError),  # nobody would see it
        (reboot("vm-0", status="Completed"), SimulationError),
        (reboot("vm-0", audience=("ghost",)), UnknownVmError),
    ],
)
def test_impossible_events_are_refused(spec: EventSpec, error: type[Exception]) -> None:
    with pytest.raises(error):
        demo_fleet().add_event(spec, T0)


def test_event_ids_repeat_for_a_seed_and_come_in_both_cases() -> None:
    def ids(seed: int) -> list[str]:
        fleet = Fleet(demo_vms(), seed=seed)
        return [fleet.add_event(reboot("vm-0"), T0)[0].event_id for _ in range(20)]

    assert ids(1) == ids(1) != ids(2)
    assert {i.isupper() for i in ids(1)} == {True, False}
    assert len({i.lower() for i in ids(1)}) == 20


def test_a_time_scale_must_be_positive() -> None:
    with pytest.raises(SimulationError, match="time_scale"):
        Fleet(demo_vms(), time_scale=0)


# -- scenarios ---------------------------------------------------------------------------


class Expected(NamedTuple):
    name: str
    event_type: str
    source: str
    notice: float  # simulated seconds
    resources: list[str]
    audience: list[str]
    status: str = "Scheduled"
    duration: int = -1


WEB = ["web_0", "web_1", "web_2"]
DB = ["db-0", "db-1", "db-2"]
_SCENARIOS = [
    Expected("live-migration", "Freeze", "Platform", 900, ["web_0", "web_1"], WEB, duration=5),
    Expected("user-reboot", "Reboot", "User", 900, ["vm-0"], ["vm-0"]),
    Expected("platform-reboot", "Reboot", "Platform", 900, ["vm-0"], ["vm-0"]),
    Expected("redeploy", "Redeploy", "User", 600, ["vm-0"], ["vm-0"]),
    Expected("spot-preempt", "Preempt", "Platform", 30, ["web_2"], WEB),
    Expected("spot-rebalance", "SpotRebalanceRecommendation", "Platform", 900, ["web_2"], WEB),
    Expected("vmss-terminate", "Terminate", "User", 600, ["web_2"], WEB),
    Expected("canceled", "Reboot", "Platform", 900, ["vm-0"], ["vm-0"]),
    Expected("hardware-failure", "Reboot", "Platform", 0, ["vm-0"], ["vm-0"], "Started"),
    Expected("availability-set", "Reboot", "Platform", 900, ["db-0"], DB),
]


@pytest.mark.parametrize("want", _SCENARIOS, ids=[row.name for row in _SCENARIOS])
def test_each_scenario_creates_its_documented_event(want: Expected) -> None:
    fleet = demo_fleet()
    [event_id] = scenarios.run(want.name, fleet, T0)
    event = fleet.event(event_id)
    assert (event.spec.event_type, event.spec.event_source) == (want.event_type, want.source)
    assert list(event.spec.resources) == want.resources
    assert list(event.audience) == want.audience
    assert event.status == want.status
    assert event.spec.duration_in_seconds == want.duration
    if want.status == "Scheduled":
        assert event.not_before == T0 + want.notice
    assert event.spec.description


def test_every_scenario_is_covered() -> None:
    assert {row.name for row in _SCENARIOS} | {"reset-24h"} == set(scenarios.names())


def test_live_migration_uses_microsofts_description() -> None:
    fleet = demo_fleet()
    [event_id] = scenarios.run("live-migration", fleet, T0)
    [doc_event] = events_of(fleet, "web_2")
    assert doc_event["EventId"] == event_id
    assert doc_event["Description"] == (
        "Virtual machine is being paused because of a memory-preserving Live Migration operation."
    )


def test_scenarios_take_chosen_vms_and_overrides() -> None:
    fleet = demo_fleet(time_scale=60)
    opts = scenarios.ScenarioOptions(vms=("db-1", "db-2"), notice=120, run_time=30)
    [event_id] = scenarios.run("availability-set", fleet, T0, opts)
    event = fleet.event(event_id)
    assert event.spec.resources == ("db-1", "db-2")
    assert event.not_before == T0 + 2
    assert event.run_time == 0.5


def test_the_canceled_scenario_disappears_before_not_before() -> None:
    fleet = demo_fleet(time_scale=60)
    [event_id] = scenarios.run("canceled", fleet, T0)  # 15 min notice = 15 s, cancel at 5 s
    assert [c.kind for c in fleet.advance(T0 + 5)] == ["canceled"]
    with pytest.raises(UnknownEventError):
        fleet.event(event_id)


def test_reset_24h_creates_no_event_and_resets_the_counter() -> None:
    fleet = demo_fleet()
    opts = scenarios.ScenarioOptions(vms=("web_1",))
    assert scenarios.run("reset-24h", fleet, T0, opts) == []
    assert fleet.incarnation("web_1") == 1


@pytest.mark.parametrize(
    ("name", "opts", "fragment"),
    [
        ("no-such-thing", scenarios.ScenarioOptions(), "unknown scenario"),
        ("vmss-terminate", scenarios.ScenarioOptions(notice=60), "300 to 900"),
        ("canceled", scenarios.ScenarioOptions(cancel_after=2000), "shorter than the notice"),
        ("user-reboot", scenarios.ScenarioOptions(vms=("ghost",)), "no VM named 'ghost'"),
    ],
)
def test_scenarios_refuse_what_they_cannot_do(
    name: str, opts: scenarios.ScenarioOptions, fragment: str
) -> None:
    with pytest.raises(SimulationError, match=re.escape(fragment)):
        scenarios.run(name, demo_fleet(), T0, opts)


@pytest.mark.parametrize("name", ["spot-preempt", "vmss-terminate", "availability-set"])
def test_scenarios_needing_a_kind_of_vm_say_so_on_a_plain_fleet(name: str) -> None:
    with pytest.raises(SimulationError, match="name the VM"):
        scenarios.run(name, Fleet(numbered_vms(2)), T0)


def test_a_rebalance_recommendation_is_listed_at_the_preview_version_only() -> None:
    fleet = demo_fleet()
    [advice] = scenarios.run("spot-rebalance", fleet, T0)
    [preempt] = scenarios.run("spot-preempt", fleet, T0)
    listed = {v: [e["EventId"] for e in fleet.document("web_2", v)["Events"]] for v in _SHAPES}
    assert listed.pop("2024-07-09") == [advice, preempt]
    assert all(ids == [preempt] for ids in listed.values())
    # "acknowledging them has no effect": a POST naming it changes nothing.
    assert fleet.approve("web_2", [advice], T0 + 1) == []
    assert fleet.event(advice).approved_at is None
