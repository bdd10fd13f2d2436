"""The Azure Functions app: its binding metadata as the host receives it, and its functions
called as the Python worker calls them, with real azure.functions objects, over a SQLite
fleet state and a local command channel (Core Tools cannot be installed offline).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import time
import typing
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import azure.functions as func
import pytest
from azure.functions import FunctionRegister
from azure.functions.decorators.core import BindingDirection, Cardinality, DataType
from azure.functions.decorators.eventhub import EventHubTrigger
from azure.functions.decorators.function_app import Function
from azure.functions.decorators.timer import TimerTrigger
from azure.functions.eventhub import EventHubTriggerConverter
from azure.functions.http import HttpRequestConverter
from azure.functions.meta import Datum
from azure.functions.timer import TimerRequest, TimerRequestConverter

from bridge import schema
from bridge.commands import signing
from bridge.config import ConfigError, load
from bridge.consumer import functionapp
from bridge.consumer.functionapp import ConsumerApp, DecisionOutlet, build_app, load_config
from bridge.consumer.people.app import Csrf
from bridge.consumer.reading import Position
from bridge.consumer.sources import resourcegraph
from bridge.retry import PoisonRecords, RetryableError
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import Fleet
from bridge.simulator.vms import demo_vms
from bridge.sinks import BaseSink, SpooledRecord
from tests.doubles.entra import AUDIENCE, Tenant, serving
from tests.doubles.logs_ingestion import LogsIngestionDouble
from tests.doubles.resourcegraph import ResourceGraphDouble, row_of
from tests.support import eventgrid as eg
from tests.support.fleetrecords import SUBSCRIPTION, FleetRecords
from tests.support.records import assert_valid

ROOT = Path(__file__).resolve().parents[3]
APP_DIR = ROOT / "functions"
E1 = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
E2 = "A1B2C3D4-0000-4000-8000-000000000002"
RULE = "dcr-00000000000000000000000000000002"
OTHER_SUB = "0b0b0b0b-9999-4999-8999-999999999999"


@dataclass
class Rig:
    """A function app over local transports, and a fleet whose records it is handed."""

    env: dict[str, str]
    backend: ConsumerApp
    functions: dict[str, Function]  # get_functions() may be called once per app: it raises after
    fleet: FleetRecords
    commands: Path

    def function(self, name: str) -> Function:
        return self.functions[name]

    def records(self, *bodies: bytes | dict[str, Any]) -> None:
        """Invoke the Event Hubs function as the worker does, with one batch."""
        events = [func.EventHubEvent(body=_bytes(body)) for body in bodies]
        self.function("records").get_user_function()(events)

    def tick(self) -> None:
        self.function("reevaluate").get_user_function()(TimerRequest(past_due=False))

    def reconcile(self, past_due: bool = False) -> None:
        """Invoke the Resource Graph reconciler's timer as the worker does."""
        self.function("reconcile").get_user_function()(TimerRequest(past_due=past_due))

    def sent(self, name: str) -> list[dict[str, Any]]:
        """The commands in the channel of VM `name`: DIR/<vmid lowercased>/<command_id>.json."""
        folder = self.commands / self.fleet.vm_id(name).lower()
        if not folder.is_dir():
            return []
        out = []
        for path in sorted(folder.glob("*.json")):
            command = json.loads(json.loads(path.read_text(encoding="utf-8"))["Body"])
            assert path.name == f"{command['CommandId'].lower()}.json"
            out.append(command)
        return out

    def user_reboot(self, name: str, event_id: str = E1) -> list[dict[str, Any]]:
        """Heartbeats of both VMs, then a user-initiated reboot of `name` only."""
        return [
            self.fleet.heartbeat("web_0"),
            self.fleet.heartbeat("web_1"),
            self.fleet.event(name, event_id, resources=[name]),
        ]


def _bytes(body: bytes | dict[str, Any]) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")


def local_env(tmp_path: Path) -> dict[str, str]:
    # Beside tmp_path, not in it: a test checks that nothing is written there.
    key = tmp_path.with_name(tmp_path.name + "-signing.pem")
    if not key.exists():
        signing.keygen(key)
    return {
        "SE_BRIDGE_COMMANDS_SIGNING_KEY": f"file:{key}",
        "SE_BRIDGE_CONSUMER_STATE": f"sqlite:{tmp_path / 'fleet.db'}",
        "SE_BRIDGE_COMMANDS_CHANNEL": f"local:{tmp_path / 'cmds'}",
        "SE_BRIDGE_AGENT_STATE_DIR": str(tmp_path),
        "SE_BRIDGE_EVENTHUBS_NAME": "records",
        "SE_BRIDGE_CONSUMER_CONSUMER_GROUP": "$Default",
        # The host's identity-based connection settings, present in a real app.
        "SE_BRIDGE_EVENTHUBS__fullyQualifiedNamespace": "contoso.servicebus.windows.net",
        "SE_BRIDGE_EVENTHUBS__credential": "managedidentity",
    }


def make_rig(env: dict[str, str], tmp_path: Path) -> Rig:
    backend = ConsumerApp(environ=env)
    fleet = FleetRecords(datetime.now(timezone.utc))
    fleet.vm("web_0", scale_set="web")
    fleet.vm("web_1", scale_set="web")
    functions = by_name(build_app(backend, environ=env))
    return Rig(env, backend, functions, fleet, tmp_path / "cmds")


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = make_rig(local_env(tmp_path), tmp_path)
    yield made
    made.backend.close()


def by_name(app: FunctionRegister) -> dict[str, Function]:
    return {str(f.get_function_name()): f for f in app.get_functions()}


