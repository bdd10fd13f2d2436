"""The IMDS simulator over real HTTP: a SimulatorServer on a free port, driven with requests."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from email.utils import parsedate_to_datetime
from typing import Any, NamedTuple

import pytest
import requests

from bridge.agent import imds
from bridge.retry import RetryableError
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.faults import FaultPlan, Faults
from bridge.simulator.fleet import Fleet, UnknownEventError
from bridge.simulator.vms import demo_vms
from tests.support.wait import eventually

META = {"Metadata": "true"}
LATEST = {"api-version": "2020-07-01"}
SCHEDULED_EVENTS = "/metadata/scheduledevents"
INSTANCE = "/metadata/instance"
TOKEN = "/metadata/identity/oauth2/token"
HEADER_ERROR = {"error": "Bad request: . Required metadata header not specified"}

Factory = Callable[..., tuple[Simulator, SimulatorServer]]


@pytest.fixture
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.headers["Content-Type"] = "application/json"  # as the control API requires
        yield session


@pytest.fixture
def make_server() -> Iterator[Factory]:
    servers: list[SimulatorServer] = []

    def make(
        time_scale: float = 600.0,
        faults: Faults | None = None,
        per_vm_ports: bool = False,
        approval_delay: float = 0.0,
    ) -> tuple[Simulator, SimulatorServer]:
        fleet = Fleet(demo_vms(), time_scale=time_scale, approval_delay=approval_delay)
        sim = Simulator(fleet, FaultPlan(faults))
        server = SimulatorServer(sim, per_vm_ports=per_vm_ports, tick_interval=0.01).start()
        servers.append(server)
        return sim, server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def served(make_server: Factory) -> tuple[Simulator, SimulatorServer]:
    return make_server()


def document(http: requests.Session, base: str, version: str = "2020-07-01") -> dict[str, Any]:
    response = http.get(base + SCHEDULED_EVENTS, params={"api-version": version}, headers=META)
    assert response.status_code == 200, response.text
    doc: dict[str, Any] = response.json()
    return doc


def approve(http: requests.Session, base: str, body: Any) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http.post(base + SCHEDULED_EVENTS, params=LATEST, headers=META, data=data)


# -- the rules every IMDS request follows ------------------------------------------------


@pytest.mark.parametrize("path", [SCHEDULED_EVENTS, INSTANCE, TOKEN])
def test_a_request_without_the_metadata_header_is_refused(
    served: tuple[Simulator, SimulatorServer], http: requests.Session, path: str
) -> None:
    _, server = served
    response = http.get(server.url + path, params={"api-version": "2020-07-01"})
    assert response.status_code == 400
    assert response.json() == HEADER_ERROR
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"


class VersionCase(NamedTuple):
    path: str
    params: dict[str, str]
    error_start: str
    newest: list[str]


_NOT_SPECIFIED = "Bad request. api-version was not specified in the request."
_INVALID = "Bad request. api-version is invalid"
_SE_NEWEST = ["2020-07-01", "2019-08-01", "2019-04-01"]
_INSTANCE_NEWEST = ["2023-07-01", "2021-12-13", "2021-11-15"]
_TOKEN_NEWEST = ["2019-08-01", "2018-02-01"]
_VAULT = {"resource": "https://vault.azure.net"}
_VERSION_CASES = [
    VersionCase(SCHEDULED_EVENTS, {}, _NOT_SPECIFIED, _SE_NEWEST),
    VersionCase(SCHEDULED_EVENTS, {"api-version": ""}, _NOT_SPECIFIED, _SE_NEWEST),
    VersionCase(SCHEDULED_EVENTS, {"api-version": "2021-02-01"}, _INVALID, _SE_NEWEST),
    VersionCase(INSTANCE, {"api-version": "2016-01-01"}, _INVALID, _INSTANCE_NEWEST),
    VersionCase(TOKEN, _VAULT, _NOT_SPECIFIED, _TOKEN_NEWEST),
]


@pytest.mark.parametrize("case", _VERSION_CASES)
def test_a_missing_or_unsupported_api_version_lists_the_newest_versions(
    served: tuple[Simulator, SimulatorServer], http: requests.Session, case: VersionCase
) -> None:
    _, server = served
    response = http.get(server.url + case.path, params=case.params, headers=META)
    assert response.status_code == 400
    body = response.json()
    assert body["error"].startswith(case.error_start)
    assert body["newest-versions"] == case.newest


@pytest.mark.parametrize(
    "version", ["2017-03-01", "2017-08-01", "2017-11-01", "2019-01-01", "2019-04-01", "2019-08-01"]
)
def test_every_supported_version_answers_and_old_ones_lack_the_new_fields(
    served: tuple[Simulator, SimulatorServer], http: requests.Session, version: str
) -> None:
    sim, server = served
    sim.run_scenario("live-migration")
    [event] = document(http, server.vm_url("web_0"), version)["Events"]
    assert "DurationInSeconds" not in event
    assert ("Description" in event) == (version >= "2019-04-01")
    assert ("EventSource" in event) == (version >= "2019-08-01")


def test_an_unknown_method_is_405_and_an_unknown_path_404(
    served: tuple[Simulator, SimulatorServer], http: requests.Session
) -> None:
    _, server = served
    put = http.put(server.url + INSTANCE, params={"api-version": "2021-02-01"}, headers=META)
    assert (put.status_code, put.headers["Allow"]) == (405, "GET")
    missing = http.get(server.url + "/metadata/nothing", params=LATEST, headers=META)
    assert missing.status_code == 404


# -- Scheduled Events lifecycle ----------------------------------------------------------


def test_one_approval_starts_a_live_migration_for_every_vm_that_sees_it(
    served: tuple[Simulator, SimulatorServer], http: requests.Session
) -> None:
    sim, server = served
    start = document(http, server.vm_url("web_2"))["DocumentIncarnation"]
    [event_id] = sim.run_scenario("live-migration", run_time=60)  # 0.1 s at x600
    [scheduled] = document(http, server.vm_url("web_2"))["Events"]
    assert scheduled["EventId"] == event_id
    assert scheduled["Resources"] == ["web_0", "web_1"]  # web_2 sees it without being listed
    assert approve(http, server.vm_url("web_0"), {"StartRequests": [{"EventId": event_id}]}).ok
    [started] = document(http, server.vm_url("web_1"))["Events"]
    assert (started["EventStatus"], started["NotBefore"]) == ("Started", "")
    eventually(lambda: document(http, server.vm_url("web_2"))["Events"] == [])
    assert document(http, server.vm_url("web_2"))["DocumentIncarnation"] == start + 3
    assert [(a.vm, a.event_id, a.status) for a in sim.approvals()] == [("web_0", event_id, 200)]


def test_an_event_nobody_approves_starts_at_not_before(
    served: tuple[Simulator, SimulatorServer], http: requests.Session
) -> None:
    sim, server = served
    scheduled_at = time.time()
    sim.run_scenario("platform-reboot", vms=["vm-1"], notice=120)  # 0.2 s at x600
    [event] = document(http, server.vm_url("vm-1"))["Events"]
    not_before = parsedate_to_datetime(event["NotBefore"]).timestamp()
    assert scheduled_at - 1 <= not_before <= scheduled_at + 0.2
    eventually(
        lambda: document(http, server.vm_url("vm-1"))["Events"][0]["EventStatus"] == "Started"
    )
    assert time.time() >= not_before


UNKNOWN_ID = "00000000-0000-4000-8000-000000000000"
KNOWN = {"EventId": "known"}


@pytest.mark.parametrize(
    ("body", "status", "recorded"),
    [
        (b"not json", 400, [None]),
        ({}, 400, [None]),
        ({"StartRequests": "all"}, 400, [None]),
        ({"StartRequests": [{"Id": "x"}]}, 400, [None]),
        ({"StartRequests": [{"EventId": UNKNOWN_ID}]}, 400, [UNKNOWN_ID]),
        ({"StartRequests": [KNOWN, {"EventId": UNKNOWN_ID}]}, 400, ["known", UNKNOWN_ID]),
        ({"StartRequests": []}, 200, [None]),
        ({"StartRequests": [KNOWN]}, 200, ["known"]),
        ({"StartRequests": [{"EventId": "KNOWN"}]}, 200, ["KNOWN"]),  # ids compare case-blind
        ({"DocumentIncarnation": "5", "StartRequests": [KNOWN]}, 200, ["known"]),  # 2017 form
    ],
)
def test_start_requests_are_checked_like_imds_does(
    served: tuple[Simulator, SimulatorServer],
    http: requests.Session,
    body: Any,
    status: int,
    recorded: list[str | None],
) -> None:
    sim, server = served
    [event_id] = sim.run_scenario("user-reboot", vms=["vm-0"], run_time=6000)
    names = {"known": event_id.lower(), "KNOWN": event_id.upper()}
    if isinstance(body, bytes):
        data = body
    else:
        data = json.dumps(body).encode()
        for name, real in names.items():
            data = data.replace(f'"{name}"'.encode(), f'"{real}"'.encode())
    response = approve(http, server.vm_url("vm-0"), data)
    assert response.status_code == status
    if status == 400:
        assert response.json()["error"].startswith("Bad request")
    expected = [(names.get(i, i) if i else None, status) for i in recorded]
    assert [(a.event_id, a.status) for a in sim.approvals()] == expected
    started = status == 200 and recorded != [None]
    assert sim.fleet.event(event_id).status == ("Started" if started else "Scheduled")


def test_approving_twice_is_fine_and_both_approvals_are_recorded(
    served: tuple[Simulator, SimulatorServer], http: requests.Session
) -> None:
    sim, server = served
    [event_id] = sim.run_scenario("redeploy", vms=["vm-0"], run_time=6000)
    body = {"StartRequests": [{"EventId": event_id}]}
    assert approve(http, server.vm_url("vm-0"), body).status_code == 200
    assert approve(http, server.vm_url("vm-0"), body).status_code == 200
    approvals = http.get(server.url + "/control/approvals").json()["approvals"]
    assert [(a["vm"], a["status"], a["eventStatus"]) for a in approvals] == [
        ("vm-0", 200, "Started"),
        ("vm-0", 200, "Started"),
    ]


def test_a_vm_cannot_approve_an_event_it_does_not_see(
    served: tuple[Simulator, SimulatorServer], http: requests.Session
) -> None:
    sim, server = served
    [event_id] = sim.run_scenario("availability-set")
    response = approve(http, server.vm_url("web_0"), {"StartRequests": [{"EventId": event_id}]})
    assert response.status_code == 400
    assert event_id in response.json()["error"]
    assert document(http, server.vm_url("db-2"))["Events"][0]["EventStatus"] == "Scheduled"


def test_an_approval_delay_keeps_the_event_scheduled_for_a_while(
    make_server: Factory, http: requests.Session
) -> None:
    sim, server = make_server(time_scale=100, approval_delay=20)  # 0.2 s
    [event_id] = sim.run_scenario("user-reboot", vms=["vm-0"], run_time=6000)
    approve(http, server.vm_url("vm-0"), {"StartRequests": [{"EventId": event_id}]})
    assert document(http, server.vm_url("vm-0"))["Events"][0]["EventStatus"] == "Scheduled"
    eventually(
        lambda: document(http, server.vm_url("vm-0"))["Events"][0]["EventStatus"] == "Started"
    )


# -- addressing and the other endpoints --------------------------------------------------


def test_each_vm_has_its_own_path_and_the_bare_paths_serve_the_first_vm(
    served: tuple[Simulator, SimulatorServer], http: requests.Session
) -> None:
    _, server = served
    params = {"api-version": "2021-02-01"}

    def name_at(base: str) -> str:
        response = http.get(base + INSTANCE, params=params, headers=META)
        return str(response.json()["compute"]["name"])

    assert name_at(server.url) == "vm-0"
    assert name_at(server.vm_url("web_1")) == "web_1"
    assert (
        http.get(server.url + "/vm/ghost" + INSTANCE, params=params, headers=META).status_code
        == 404
    )
    assert http.get(server.url + "/elsewhere", headers=META).status_code == 404


def test_per_vm_ports_serve_each_vm_at_the_root_paths(
    make_server: Factory, http: requests.Session
) -> None:
    sim, server = make_server(per_vm_ports=True)
    sim.run_scenario("user-reboot", vms=["db-1"])
    urls = server.vm_port_urls
    assert set(urls) == set(sim.vm_names)
    assert len(document(http, urls["db-0"])["Events"]) == 1  # db-1's set sees it
    assert document(http, urls["vm-0"])["Events"] == []
    assert http.get(urls["db-1"] + "/control/fleet").status_code == 404  # no control API there


def test_instance_metadata_and_its_subpaths(
    served: tuple[Simulator, SimulatorServer], http: requests.Session
) -> None:
    sim, server = served
    params = {"api-version": "2021-02-01"}
    base = server.vm_url("web_2")
    compute = http.get(base + INSTANCE, params=params, headers=META).json()["compute"]
    vm = sim.fleet.vm("web_2")
    assert (compute["vmId"], compute["resourceId"], compute["vmScaleSetName"]) == (
        vm.vm_id,
        vm.resource_id,
        "web",
    )
    leaf = http.get(
        base + INSTANCE + "/compute/vmId", params={**params, "format": "text"}, headers=META
    )
    assert (leaf.text, leaf.headers["Content-Type"]) == (vm.vm_id, "text/plain; charset=utf-8")
    assert (
        http.get(base + INSTANCE + "/compute/vmId", params=params, headers=META).status_code == 400
    )
    assert (
        http.get(base + INSTANCE + "/compute/nothing", params=params, headers=META).status_code
        == 404
    )
    nic = http.get(base + INSTANCE + "/network/interface/0", params=params, headers=META).json()
    assert nic["macAddress"] == vm.mac_address


def test_managed_identity_tokens_look_like_imds_ones(
    served: tuple[Simulator, SimulatorServer], http: requests.Session
) -> None:
    sim, server = served
    params = {"api-version": "2018-02-01", "resource": "https://management.azure.com/"}
    first = http.get(server.vm_url("vm-1") + TOKEN, params=params, headers=META).json()
    second = http.get(
        server.vm_url("vm-1") + TOKEN, params={**params, "client_id": "abc"}, headers=META
    ).json()
    assert first["token_type"] == "Bearer"
    assert first["resource"] == "https://management.azure.com/"
    assert first["client_id"] == sim.fleet.vm("vm-1").client_id
    assert second["client_id"] == "abc"
    assert first["access_token"] != second["access_token"]
    assert int(first["expires_on"]) - int(first["not_before"]) == int(first["expires_in"])
    assert abs(int(first["not_before"]) - time.time()) < 5
    missing = http.get(
        server.vm_url("vm-1") + TOKEN, params={"api-version": "2018-02-01"}, headers=META
    )
    assert (missing.status_code, missing.json()["error"]) == (400, "invalid_request")


# -- faults ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "status"), [("rate429", 429), ("rate410", 410), ("rate500", 500), ("rate503", 503)]
)
def test_status_faults_hit_imds_but_never_the_control_api(
    served: tuple[Simulator, SimulatorServer], http: requests.Session, key: str, status: int
) -> None:
    _, server = served
    assert http.post(server.url + "/control/faults", json={key: 1.0}).status_code == 200
    response = http.get(server.vm_url("vm-0") + SCHEDULED_EVENTS, params=LATEST, headers=META)
    assert response.status_code == status
    assert "error" in response.json()
    if status == 429:
        assert response.headers["Retry-After"] == "1"
    assert http.get(server.url + "/control/fleet").status_code == 200
    assert http.delete(server.url + "/control/faults").status_code == 200
    assert http.get(server.vm_url("vm-0") + SCHEDULED_EVENTS, params=LATEST, headers=META).ok


def test_per_vm_faults_leave_the_other_vms_alone(
    served: tuple[Simulator, SimulatorServer], http: requests.Session
) -> None:
    sim, server = served
    http.post(server.url + "/control/faults", json={"vm": "web_0", "rate503": 1.0})
    assert (
        http.get(server.vm_url("web_0") + SCHEDULED_EVENTS, params=LATEST, headers=META).status_code
        == 503
    )
    assert (
        http.get(server.vm_url("web_1") + SCHEDULED_EVENTS, params=LATEST, headers=META).status_code
        == 200
    )
    [event_id] = sim.run_scenario("live-migration")
    blocked = approve(http, server.vm_url("web_0"), {"StartRequests": [{"EventId": event_id}]})
    assert blocked.status_code == 503
    assert [(a.vm, a.status, a.event_status) for a in sim.approvals()] == [
        ("web_0", 503, "Scheduled")
    ]


def test_latency_and_the_slow_first_call_after_start_and_after_a_reset(
    make_server: Factory, http: requests.Session
) -> None:
    _, server = make_server(faults=Faults(first_call_delay=0.3))
    base = server.vm_url("db-0")

    def timed() -> float:
        began = time.monotonic()
        document(http, base)
        return time.monotonic() - began

    assert timed() >= 0.3
    assert timed() < 0.3
    http.post(server.url + "/control/vms/db-0/reset")
    assert timed() >= 0.3
    http.post(server.url + "/control/faults", json={"firstCallDelay": 0, "latency": 0.2})
    assert timed() >= 0.2


@pytest.mark.parametrize("key", ["rateNotJson", "rateNotDocument"])
def test_malformed_bodies_are_not_documents(
    served: tuple[Simulator, SimulatorServer], http: requests.Session, key: str
) -> None:
    _, server = served
    http.post(server.url + "/control/faults", json={key: 1.0})
    for _ in range(10):
        response = http.get(server.vm_url("vm-0") + SCHEDULED_EVENTS, params=LATEST, headers=META)
        assert response.status_code == 200
        try:
            body = json.loads(response.content)
        except ValueError:
            assert key == "rateNotJson"
            continue
        assert key == "rateNotDocument"
        assert not (isinstance(body, dict) and isinstance(body.get("DocumentIncarnation"), int))


# -- control API -------------------------------------------------------------------------


def test_the_fleet_listing_gives_each_vm_a_working_url(
    served: tuple[Simulator, SimulatorServer], http: requests.Session
) -> None:
    _, server = served
    fleet = http.get(server.url + "/control/fleet").json()
    assert fleet["timeScale"] == 600
    assert [vm["name"] for vm in fleet["vms"]][:3] == ["vm-0", "vm-1", "db-0"]
    web_2 = fleet["vms"][-1]
    assert (web_2["priority"], web_2["group"]) == ("Spot", "vmss:web")
    assert document(http, web_2["url"]) == web_2["document"]


def test_scenarios_and_custom_events_through_the_control_api(
    served: tuple[Simulator, SimulatorServer], http: requests.Session
) -> None:
    _, server = served
    names = [s["name"] for s in http.get(server.url + "/control/scenarios").json()["scenarios"]]
    assert "spot-preempt" in names
    ids = http.post(server.url + "/control/scenarios", json={"name": "spot-preempt"}).json()[
        "eventIds"
    ]
    custom = {
        "EventId": "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7",
        "EventType": "Freeze",
        "Resources": ["vm-1"],
        "EventStatus": "Scheduled",
        "Description": "Host server is undergoing maintenance.",
        "EventSource": "User",
        "DurationInSeconds": 9,
        "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
        "audience": ["vm-1", "vm-0"],
        "notice": 900,
        "runTime": 6000,
        "omitFields": ["ResourceType"],
    }
    created = http.post(server.url + "/control/events", json=custom).json()
    assert created == {"eventId": custom["EventId"]}
    [event] = document(http, server.vm_url("vm-0"))["Events"]
    expected = {k: v for k, v in custom.items() if k[0].isupper()}
    assert event == expected
    events = http.get(server.url + "/control/events").json()["events"]
    assert [e["eventId"] for e in events] == [*ids, custom["EventId"]]


@pytest.mark.parametrize(
    ("steps", "statuses", "left"),
    [
        (["start", "complete"], [200, 200], []),
        (["cancel"], [200], []),
        (["start"], [200], ["Started"]),
        (["complete"], [409], ["Scheduled"]),
        (["cancel", "cancel"], [200, 404], []),
    ],
)
def test_events_can_be_started_canceled_and_completed_by_hand(
    served: tuple[Simulator, SimulatorServer],
    http: requests.Session,
    steps: list[str],
    statuses: list[int],
    left: list[str],
) -> None:
    sim, server = served
    [event_id] = sim.run_scenario("platform-reboot", vms=["vm-0"], run_time=60000)
    got = [
        http.post(f"{server.url}/control/events/{event_id}/{step}").status_code for step in steps
    ]
    assert got == statuses
    assert [e["EventStatus"] for e in document(http, server.vm_url("vm-0"))["Events"]] == left


@pytest.mark.parametrize(
    ("request_", "status"),
    [
        (("GET", "/control/nothing", None), 404),
        (("DELETE", "/control/fleet", None), 405),
        (("POST", "/control/scenarios", b"{"), 400),
        (("POST", "/control/scenarios", []), 400),
        (("POST", "/control/scenarios", {"name": "nope"}), 400),
        (("POST", "/control/scenarios", {"name": "user-reboot", "vms": ["ghost"]}), 404),
        (("POST", "/control/scenarios", {"name": "user-reboot", "notice": "soon"}), 400),
        (("POST", "/control/events", {"Resources": ["vm-0"]}), 400),
        (("POST", "/control/events", {"EventType": "Reboot", "Resources": []}), 400),
        (("POST", "/control/faults", {"rate503": 2}), 400),
        (("POST", "/control/faults", {"vm": "ghost", "rate503": 0.5}), 404),
        (("POST", "/control/vms/vm-0/reset", {"restartAt": -1}), 400),
        (("GET", "/control/vms/ghost/document", None), 404),
    ],
)
def test_control_errors_say_what_is_wrong(
    served: tuple[Simulator, SimulatorServer],
    http: requests.Session,
    request_: tuple[str, str, Any],
    status: int,
) -> None:
    _, server = served
    method, path, body = request_
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    response = http.request(method, server.url + path, data=data)
    assert response.status_code == status
    assert response.json()["error"]


def test_the_24_hour_reset_is_seen_as_a_lower_incarnation(
    served: tuple[Simulator, SimulatorServer], http: requests.Session
) -> None:
    _, server = served
    before = document(http, server.vm_url("web_1"))["DocumentIncarnation"]
    reset = http.post(
        server.url + "/control/scenarios", json={"name": "reset-24h", "vms": ["web_1"]}
    )
    assert reset.json() == {"eventIds": []}
    after = document(http, server.vm_url("web_1"))["DocumentIncarnation"]
    assert after == 1 < before
    again = http.post(server.url + "/control/vms/web_1/reset", json={"restartAt": 0}).json()
    assert again == {"documentIncarnation": 0}


def test_request_counters_count_each_vm_and_can_be_reset(
    served: tuple[Simulator, SimulatorServer], http: requests.Session
) -> None:
    _, server = served
    for _ in range(3):
        document(http, server.vm_url("db-1"))
    approve(http, server.vm_url("db-1"), {"StartRequests": []})
    http.get(server.vm_url("db-1") + SCHEDULED_EVENTS, params=LATEST)  # no header: still counted
    counters = http.get(server.url + "/control/counters").json()["counters"]
    assert counters["db-1"] == {
        "GET": 4,
        "POST": 1,
        "GET scheduledevents": 4,
        "POST scheduledevents": 1,
        "GET scheduledevents 2020-07-01": 4,  # by api-version too
        "POST scheduledevents 2020-07-01": 1,
        "status 200": 4,
        "status 400": 1,
    }
    assert counters["db-0"] == {}
    assert http.delete(server.url + "/control/counters").json()["counters"]["db-1"] == {}


# -- in-process API and lifecycle of the server ------------------------------------------


def test_the_in_process_approve_records_like_the_endpoint(
    served: tuple[Simulator, SimulatorServer],
) -> None:
    sim, _ = served
    [event_id] = sim.run_scenario("user-reboot", vms=["vm-1"], run_time=6000)
    sim.approve("vm-1", [event_id])
    with pytest.raises(UnknownEventError):
        sim.approve("vm-0", [event_id])
    assert [(a.vm, a.status, a.event_status) for a in sim.approvals()] == [
        ("vm-1", 200, "Started"),
        ("vm-0", 400, "Started"),
    ]


def test_stop_closes_idle_keep_alive_connections_promptly(make_server: Factory) -> None:
    _, server = make_server()
    threads_before = threading.active_count()
    with requests.Session() as http:
        document(http, server.vm_url("vm-0"))  # leaves a pooled keep-alive connection open
        began = time.monotonic()
        server.stop()
        assert time.monotonic() - began < 2
    assert threading.active_count() < threads_before
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.url


# -- the command line --------------------------------------------------------------------

_CLI = (
    "import argparse, sys\n"
    "from bridge.simulator import command as simulator\n"
    "parser = argparse.ArgumentParser(prog='se-bridge')\n"
    "simulator.add_parser(parser.add_subparsers(dest='command'))\n"
    "args = parser.parse_args()\n"
    "sys.exit(args.func(args))\n"
)


def _start_cli(*flags: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", _CLI, "simulate", "--port", "0", *flags]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_the_cli_serves_prints_urls_and_exits_0_on_a_signal(
    http: requests.Session, stop_signal: signal.Signals
) -> None:
    flags = (
        "--vms",
        "2",
        "--time-scale",
        "60",
        "--scenario",
        "user-reboot",
        "--vm-fault",
        "vm-1:rate503=1",
    )
    with _start_cli(*flags) as proc:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(5)]
        vm_url = lines[2].split()[1]
        assert lines[0].startswith("IMDS simulator for 2 VMs at http://127.0.0.1:")
        assert lines[1].split()[0] == "vm-0"
        assert vm_url.endswith("/vm/vm-1")
        assert lines[4].startswith("scenario user-reboot: ")
        assert len(document(http, lines[1].split()[1])["Events"]) == 1
        assert http.get(vm_url + SCHEDULED_EVENTS, params=LATEST, headers=META).status_code == 503
        proc.send_signal(stop_signal)
        _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "scheduled; 1 VM(s) see it" in stderr


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_signal_as_soon_as_the_cli_announces_itself_stops_it_cleanly() -> None:
    # The first line says the simulator is there: from then on a signal stops it with 0.
    with _start_cli("--vms", "50", "--scenario", "user-reboot") as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("IMDS simulator for 50 VMs at ")
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
    assert proc.returncode == 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--fleet", "/nonexistent/fleet.json"), "cannot read fleet file /nonexistent/fleet.json"),
        (("--time-scale", "0"), "--time-scale must be greater than 0"),
        (("--rate-503", "2"), "fault rate503 is out of range"),
        (("--vm-fault", "ghost:rate503=1"), "no VM named 'ghost'"),
        (("--vm-fault", "vm-0:rate503"), "use VM:KEY=VALUE"),
        (("--vms", "1", "--scenario", "spot-preempt"), "no VM in the fleet suits"),
    ],
)
def test_the_cli_refuses_bad_settings_with_exit_code_2(
    flags: tuple[str, ...], message: str
) -> None:
    with _start_cli(*flags) as proc:
        _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 2
    assert message in stderr


# --- the control API refuses what a web page could send -------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Type": "text/plain"},  # a form or fetch() needs no CORS preflight for this
        {"Content-Type": "application/x-www-form-urlencoded"},
        {},  # fetch() with no body sends no Content-Type at all
    ],
    ids=["text/plain", "form", "none"],
)
def test_a_change_needs_a_json_content_type(
    served: tuple[Simulator, SimulatorServer], headers: dict[str, str]
) -> None:
    sim, server = served
    with requests.Session() as plain:
        body = json.dumps({"rate503": 1.0}).encode()
        refused = plain.post(server.url + "/control/faults", data=body, headers=headers)
        ended = plain.post(f"{server.url}/control/vms/{sim.vm_names[0]}/reset", headers=headers)
    assert (refused.status_code, ended.status_code) == (415, 415)
    assert "application/json" in refused.json()["error"]
    assert sim.faults.snapshot()["global"]["rate503"] == 0


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.evil.example"])
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_the_control_api_answers_only_a_loopback_host(
    served: tuple[Simulator, SimulatorServer], host: str, method: str
) -> None:
    """DNS rebinding: a page served from evil.example that resolves to 127.0.0.1 still says
    Host: evil.example."""
    sim, server = served
    with requests.Session() as plain:
        response = plain.request(method, server.url + "/control/faults", json={"rate503": 1.0},
                                 headers={"Host": host})  # fmt: skip
    assert response.status_code == 403
    assert "loopback" in response.json()["error"]
    assert sim.faults.snapshot()["global"]["rate503"] == 0


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]", "LOCALHOST"])
def test_loopback_hosts_may_use_the_control_api(
    served: tuple[Simulator, SimulatorServer], http: requests.Session, host: str
) -> None:
    _, server = served
    port = server.url.rsplit(":", 1)[1]
    response = http.post(server.url + "/control/faults", json={"latency": 0},
                         headers={"Host": f"{host}:{port}"})  # fmt: skip
    assert response.status_code == 200, response.text


# --- a stalled and an endless IMDS --------------------------------------------------------


@pytest.mark.parametrize(
    ("faults", "message", "deadline"),
    # The endless answer must end at the size cap, not the deadline: a deadline far beyond the
    # time the cap takes, so that a loaded machine, slow to send the bytes, still hits the cap.
    [({"drip": 0.5}, "did not finish answering", 1.0), ({"rateEndless": 1.0}, "more than", 60.0)],
    ids=["drip", "endless"],
)
def test_a_stalled_or_endless_imds_ends_as_a_retryable_error(
    served: tuple[Simulator, SimulatorServer],
    faults: dict[str, float],
    message: str,
    deadline: float,
) -> None:
    sim, server = served
    sim.set_faults(faults)
    client = imds.ImdsClient(
        server.vm_url(sim.vm_names[0]), timeout=deadline, first_call_timeout=deadline
    )
    began = time.monotonic()
    try:
        with pytest.raises(RetryableError, match=message):
            client.scheduled_events()
    finally:
        client.close()
    assert time.monotonic() - began < deadline + 4  # the whole answer's deadline, not a byte's
    sim.clear_faults()
    assert document(requests.Session(), server.vm_url(sim.vm_names[0]))["Events"] == []
