"""The week ahead in the consumer (issue 40, item 2): a periodic pass reads the maintenance
configurations through Resource Graph (the real client over HTTPS, the Resource Graph double,
the consumer's managed identity from the IMDS simulator), writes an Upcoming record per VM and
run to the consumer's sinks, keeps a summary `status --consumer` lists, and never stops the
consumer when it fails. `policy check --azure` reads the same configurations once."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import azure.functions as func
import pytest
from azure.functions.decorators.timer import TimerTrigger
from azure.functions.timer import TimerRequest

from bridge import cli
from bridge.config import ConfigError, WeekAheadSettings, load
from bridge.consumer import wiring
from bridge.consumer.functionapp import ConsumerApp, build_app
from bridge.consumer.service import ConsumerService
from bridge.consumer.sources.resourcegraph import ATTEMPTS, RequestsTransport, ResourceGraph
from bridge.consumer.weekaheadpass import check_settings, read_summary
from bridge.retry import Backoff
from tests.component.consumer.test_functionapp import by_name, local_env, managed_identity
from tests.component.consumer.test_resource_graph import Token
from tests.doubles.resourcegraph import ResourceGraphDouble
from tests.support.fleetrecords import SUBSCRIPTION, FleetRecords
from tests.support.processes import run_bridge
from tests.support.records import assert_valid
from tests.unit.consumer.test_planned import event_row, impacted_row, ticks

POLICY = "version: 1\nbudgets: [{name: one, group: scale_set, max_vms: 1}]\n" \
         "rules: [{name: all, action: approve}]\n"  # fmt: skip
CONFIGURATION = (
    f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg-patch/providers/Microsoft.Maintenance/"
    "maintenanceConfigurations/web-tue-0200"
)
SCALE_SET = (
    f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg-app/providers/Microsoft.Compute/"
    "virtualMachineScaleSets/web"
)
VMS = ("web_0", "web_1", "web_2", "web_3")


def azure_holds(graph: ResourceGraphDouble, window: dict[str, str] | None = None) -> None:
    """A weekly Tuesday configuration assigned to the scale set `web` (Resource Graph's rows;
    the window as Microsoft's reference for maintenance configurations shapes it)."""
    graph.tables["resources"] = [{
        "id": CONFIGURATION, "name": "web-tue-0200",
        "type": "microsoft.maintenance/maintenanceconfigurations",
        "subscriptionId": SUBSCRIPTION, "resourceGroup": "rg-patch",
        "properties": {"maintenanceScope": "InGuestPatch", "maintenanceWindow": window or {
            "startDateTime": "2024-06-01 02:00", "duration": "03:55",
            "timeZone": "W. Europe Standard Time", "recurEvery": "Week Tuesday"}},
    }]  # fmt: skip
    graph.tables["maintenanceresources"] = [{
        "id": f"{SCALE_SET}/providers/Microsoft.Maintenance/configurationAssignments/web",
        "name": "web", "type": "microsoft.maintenance/configurationassignments",
        "subscriptionId": SUBSCRIPTION, "resourceGroup": "rg-app",
        "properties": {"maintenanceConfigurationId": CONFIGURATION, "resourceId": SCALE_SET},
    }]  # fmt: skip


def fleet_records() -> list[dict[str, Any]]:
    """Heartbeats of the scale set's four VMs, as their agents send them."""
    fleet = FleetRecords(datetime.now(timezone.utc))
    for name in VMS:
        fleet.vm(name, scale_set="web")
    return [fleet.heartbeat(name) for name in VMS]


@dataclass
class Rig:
    root: Path
    graph: ResourceGraphDouble
    env: dict[str, str]

    def service(self, **more: str) -> ConsumerService:
        """The consumer with its sinks' delivery running (as `run` starts it)."""
        made = ConsumerService(wiring.load_config(environ=self.env | more))
        made.delivery.start()
        return made

    def passed_once(self) -> None:
        """A consumer that knows the scale set's VMs makes one pass, and stops."""
        service = self.service()
        try:
            service.consumer.process(fleet_records())
            passed(service)
        finally:
            service.close()

    def decisions(self) -> list[dict[str, Any]]:
        path = self.root / "consumer" / "decisions.jsonl"
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line]


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    with ResourceGraphDouble() as graph, managed_identity(monkeypatch, graph.ca_bundle):
        azure_holds(graph)
        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY, encoding="utf-8")
        # Without the Functions host's connection settings, which the worker ignores.
        env = {k: v for k, v in local_env(tmp_path).items() if "__" not in k} | {
            "SE_BRIDGE_CONSUMER_STATE_DIR": str(tmp_path / "consumer"),
            "SE_BRIDGE_CONSUMER_HUB": str(tmp_path / "hub"),
            "SE_BRIDGE_CONSUMER_POLICY": str(policy),
            "SE_BRIDGE_IDENTITY_KIND": "managed",
            "SE_BRIDGE_EVENTGRID_RESOURCE_GRAPH_URL": graph.url,
            "SE_BRIDGE_WEEKAHEAD_ENABLED": "true",
            "SE_BRIDGE_WEEKAHEAD_SUBSCRIPTIONS": SUBSCRIPTION,
        }
        yield Rig(tmp_path, graph, env)