def decisions_logged(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    prefix = "Decision record: "
    return [
        json.loads(r.getMessage()[len(prefix) :])
        for r in caplog.records
        if r.name == "bridge.consumer.functionapp" and r.getMessage().startswith(prefix)
    ]


# --- binding metadata ------------------------------------------------------------------------


def test_the_event_hub_trigger_takes_batches_named_by_app_settings(rig: Rig) -> None:
    assert sorted(rig.functions) == ["page", "records", "reevaluate"]
    records = rig.function("records")
    trigger = records.get_trigger()
    assert isinstance(trigger, EventHubTrigger)
    assert [b.name for b in records.get_bindings()] == ["events"]
    assert trigger.direction == BindingDirection.IN.value
    assert trigger.cardinality == Cardinality.MANY
    assert trigger.data_type == DataType.BINARY.value
    # What the worker hands the host (raw bindings), and the function.json equivalent.
    (raw,) = [json.loads(b) for b in records.get_raw_bindings()]
    assert json.loads(records.get_function_json()) == {
        "scriptFile": "function_app.py",
        "bindings": [raw],
    }
    assert raw["type"] == "eventHubTrigger"
    assert raw["name"] == "events"
    assert raw["direction"].lower() == "in"
    assert raw["cardinality"].lower() == "many"
    assert raw["dataType"].lower() == "binary"
    assert raw["connection"] == "SE_BRIDGE_EVENTHUBS"
    assert raw["eventHubName"] == "%SE_BRIDGE_EVENTHUBS_NAME%"
    assert raw["consumerGroup"] == "%SE_BRIDGE_CONSUMER_CONSUMER_GROUP%"
    # The %settings% the host resolves are the ones se-bridge's own config reads.
    config = load(environ={"SE_BRIDGE_EVENTHUBS_NAME": "hub-a",
                           "SE_BRIDGE_CONSUMER_CONSUMER_GROUP": "group-b"})  # fmt: skip
    assert (config.eventhubs.name, config.consumer.consumer_group) == ("hub-a", "group-b")


def test_a_failed_batch_is_retried_forever_with_exponential_backoff(rig: Rig) -> None:
    retry = rig.function("records").get_settings_dict("retry_policy")
    assert retry == {
        "setting_name": "retry_policy",
        "strategy": "exponential_backoff",
        "max_retry_count": "-1",
        "minimum_interval": "00:00:01",
        "maximum_interval": "00:01:00",
    }
    # Read as the worker reads them (int(), strptime "%H:%M:%S").
    assert int(retry["max_retry_count"]) == -1
    for key, seconds in (("minimum_interval", 1), ("maximum_interval", 60)):
        parsed = time.strptime(retry[key], "%H:%M:%S")
        assert parsed.tm_hour * 3600 + parsed.tm_min * 60 + parsed.tm_sec == seconds
    # The timer needs none: its next run does the same work.
    assert rig.function("reevaluate").get_settings_dict("retry_policy") is None


def test_the_timer_runs_every_10_seconds_unless_an_app_setting_says_otherwise(
    rig: Rig, tmp_path: Path
) -> None:
    timer = rig.function("reevaluate")
    trigger = timer.get_trigger()
    assert isinstance(trigger, TimerTrigger)
    (raw,) = [json.loads(b) for b in timer.get_raw_bindings()]
    assert raw == {
        "direction": raw["direction"],
        "type": "timerTrigger",
        "name": "timer",
        "schedule": "*/10 * * * * *",
        "useMonitor": False,
    }
    assert raw["direction"].lower() == "in"
    other = build_app(rig.backend, environ={"SE_BRIDGE_FUNCTIONS_TIMER": "0 */1 * * * *"})
    again = by_name(other)["reevaluate"]
    assert json.loads(again.get_raw_bindings()[0])["schedule"] == "0 */1 * * * *"
    with pytest.raises(ConfigError, match="SE_BRIDGE_FUNCTIONS_TIMER"):
        build_app(rig.backend, environ={"SE_BRIDGE_FUNCTIONS_TIMER": "*/5 * * * *"})


def test_the_worker_would_load_every_function(rig: Rig) -> None:
    """The checks the Python worker makes when it indexes the app (azure_functions_worker
    functions.Registry.add_indexed_function): annotations resolved with get_type_hints,
    parameters named as the bindings, and each annotation accepted by its converter."""
    converters = {"eventHubTrigger": EventHubTriggerConverter,
                  "timerTrigger": TimerRequestConverter,
                  "httpTrigger": HttpRequestConverter}  # fmt: skip
    for function in rig.functions.values():
        user = function.get_user_function()
        hints = typing.get_type_hints(user)
        params = [p for p in hints if p != "return"]
        # An HTTP function's answer is its return value, the binding "$return".
        assert params == [b.name for b in function.get_bindings() if b.name != "$return"]
        trigger = function.get_trigger()
        assert trigger is not None
        assert converters[str(trigger.type)].check_input_type_annotation(hints[params[0]])
    # Why the trigger's annotation is typing.List: the converter refuses the builtin generic.
    assert not EventHubTriggerConverter.check_input_type_annotation(list[func.EventHubEvent])


def test_function_app_py_defines_one_app_and_builds_nothing_when_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in local_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("function_app", APP_DIR / "function_app.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # The worker indexes the module's one FunctionRegister; a second one fails indexing.
    apps = [v for v in vars(module).values() if isinstance(v, FunctionRegister)]
    assert len(apps) == 1
    assert sorted(by_name(apps[0])) == ["page", "records", "reevaluate"]
    assert list(tmp_path.iterdir()) == []  # the consumer is built at the first invocation


def test_the_deployment_files_say_what_the_host_needs() -> None:
    # requirements.txt is written by ./dev functionapp, hashes and all
    # (tests/packaging/test_supply_chain.py); the source folder has none to go stale.
    assert not (APP_DIR / "requirements.txt").exists()
    host = json.loads((APP_DIR / "host.json").read_text(encoding="utf-8"))
    assert host["version"] == "2.0"
    assert host["extensionBundle"]["version"] == "[4.*, 5.0.0)"
    event_hubs = host["extensions"]["eventHubs"]
    assert event_hubs["maxEventBatchSize"] == 100
    # A poison body and the Decision records (without Log Analytics) live only in traces:
    # sampling must not drop them.
    excluded = host["logging"]["applicationInsights"]["samplingSettings"]["excludedTypes"]
    assert "Trace" in excluded.split(";")
    lines = (APP_DIR / ".funcignore").read_text(encoding="utf-8").splitlines()
    ignored = [line for line in lines if line.strip() and not line.startswith("#")]
    assert ignored
    assert not [line for line in ignored if "wheels" in line or "function_app" in line]


# --- invocations -----------------------------------------------------------------------------


def test_a_user_reboot_becomes_one_command_for_the_right_vm(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bridge")
    rig.records(*rig.user_reboot("web_1"))
    (command,) = rig.sent("web_1")
    assert (command["Type"], command["EventId"]) == ("Approve", E1)
    assert command["VmId"] == rig.fleet.vm_id("web_1")
    assert rig.sent("web_0") == []
    # Without Log Analytics settings the Decision record goes to the log, whole, as JSON.
    (decision,) = decisions_logged(caplog)
    assert (decision["DecisionAction"], decision["CommandId"]) == ("Approve", command["CommandId"])
    assert_valid(decision)


def test_poison_bodies_are_logged_whole_and_the_good_records_go_on(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    poison = [b"{not json", b"\xff\xfe\x00garbage", b"[1, 2]", b""]
    heartbeat_0, heartbeat_1, event = rig.user_reboot("web_1")
    rig.records(heartbeat_0, poison[0], heartbeat_1, poison[1], poison[2], event, poison[3])
    assert [c["EventId"] for c in rig.sent("web_1")] == [E1]
    logged = [r for r in caplog.records if r.name == "bridge.consumer.sources.batches"]
    assert [r.levelno for r in logged] == [logging.ERROR] * 4
    messages = [r.getMessage() for r in logged]
    assert repr("{not json") in messages[0]
    assert repr("\\xff\\xfe\x00garbage") in messages[1]  # not UTF-8: kept byte for byte
    assert "not an object" in messages[2]
    assert "not JSON" in messages[3]


def test_a_batch_of_only_poison_builds_nothing(rig: Rig, tmp_path: Path) -> None:
    rig.records(b"nonsense")
    assert not (tmp_path / "fleet.db").exists()


def test_a_failing_channel_fails_the_invocation_and_the_rerun_sends_one_command(
    rig: Rig,
) -> None:
    blocker = rig.commands / rig.fleet.vm_id("web_1").lower()
    rig.commands.mkdir()
    blocker.write_text("a file where the VM's channel directory should be", encoding="utf-8")
    batch = rig.user_reboot("web_1")
    with pytest.raises(RetryableError, match="cannot write command file"):
        rig.records(*batch)
    blocker.unlink()
    assert rig.sent("web_1") == []
    # The retry policy invokes the function again with the same batch.
    rig.records(*batch)
    first = rig.sent("web_1")
    assert len(first) == 1
    rig.records(*batch)  # replayed once more (a restart before the checkpoint)
    rig.tick()
    assert rig.sent("web_1") == first
    assert rig.sent("web_0") == []


def test_the_timer_sends_what_a_failed_batch_left_unsent(rig: Rig) -> None:
    blocker = rig.commands / rig.fleet.vm_id("web_1").lower()
    rig.commands.mkdir()
    blocker.write_text("blocked", encoding="utf-8")
    with pytest.raises(RetryableError):
        rig.records(*rig.user_reboot("web_1"))
    blocker.unlink()
    rig.tick()
    assert [c["EventId"] for c in rig.sent("web_1")] == [E1]


def test_a_batch_as_the_worker_decodes_it_names_partition_and_offset(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    bodies = [_bytes(r) for r in rig.user_reboot("web_1")] + [b"oops"]
    properties = [
        {"Offset": 4096 + n, "SequenceNumber": 7 + n, "EnqueuedTimeUtc": "2026-11-21T10:00:00Z"}
        for n in range(len(bodies))
    ]
    partition = {"PartitionId": "3", "ConsumerGroup": "$Default", "EventHubName": "records"}
    events = EventHubTriggerConverter.decode(
        Datum(SimpleNamespace(bytes=bodies), "collection_bytes"),
        trigger_metadata={
            "SystemPropertiesArray": Datum(json.dumps(properties), "json"),
            "PartitionContext": Datum(json.dumps(partition), "json"),
        },
    )
    assert isinstance(events, list)
    rig.function("records").get_user_function()(events)
    assert len(rig.sent("web_1")) == 1
    (poison,) = [r for r in caplog.records if r.name == "bridge.consumer.sources.batches"]
    assert "offset 4099 of partition 3" in poison.getMessage()


# --- configuration ---------------------------------------------------------------------------


def test_a_configuration_error_is_logged_raised_and_not_kept(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    channel = rig.env.pop("SE_BRIDGE_COMMANDS_CHANNEL")
    batch = rig.user_reboot("web_1")
    with pytest.raises(ConfigError, match=r"commands\.channel"):
        rig.records(*batch)
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "configuration error" in error.getMessage()
    assert "commands.channel" in error.getMessage()
    rig.env["SE_BRIDGE_COMMANDS_CHANNEL"] = channel  # fixed: the next invocation builds it
    rig.records(*batch)
    assert len(rig.sent("web_1")) == 1


def test_host_connection_settings_are_not_mistaken_for_se_bridge_settings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    load_config(local_env(tmp_path))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_relative_policy_file_is_the_one_deployed_with_the_app(tmp_path: Path) -> None:
    env = {**local_env(tmp_path), "SE_BRIDGE_CONSUMER_POLICY": "policy.yaml"}
    assert load_config(env, tmp_path / "app").consumer.policy == tmp_path / "app" / "policy.yaml"
    absolute = tmp_path / "elsewhere.yaml"
    env["SE_BRIDGE_CONSUMER_POLICY"] = str(absolute)
    assert load_config(env, tmp_path / "app").consumer.policy == absolute


def test_in_azure_state_and_commands_must_outlive_the_instance(tmp_path: Path) -> None:
    env = {**local_env(tmp_path), "WEBSITE_INSTANCE_ID": "0a1b2c"}
    with pytest.raises(ConfigError, match="SE_BRIDGE_CONSUMER_STATE=tables"):
        load_config(env)
    env["SE_BRIDGE_CONSUMER_STATE"] = "tables"
    with pytest.raises(ConfigError, match="SE_BRIDGE_COMMANDS_CHANNEL=storagequeue"):
        load_config(env)
    env["SE_BRIDGE_COMMANDS_CHANNEL"] = "storagequeue"
    env["SE_BRIDGE_STORAGE_ACCOUNT"] = "sebridge"
    assert load_config(env).consumer.state == "tables"


def test_a_shadow_app_reads_in_a_consumer_group_of_its_own(tmp_path: Path) -> None:
    env = {**local_env(tmp_path), "SE_BRIDGE_CONSUMER_MODE": "shadow"}
    for live in ("$Default", "$default"):  # Event Hubs names groups without regard to case
        env["SE_BRIDGE_CONSUMER_CONSUMER_GROUP"] = live
        with pytest.raises(ConfigError, match="SE_BRIDGE_CONSUMER_CONSUMER_GROUP"):
            load_config(env)
    env["SE_BRIDGE_CONSUMER_CONSUMER_GROUP"] = "se-bridge-shadow"
    assert load_config(env).consumer.mode == "shadow"


def test_log_analytics_settings_must_be_complete(tmp_path: Path) -> None:
    env = {**local_env(tmp_path), "SE_BRIDGE_LOGANALYTICS_ENDPOINT": "https://x.ingest.monitor"}
    with pytest.raises(ConfigError, match="SE_BRIDGE_LOGANALYTICS_RULE_ID"):
        DecisionOutlet.from_config(load_config(env))
    env["SE_BRIDGE_LOGANALYTICS_ENDPOINT"] = "http://x.ingest.monitor"
    env["SE_BRIDGE_LOGANALYTICS_RULE_ID"] = RULE
    with pytest.raises(ConfigError, match="https://"):
        DecisionOutlet.from_config(load_config(env))


def test_with_a_reconcile_interval_a_timer_runs_the_reconciler_on_its_schedule(
    tmp_path: Path,
) -> None:
    """The Resource Graph reconciler runs in the app too: a timer beside reevaluate, one pass a
    tick, its NCRONTAB schedule derived from eventgrid.reconcile_interval when the app is
    indexed, as reevaluate's is from SE_BRIDGE_FUNCTIONS_TIMER (issue 36)."""
    env = eventgrid_env(tmp_path) | {"SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL": "300"}
    assert load_config(env).eventgrid.reconcile_interval == 300  # taken, no longer refused
    backend = ConsumerApp(environ=env)
    try:
        functions = by_name(build_app(backend, environ=env))
    finally:
        backend.close()
    assert sorted(functions) == ["eventgrid", "page", "reconcile", "records", "reevaluate"]
    timer = functions["reconcile"]
    assert isinstance(timer.get_trigger(), TimerTrigger)
    (raw,) = [json.loads(b) for b in timer.get_raw_bindings()]
    assert raw == {
        "direction": raw["direction"],
        "type": "timerTrigger",
        "name": "timer",
        "schedule": "0 */5 * * * *",
        # A pass missed while the app was down (a deployment, scale to zero) runs when it
        # comes back, not a whole interval later.
        "useMonitor": True,
    }
    assert raw["direction"].lower() == "in"
    # A failed pass is not retried by the host: the next one does the same work.
    assert timer.get_settings_dict("retry_policy") is None
    hints = typing.get_type_hints(timer.get_user_function())
    assert TimerRequestConverter.check_input_type_annotation(hints["timer"])


def test_a_timer_indexed_with_settings_the_worker_no_longer_has_fails_and_says_why(
    tmp_path: Path,
) -> None:
    """App settings changed under a running worker: the reconcile function was indexed with an
    interval the consumer was built without. Its invocation fails, naming the settings, rather
    than seem to reconcile (the host restarts the app on a settings change anyway)."""
    indexed = eventgrid_env(tmp_path) | {"SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL": "300"}
    backend = ConsumerApp(environ=eventgrid_env(tmp_path))
    try:
        timer = by_name(build_app(backend, environ=indexed))["reconcile"]
        with pytest.raises(ConfigError, match=r"reconcile_interval is 0"):
            timer.get_user_function()(TimerRequest(past_due=False))
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("interval", "schedule"),
    [
        (60, "0 */1 * * * *"),
        (300, "0 */5 * * * *"),
        (1800, "0 */30 * * * *"),
        (3600, "0 0 */1 * * *"),
        (21600, "0 0 */6 * * *"),
        (86400, "0 0 0 * * *"),
    ],
)
def test_the_reconcilers_schedule_is_its_interval_in_ncrontab(interval: int, schedule: str) -> None:
    assert functionapp.reconcile_schedule(interval) == schedule


@pytest.mark.parametrize("interval", ["90", "420", "5400", "300.5"])
def test_an_interval_no_ncrontab_schedule_keeps_is_refused_when_the_app_is_indexed(
    tmp_path: Path, interval: str
) -> None:
    """Every 7 minutes is not a schedule NCRONTAB keeps (*/7 runs at :56 and again at :00):
    the app refuses it rather than reconcile at another pace than the setting says."""
    env = eventgrid_env(tmp_path) | {"SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL": interval}
    with pytest.raises(ConfigError, match=r"SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL.*NCRONTAB"):
        build_app(ConsumerApp(environ=env), environ=env)


def test_every_interval_the_app_takes_is_one_consume_takes() -> None:
    taken = functionapp.RECONCILE_INTERVALS
    assert taken[0] == 60
    assert taken[-1] == 86400
    assert 300 in taken
    on = {"SE_BRIDGE_EVENTGRID_ENABLED": "true", "SE_BRIDGE_EVENTGRID_HUB": "eventgrid",
          "SE_BRIDGE_EVENTGRID_SUBSCRIPTIONS": SUBSCRIPTION}  # fmt: skip
    for interval in taken:
        assert len(functionapp.reconcile_schedule(interval).split()) == 6
        settings = load(environ=on | {"SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL": str(interval)})
        resourcegraph.check_settings(settings.eventgrid)


# --- Decision records to Log Analytics -------------------------------------------------------


class RefusingSink(BaseSink):
    """Refuses the records whose RecordId is in `refuse` as poison, accepts the rest."""

    name = "fake"
    max_batch = 100

    def __init__(self, refuse: set[str]) -> None:
        self.refuse = refuse
        self.accepted: list[str] = []

    def send(self, batch: Sequence[SpooledRecord]) -> None:
        bad = [r.seq for r in batch if r.record_id in self.refuse]
        if bad:
            raise PoisonRecords("400: does not fit the stream declaration", bad)
        self.accepted += [r.record_id for r in batch]

    def close(self) -> None:
        pass


def test_decisions_log_analytics_refuses_are_logged_whole_and_the_rest_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = RefusingSink({"d2"})
    DecisionOutlet(sink)([{"RecordId": f"d{n}", "RecordType": "Decision"} for n in (1, 2, 3)])
    assert sink.accepted == ["d1", "d3"]
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert '{"RecordId": "d2", "RecordType": "Decision"}' in error.getMessage()


@contextmanager
def managed_identity(monkeypatch: pytest.MonkeyPatch, ca_bundle: Path) -> Iterator[None]:
    """The app's managed identity, its tokens from the IMDS simulator's identity endpoint, and
    trust in a double's certificate (as in test_loganalytics_sink)."""
    with SimulatorServer(Simulator(Fleet(demo_vms(seed=0)))) as imds:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca_bundle))
        monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", imds.vm_url("vm-0"))
        yield


@pytest.fixture
def log_analytics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Rig, LogsIngestionDouble]]:
    """The app with Decision records going to the strict Logs Ingestion double."""
    with (
        LogsIngestionDouble(RULE, schema.DCR_STREAM, schema.dcr_stream_declaration()) as double,
        managed_identity(monkeypatch, double.ca_bundle),
    ):
        env = {
            **local_env(tmp_path),
            "SE_BRIDGE_LOGANALYTICS_ENDPOINT": double.endpoint,
            "SE_BRIDGE_LOGANALYTICS_RULE_ID": RULE,
            "SE_BRIDGE_IDENTITY_KIND": "managed",
        }
        made = make_rig(env, tmp_path)
        try:
            yield made, double
        finally:
            made.backend.close()


def test_decisions_go_to_log_analytics_and_a_failed_upload_fails_the_batch(
    log_analytics: tuple[Rig, LogsIngestionDouble], caplog: pytest.LogCaptureFixture
) -> None:
    rig, double = log_analytics
    caplog.set_level(logging.INFO, logger="bridge")
    rig.records(*rig.user_reboot("web_1"))
    (decision,) = double.records()
    assert (decision["DecisionAction"], decision["EventId"]) == ("Approve", E1)
    assert decisions_logged(caplog) == []
    # A platform event is held (no command); its Decision is the only effect, so a failed
    # upload must fail the invocation, and the retry must upload it.
    held = rig.fleet.event("web_0", E2, source="Platform", resources=["web_0"])
    double.script(503)
    with pytest.raises(RetryableError, match="503"):
        rig.records(held)
    rig.records(held)
    assert [(d["DecisionAction"], d["EventId"]) for d in double.records()] == [
        ("Approve", E1),
        ("Hold", E2),
    ]
    rig.records(held)  # replayed after success: said once
    assert len(double.records()) == 2


def test_an_approval_whose_decision_upload_failed_still_reaches_log_analytics(
    log_analytics: tuple[Rig, LogsIngestionDouble],
) -> None:
    rig, double = log_analytics
    batch = rig.user_reboot("web_1")
    double.script(503)
    with pytest.raises(RetryableError):
        rig.records(*batch)
    rig.records(*batch)
    assert len(rig.sent("web_1")) == 1
    assert [d["DecisionAction"] for d in double.records()] == ["Approve"]


def test_partition_and_offset_fall_back_when_the_metadata_is_missing() -> None:
    event = func.EventHubEvent(body=b"x", sequence_number=12)
    assert (functionapp._partition(event), functionapp._offset(event)) == (
        "?",
        "sequence number 12",
    )
    odd = func.EventHubEvent(
        body=b"x", trigger_metadata={"PartitionContext": Datum("not json", "string")}
    )
    assert (functionapp._partition(odd), functionapp._offset(odd)) == ("?", "?")


def test_a_batch_is_read_up_to_its_newest_enqueued_time_in_the_partition_it_names() -> None:
    times = ["2026-11-21T10:00:00Z", "2026-11-21T10:00:02Z", "2026-11-21T10:00:01Z"]
    properties = [{"Offset": n, "SequenceNumber": n, "EnqueuedTimeUtc": t}
                  for n, t in enumerate(times)]  # fmt: skip
    partition = {"PartitionId": "3", "EventHubName": "records",
                 "FullyQualifiedNamespace": "ns.servicebus.windows.net"}  # fmt: skip
    events = EventHubTriggerConverter.decode(
        Datum(SimpleNamespace(bytes=[b"{}"] * 3), "collection_bytes"),
        trigger_metadata={
            "SystemPropertiesArray": Datum(json.dumps(properties), "json"),
            "PartitionContext": Datum(json.dumps(partition), "json"),
        },
    )
    assert isinstance(events, list)
    assert functionapp._position(events) == Position(
        "ns.servicebus.windows.net/records/3", datetime(2026, 11, 21, 10, 0, 2, tzinfo=timezone.utc)
    )
    # No partition named: read to no known point, so its VMs are never taken as silent.
    assert functionapp._position([func.EventHubEvent(body=b"x")]).caught_up is None


def test_a_past_due_timer_still_ticks(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="bridge")
    rig.function("reevaluate").get_user_function()(TimerRequest(past_due=True))
    assert any("past due" in r.getMessage() for r in caplog.records)


# --- the approval page's HTTP trigger --------------------------------------------------------


def test_the_page_answers_every_path_at_the_root_behind_app_service_authentication(
    rig: Rig,
) -> None:
    page = rig.function("page")
    (raw,) = [json.loads(b) for b in page.get_raw_bindings() if '"httpTrigger"' in b]
    assert raw["route"] == "{*path}"
    assert raw["authLevel"].lower() == "anonymous"  # App Service Authentication signs people in
    assert sorted(m.lower() for m in raw["methods"]) == ["get", "post"]
    host = json.loads((APP_DIR / "host.json").read_text(encoding="utf-8"))
    assert host["extensions"]["http"]["routePrefix"] == ""


def http(rig: Rig, path: str, headers: dict[str, str] | None = None) -> func.HttpResponse:
    request = func.HttpRequest("GET", f"https://se-bridge.example{path}", headers=headers or {},
                               body=b"")  # fmt: skip
    answer = rig.function("page").get_user_function()(request)
    assert isinstance(answer, func.HttpResponse)
    return answer


def test_the_page_needs_entra_id_settings(rig: Rig) -> None:
    answer = http(rig, "/")
    assert answer.status_code == 503
    assert b"SE_BRIDGE_CONSUMER_PEOPLE_TENANT_ID" in answer.get_body()


def entra_rig(tenant: Tenant, tmp_path: Path) -> Rig:
    env = {**local_env(tmp_path), "SE_BRIDGE_CONSUMER_PEOPLE_TENANT_ID": tenant.tenant_id,
           "SE_BRIDGE_CONSUMER_PEOPLE_AUDIENCE": AUDIENCE,
           "SE_BRIDGE_CONSUMER_PEOPLE_JWKS_URL": tenant.jwks_url}  # fmt: skip
    return make_rig(env, tmp_path)


def test_the_page_validates_the_token_itself(tmp_path: Path) -> None:
    with serving(Tenant()) as tenant:
        rig = entra_rig(tenant, tmp_path)
        try:
            unsigned = http(rig, "/api/v1/events")
            assert unsigned.status_code == 401
            assert unsigned.headers["Content-Security-Policy"].startswith("default-src 'none'")
            assert unsigned.mimetype == "application/json"
            no_role = {"X-MS-TOKEN-AAD-ID-TOKEN": tenant.token(roles=())}
            assert http(rig, "/", no_role).status_code == 403
            # A notice's link: the event's own page, signed in as the page is.
            assert http(rig, "/events/E1").status_code == 401
            gone = http(rig, "/events/E1", {"X-MS-TOKEN-AAD-ID-TOKEN": tenant.token()})
            assert gone.status_code == 404
            assert b"E1 is not open" in gone.get_body()
        finally:
            rig.backend.close()


def test_a_state_that_does_not_answer_is_a_500_that_says_so_and_a_body_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The person and the CLI read why, as from the standalone page; and a POST's body reaches
    the app whole."""

    def broken(now: object) -> list[object]:
        raise TimeoutError("the fleet state did not answer")

    with serving(Tenant()) as tenant:
        rig = entra_rig(tenant, tmp_path)
        try:
            monkeypatch.setattr(rig.backend.consumer().desk, "open_events", broken)
            failed = http(rig, "/", {"X-MS-TOKEN-AAD-ID-TOKEN": tenant.token()})
            assert failed.status_code == 500
            assert b"the fleet state did not answer" in failed.get_body()
            assert failed.headers["Content-Security-Policy"].startswith("default-src 'none'")
            body = json.dumps({"Until": "soon"}).encode()
            posted = func.HttpRequest("POST", "https://se-bridge.example/api/v1/pause", body=body,
                                      headers={"Authorization": f"Bearer {tenant.token()}",
                                               "Content-Type": "application/json"})  # fmt: skip
            paused = rig.function("page").get_user_function()(posted)
            assert paused.status_code == 409
            assert json.loads(paused.get_body())["Code"] == "BadTime"
        finally:
            rig.backend.close()


def test_every_instance_takes_the_forms_of_the_others(tmp_path: Path) -> None:
    """Scaled out, the page's forms are rendered by one instance and posted to another: each
    derives the CSRF key from the consumer's signing key, which every instance loads (no
    platform setting needed; with none, Easy Auth's key is not relied on)."""
    key, other = tmp_path / "signing.pem", tmp_path / "other.pem"
    signing.keygen(key)
    signing.keygen(other)

    def signer(path: Path) -> signing.Signer:
        config = load(environ={"SE_BRIDGE_COMMANDS_SIGNING_KEY": f"file:{path}"})
        return signing.load_signer(config.commands, config.identity)

    one, two = (Csrf(functionapp.csrf_secret(signer(key))) for _ in range(2))
    now = datetime.now(timezone.utc)
    assert two.good(one.make("oid-dana", now), "oid-dana", now)
    assert not two.good(one.make("oid-dana", now), "oid-eve", now)
    elsewhere = Csrf(functionapp.csrf_secret(signer(other)))
    assert not elsewhere.good(one.make("oid-dana", now), "oid-dana", now)
    assert functionapp.csrf_secret(None) is None


# --- Event Grid, the second source (issue 36) -------------------------------------------------


def eventgrid_env(tmp_path: Path, policy: Path | None = None) -> dict[str, str]:
    env = local_env(tmp_path) | {
        "SE_BRIDGE_EVENTGRID_ENABLED": "true",
        "SE_BRIDGE_EVENTGRID_HUB": "eventgrid",
        "SE_BRIDGE_EVENTGRID_SUBSCRIPTIONS": SUBSCRIPTION,
    }
    if policy is not None:
        env["SE_BRIDGE_CONSUMER_POLICY"] = str(policy)
    return env


def eventgrid_rig(tmp_path: Path, policy: Path | None = None) -> Rig:
    return make_rig(eventgrid_env(tmp_path, policy), tmp_path)


def one_per_set(tmp_path: Path) -> Path:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nbudgets: [{name: one, group: scale_set, max_vms: 1}]\n"
                      "rules: [{name: all, action: approve}]\n", encoding="utf-8")  # fmt: skip
    return policy


def deliver(rig: Rig, *bodies: str | bytes) -> None:
    """Invoke the Event Grid function as the worker does, with one batch."""
    events = [func.EventHubEvent(body=b if isinstance(b, bytes) else b.encode()) for b in bodies]
    rig.function("eventgrid").get_user_function()(events)


def test_with_eventgrid_on_a_second_trigger_reads_its_hub(tmp_path: Path) -> None:
    rig = eventgrid_rig(tmp_path)
    try:
        assert sorted(rig.functions) == ["eventgrid", "page", "records", "reevaluate"]
        function = rig.function("eventgrid")
        (raw,) = [json.loads(b) for b in function.get_raw_bindings()]
        assert raw["type"] == "eventHubTrigger"
        assert raw["cardinality"].lower() == "many"
        assert raw["dataType"].lower() == "binary"
        # The hub infra/ declares in the records' namespace, read with the same identity-based
        # connection and consumer group; the %setting% is the one config reads.
        assert raw["connection"] == "SE_BRIDGE_EVENTHUBS"
        assert raw["eventHubName"] == "%SE_BRIDGE_EVENTGRID_HUB%"
        assert raw["consumerGroup"] == "%SE_BRIDGE_CONSUMER_CONSUMER_GROUP%"
        assert load(environ={"SE_BRIDGE_EVENTGRID_HUB": "eg-1"}).eventgrid.hub == "eg-1"
        # The worker would load it (see test_the_worker_would_load_every_function).
        hints = typing.get_type_hints(function.get_user_function())
        assert EventHubTriggerConverter.check_input_type_annotation(hints["events"])
        # Retried forever as the records' batches are.
        assert function.get_settings_dict("retry_policy") == rig.function(
            "records"
        ).get_settings_dict("retry_policy")
    finally:
        rig.backend.close()