def passed(service: ConsumerService) -> None:
    """One pass of the week ahead, its records delivered to the sinks."""
    week = service.week_ahead
    assert week is not None
    week.once(21600)
    assert service.delivery.flush(timeout=60)


def failures(service: ConsumerService, kind: str) -> float | None:
    labels = {"activity": "weekahead", "kind": kind}
    return service.metrics.registry.get_sample_value("se_bridge_consumer_failures_total", labels)


def test_a_pass_writes_an_upcoming_record_per_vm_and_run_naming_the_budget_it_breaks(
    rig: Rig,
) -> None:
    rig.passed_once()
    upcoming = [r for r in rig.decisions() if r["RecordType"] == "Upcoming"]
    # Two Tuesdays in the next 14 days, each patching the four VMs of the set at once.
    assert len(upcoming) == 8
    assert sorted({r["VmName"] for r in upcoming}) == list(VMS)
    assert len({r["WindowStart"] for r in upcoming}) == 2
    for record in upcoming:
        assert_valid(record)
        assert record["MaintenanceConfiguration"] == "web-tue-0200"
        assert record["VmScaleSetName"] == "web"
        (said,) = record["BudgetBreaks"]
        assert "one" in said
        assert "more than the 1 allowed" in said
    # Read as the consumer's identity: every query carried its token.
    assert rig.graph.requests
    assert all(r.authorized and r.status == 200 for r in rig.graph.requests)
    # The configurations (resources), then the one's assignments (maintenanceresources).
    assert {"resources", "maintenanceresources"} <= {r.table for r in rig.graph.requests}


def test_a_restart_or_another_consumer_within_the_interval_reads_nothing_again(rig: Rig) -> None:
    """Every consumer of one fleet state (and one restarted) passes as it starts: the newest
    pass's summary says when the days ahead were last read, and a pass within the interval of
    it asks Resource Graph nothing and writes nothing."""
    rig.passed_once()
    asked = len(rig.graph.requests)
    written = len(rig.decisions())
    rig.passed_once()
    assert len(rig.graph.requests) == asked
    assert len(rig.decisions()) == written