def test_with_eventgrid_off_the_app_has_no_eventgrid_function(rig: Rig) -> None:
    assert "eventgrid" not in rig.functions
    assert "reconcile" not in rig.functions
    # Nor a reconciler without the second source it feeds: refused, as consume refuses it.
    lone = {"SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL": "300"}
    with pytest.raises(ConfigError, match=r"reconcile_interval needs eventgrid\.enabled"):
        build_app(rig.backend, environ=lone)
    off = {"SE_BRIDGE_EVENTGRID_ENABLED": "false", "SE_BRIDGE_EVENTGRID_HUB": "eventgrid"}
    assert "eventgrid" not in by_name(build_app(rig.backend, environ=off))
    with pytest.raises(ConfigError, match="eventgrid"):
        build_app(rig.backend, environ={"SE_BRIDGE_EVENTGRID_ENABLED": "maybe"})


def test_an_event_grid_delivery_folds_in_and_counts_in_a_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rig = eventgrid_rig(tmp_path, one_per_set(tmp_path))
    try:
        rig.records(rig.fleet.heartbeat("web_0"), rig.fleet.heartbeat("web_1"))
        # web_2 has no agent: only Azure tells of its reboot, and it holds the set's slot.
        with caplog.at_level(logging.INFO, logger="bridge"):
            deliver(rig, eg.scheduled(E2, "Started", ["web_2"], rig.fleet.now))
        # Its Event record goes where the decisions go, as the standalone consumer's does.
        prefix = "Event record: "
        (logged,) = [json.loads(r.getMessage()[len(prefix) :]) for r in caplog.records
                     if r.getMessage().startswith(prefix)]  # fmt: skip
        assert (logged["Source"], logged["EventId"]) == ("EventGrid", E2)
        assert_valid(logged)
        intake = rig.backend.intake()
        assert intake is not None
        assert intake.counts().events == 1
        rig.fleet.advance(1)
        rig.records(rig.fleet.event("web_0", E1, resources=["web_0"]))
        assert rig.sent("web_0") == []
        # Azure's Completed ends it, and the slot goes to web_0's reboot.
        rig.fleet.advance(30)
        deliver(rig, eg.scheduled(E2, "Completed", ["web_2"], rig.fleet.now))
        rig.tick()
        assert [c["EventId"] for c in rig.sent("web_0")] == [E1]
    finally:
        rig.backend.close()


def test_a_hostile_delivery_is_refused_counted_logged_and_frees_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rig = eventgrid_rig(tmp_path, one_per_set(tmp_path))
    try:
        rig.records(rig.fleet.heartbeat("web_0"), rig.fleet.heartbeat("web_1"))
        rig.records(rig.fleet.event("web_0", E1, resources=["web_0"], transition="Started"))
        rig.fleet.advance(1)
        rig.records(rig.fleet.event("web_1", E2, resources=["web_1"]))
        assert rig.sent("web_1") == []
        # A forged Completed from a subscription the consumer does not trust, and bytes
        # that are no delivery at all: both refused, and web_1 still waits.
        forged = eg.scheduled(E1, "Completed", ["web_0"], rig.fleet.now, subscription=OTHER_SUB)
        with caplog.at_level(logging.WARNING, logger="bridge"):
            deliver(rig, forged, b"\xff not json")
        rig.tick()
        assert rig.sent("web_1") == []
        intake = rig.backend.intake()
        assert intake is not None
        counts = intake.counts()
        assert counts.events == 0
        assert sum(counts.refused.values()) == 2
        assert sum("refused an Event Grid delivery" in r.getMessage() for r in caplog.records) == 2
    finally:
        rig.backend.close()


@contextmanager
def reconciling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str = ""
) -> Iterator[tuple[Rig, ResourceGraphDouble]]:
    """The app with the second source and its reconciler, asking the Resource Graph double
    (at `path` below its address) over HTTPS as its managed identity."""
    with ResourceGraphDouble() as graph, managed_identity(monkeypatch, graph.ca_bundle):
        env = eventgrid_env(tmp_path, one_per_set(tmp_path)) | {
            "SE_BRIDGE_IDENTITY_KIND": "managed",
            "SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL": "300",
            "SE_BRIDGE_EVENTGRID_RESOURCE_GRAPH_URL": graph.url + path,
        }
        made = make_rig(env, tmp_path)
        try:
            yield made, graph
        finally:
            made.backend.close()