def test_a_failing_resource_graph_is_a_counted_failure_and_the_next_pass_goes_through(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    service = rig.service()
    try:
        week = service.week_ahead
        assert week is not None
        # The client of the pass, with waits that take no time (Retry-After is honoured).
        week.graph = ResourceGraph(rig.graph.url, Token(), RequestsTransport(),
                                   sleep=lambda seconds: True,
                                   backoff=Backoff(initial=0.01, maximum=0.02))  # fmt: skip
        service.consumer.process(fleet_records())
        rig.graph.throttle = ATTEMPTS  # every try of the first query: 429
        with caplog.at_level(logging.INFO, logger="bridge"):
            passed(service)
            assert failures(service, "ThrottledError") == 1
            assert [r for r in rig.decisions() if r["RecordType"] == "Upcoming"] == []
            passed(service)  # the next interval's
        assert failures(service, "ThrottledError") == 1
    finally:
        service.close()
    assert len([r for r in rig.decisions() if r["RecordType"] == "Upcoming"]) == 8
    said = [r for r in caplog.records if "week ahead" in r.getMessage()]
    warned = [r for r in said if r.levelno >= logging.WARNING]
    assert len(warned) == 1, [r.getMessage() for r in said]
    assert warned[0].levelno == logging.WARNING  # Resource Graph's failure, not a bug
    assert "weekahead.subscriptions" in warned[0].getMessage()  # what to check
    assert any("works again" in r.getMessage() for r in said)


def test_a_schedule_that_cannot_be_read_is_a_warning_naming_its_configuration(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    azure_holds(rig.graph, {"startDateTime": "2024-06-01 02:00", "duration": "03:55",
                            "timeZone": "UTC", "recurEvery": "6Hours"})  # fmt: skip
    service = rig.service()
    try:
        with caplog.at_level(logging.WARNING, logger="bridge"):
            passed(service)
        summary = read_summary(service.consumer.store)
    finally:
        service.close()
    (warned,) = [r.getMessage() for r in caplog.records if "6Hours" in r.getMessage()]
    assert "web-tue-0200" in warned
    assert summary is not None
    assert summary["problems"] == 1


def status(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, str]:
    """`se-bridge status --consumer` with the consumer's settings: its exit code and stdout."""
    for key, value in rig.env.items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    code = cli.main(["status", "--consumer", *extra])
    return code, capsys.readouterr().out


def test_status_lists_the_runs_that_would_break_a_budget(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rig.passed_once()
    code, out = status(rig, monkeypatch, capsys)
    assert code == 1, out  # WARNING: a budget would break within the days ahead
    assert "week ahead: 2 runs would break a budget, 0 others" in out
    breaks = [line for line in out.splitlines() if line.startswith("  break:")]
    assert len(breaks) == 2, out
    assert all("web-tue-0200" in line and "budget one" in line for line in breaks)
    code, out = status(rig, monkeypatch, capsys, "--json")
    found = json.loads(out)
    assert code == 1
    assert found["week_ahead"]["breaking"][0]["name"] == "web-tue-0200"
    assert found["week_ahead"]["others"] == 0


def test_status_warns_when_the_week_ahead_has_not_been_read_for_two_intervals(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rig.passed_once()
    later = datetime.now(timezone.utc) + timedelta(hours=13)  # the interval is 6 h
    monkeypatch.setattr("bridge.consumer.status.utc_now", lambda: later)
    code, out = status(rig, monkeypatch, capsys)
    assert code == 1, out
    assert "the week ahead was last read at" in out
    assert "weekahead" in out  # where to look: the consumer's log of activity weekahead


def check_azure(
    rig: Rig,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    heard: list[dict[str, Any]],
) -> tuple[Any, list[str]]:
    """`policy check --azure` at a Monday (2026-12-07 09:00Z) by a consumer that has heard
    `heard`; it exits 1: what it printed and its BREAK lines."""
    service = rig.service(SE_BRIDGE_WEEKAHEAD_ENABLED="false")
    try:
        service.consumer.process(heard)
    finally:
        service.close()
    for key, value in rig.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SE_BRIDGE_WEEKAHEAD_ENABLED", "false")  # a check needs no pass
    capsys.readouterr()
    code = cli.main(["policy", "check", str(rig.root / "policy.yaml"), "--azure",
                     "--at", "2026-12-07T09:00:00Z"])  # fmt: skip
    said = capsys.readouterr()
    assert code == 1, said
    return said, [line for line in said.out.splitlines() if line.startswith("BREAK ")]


def test_policy_check_azure_prints_each_break_and_exits_1(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    said, breaks = check_azure(rig, monkeypatch, capsys, fleet_records())
    assert breaks == [
        "BREAK 2026-12-08 01:00Z web-tue-0200: budget one, group "
        f"{SUBSCRIPTION}/rg-app/web: 4 VMs at once, limit 1",
        "BREAK 2026-12-15 01:00Z web-tue-0200: budget one, group "
        f"{SUBSCRIPTION}/rg-app/web: 4 VMs at once, limit 1",
    ]
    assert "2 runs of 1 configurations in the next 14 days: 2 would break a budget" in said.out
    assert all(r.authorized for r in rig.graph.requests)


def test_policy_check_azure_counts_service_healths_window_with_the_runs_and_names_it(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The fleet's budget takes 5 of 6 VMs: the run's 4 fit; with the 2 of `api` a planned
    # maintenance names during the first run, they do not.
    (rig.root / "policy.yaml").write_text(
        "version: 1\nbudgets: [{name: most, group: fleet, max_vms: 5}]\n"
        "rules: [{name: all, action: approve}]\n", encoding="utf-8")  # fmt: skip
    api = SCALE_SET.replace("/web", "/api")
    start = datetime(2026, 12, 8, 0, 0, tzinfo=timezone.utc)
    rig.graph.tables["servicehealthresources"] = [
        event_row(sub=SUBSCRIPTION, ImpactStartTime=ticks(start),
                  ImpactMitigationTime=ticks(start + timedelta(hours=6))),
        impacted_row(api, sub=SUBSCRIPTION, kind="Microsoft.Compute/virtualMachineScaleSets"),
    ]  # fmt: skip
    api_vms = FleetRecords(datetime.now(timezone.utc))
    for name in ("api_0", "api_1"):
        api_vms.vm(name, scale_set="api")
    heard = [api_vms.heartbeat(name) for name in ("api_0", "api_1")]
    said, breaks = check_azure(rig, monkeypatch, capsys, [*fleet_records(), *heard])
    assert breaks == [
        "BREAK 2026-12-08 00:00Z PYN_-ZL8: budget most, group fleet: 6 VMs at once, limit 5 "
        "(with maintenance configuration web-tue-0200's run at 2026-12-08 01:00Z (4 VMs))",
        "BREAK 2026-12-08 01:00Z web-tue-0200: budget most, group fleet: 6 VMs at once, "
        "limit 5 (with Service Health's planned maintenance PYN_-ZL8 (2 VMs))",
    ]
    assert ("2 runs of 1 configurations and 1 window of Service Health or AKS in the next 14 "
            "days: 2 would break a budget") in said.out  # fmt: skip


def test_policy_check_azure_without_subscriptions_says_which_setting_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    for key, value in local_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    code = cli.main(["policy", "check", str(policy), "--azure"])
    assert code == 2
    assert "weekahead.subscriptions" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"SE_BRIDGE_WEEKAHEAD_ENABLED": "true"}, r"weekahead\.subscriptions"),
        ({"SE_BRIDGE_WEEKAHEAD_ENABLED": "true", "SE_BRIDGE_WEEKAHEAD_SUBSCRIPTIONS": "prod"},
         r"prod is not a subscription id"),
        ({"SE_BRIDGE_WEEKAHEAD_INTERVAL": "60"}, r"weekahead\.interval"),
    ],
)  # fmt: skip
def test_a_setting_that_cannot_work_is_refused_at_start(
    tmp_path: Path, settings: dict[str, str], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        wiring.load_config(environ=local_env(tmp_path) | settings)


def test_consume_with_a_bad_week_ahead_setting_exits_2_and_says_why(tmp_path: Path) -> None:
    env = local_env(tmp_path) | {"SE_BRIDGE_WEEKAHEAD_ENABLED": "true"}
    done = run_bridge("consume", "--state-dir", str(tmp_path / "consumer"), env=env)
    assert done.returncode == 2, done.stderr
    assert "configuration error" in done.stderr
    assert "weekahead.subscriptions" in done.stderr


def test_eventgrid_subscriptions_serve_when_the_week_ahead_names_none() -> None:
    config = load(environ={"SE_BRIDGE_EVENTGRID_SUBSCRIPTIONS": SUBSCRIPTION,
                           "SE_BRIDGE_WEEKAHEAD_ENABLED": "true"})  # fmt: skip
    check_settings(config.weekahead, config.eventgrid)
    check_settings(WeekAheadSettings(), config.eventgrid)  # off: nothing checked


def test_the_functions_app_runs_a_pass_on_a_timer_of_its_interval(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    env = rig.env | {"SE_BRIDGE_WEEKAHEAD_INTERVAL": "3600"}
    backend = ConsumerApp(environ=env)
    try:
        functions = by_name(build_app(backend, environ=env))
        timer = functions["weekahead"]
        assert isinstance(timer.get_trigger(), TimerTrigger)
        (raw,) = [json.loads(b) for b in timer.get_raw_bindings()]
        assert raw["schedule"] == "0 0 */1 * * *"
        assert raw["useMonitor"] is True
        functions["records"].get_user_function()(
            [func.EventHubEvent(body=json.dumps(r).encode()) for r in fleet_records()]
        )
        with caplog.at_level(logging.INFO, logger="bridge.consumer.functionapp"):
            timer.get_user_function()(TimerRequest(past_due=False))
        summary = read_summary(backend.consumer().store)
    finally:
        backend.close()
    prefix = "Upcoming record: "
    logged = [json.loads(r.getMessage()[len(prefix):]) for r in caplog.records
              if r.getMessage().startswith(prefix)]  # fmt: skip
    assert len(logged) == 8
    assert all(r["BudgetBreaks"] for r in logged)
    assert summary is not None
    assert len(summary["breaking"]) == 2


def test_the_functions_app_has_no_week_ahead_timer_unless_it_is_on(tmp_path: Path) -> None:
    env = local_env(tmp_path)
    backend = ConsumerApp(environ=env)
    try:
        assert "weekahead" not in by_name(build_app(backend, environ=env))
    finally:
        backend.close()
    odd = env | {"SE_BRIDGE_WEEKAHEAD_ENABLED": "true", "SE_BRIDGE_WEEKAHEAD_INTERVAL": "5400",
                 "SE_BRIDGE_WEEKAHEAD_SUBSCRIPTIONS": SUBSCRIPTION}  # fmt: skip
    with pytest.raises(ConfigError, match=r"SE_BRIDGE_WEEKAHEAD_INTERVAL.*NCRONTAB"):
        build_app(ConsumerApp(environ=odd), environ=odd)