@pytest.fixture
def reconciled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Rig, ResourceGraphDouble]]:
    with reconciling(tmp_path, monkeypatch) as found:
        yield found


def azure_holds(graph: ResourceGraphDouble, delivery: str) -> None:
    """Resource Graph holds what `delivery` announces (in place of that resource's old row)."""
    row = row_of(delivery)
    table = "healthresources" if row["type"].startswith("microsoft.resourcehealth") else (
        "maintenanceresources")  # fmt: skip
    rows = graph.tables[table]
    rows[:] = [r for r in rows if r["id"] != row["id"]] + [row]


def test_a_lost_delivery_is_caught_by_the_timers_pass_and_holds_the_slot(
    reconciled: tuple[Rig, ResourceGraphDouble], caplog: pytest.LogCaptureFixture
) -> None:
    rig, graph = reconciled
    rig.records(rig.fleet.heartbeat("web_0"), rig.fleet.heartbeat("web_1"))
    # web_2 has no agent, and Event Grid's delivery of its Started was lost: only Resource
    # Graph tells of it.
    azure_holds(graph, eg.scheduled(E2, "Started", ["web_2"], rig.fleet.now))
    with caplog.at_level(logging.INFO, logger="bridge"):
        rig.reconcile()
    assert any("Resource Graph told of 1 event changes" in r.getMessage() for r in caplog.records)
    intake = rig.backend.intake()
    assert intake is not None
    assert intake.counts().events == 1
    assert graph.requests
    assert all(r.authorized and r.status == 200 for r in graph.requests)
    rig.fleet.advance(1)
    rig.records(rig.fleet.event("web_0", E1, resources=["web_0"]))
    assert rig.sent("web_0") == []  # web_2 holds the scale set's one slot
    rig.reconcile()  # nothing new: folded once, not pass after pass
    assert intake.counts().events == 1
    # Its Completed was lost too: the next pass ends it, and the slot goes to web_0.
    azure_holds(graph, eg.scheduled(E2, "Completed", ["web_2"], rig.fleet.now))
    rig.reconcile(past_due=True)
    rig.tick()
    assert [c["EventId"] for c in rig.sent("web_0")] == [E1]


def test_rows_are_refused_as_deliveries_are_and_free_nothing(
    reconciled: tuple[Rig, ResourceGraphDouble], caplog: pytest.LogCaptureFixture
) -> None:
    rig, graph = reconciled
    rig.records(rig.fleet.heartbeat("web_0"), rig.fleet.heartbeat("web_1"))
    rig.records(rig.fleet.event("web_0", E1, resources=["web_0"], transition="Started"))
    rig.fleet.advance(1)
    rig.records(rig.fleet.event("web_1", E2, resources=["web_1"]))
    # A Completed of web_0's event naming more VMs than any event may: refused, counted and
    # logged as the hub's deliveries are, and web_1 still waits.
    names = [f"web_{n}" for n in range(1001)]
    azure_holds(graph, eg.scheduled(E1, "Completed", names, rig.fleet.now))
    with caplog.at_level(logging.WARNING, logger="bridge"):
        rig.reconcile()
    rig.tick()
    assert rig.sent("web_1") == []
    intake = rig.backend.intake()
    assert intake is not None
    assert intake.counts().refused == {"too-many-resources": 1}
    assert sum("refused a Resource Graph row" in r.getMessage() for r in caplog.records) == 1


def test_a_failed_pass_is_said_once_and_the_next_timer_tries_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As in consume: a failed pass fails nothing else (Event Grid's deliveries still count),
    a run of them is said once at WARNING, and the timer's next tick tries again."""
    # An address where Resource Graph answers no query (400): every pass fails.
    with reconciling(tmp_path, monkeypatch, "/elsewhere") as (rig, graph):
        with caplog.at_level(logging.INFO, logger="bridge"):
            rig.reconcile()
            rig.reconcile()
        said = [r for r in caplog.records if "reconciler's pass failed" in r.getMessage()]
        assert [r.levelno for r in said] == [logging.WARNING]
        assert [r.status for r in graph.requests] == [400, 400]
