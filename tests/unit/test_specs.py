"""The registries of kinds (bridge.specs): sinks, command channels and fleet state stores are
named, refused and built through one door, each kind's example builds, and a spec that names no
kind is refused naming every kind there is."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from bridge import channels, sinks
from bridge.channels.local import LocalChannel
from bridge.channels.storagequeue import StorageQueueChannel
from bridge.config import (
    Config,
    ConfigError,
    EventHubsSettings,
    LogAnalyticsSettings,
    StorageSettings,
)
from bridge.consumer.state import Doc, Store
from bridge.consumer.state.kinds import KINDS as STORES
from bridge.consumer.wiring import load_config as load_consumer_config
from bridge.sinks.base import SpooledRecord
from bridge.specs import Kind, Kinds

REGISTRIES: dict[str, Kinds[Any]] = {
    "sink": sinks.KINDS,
    "command channel": channels.KINDS,
    "fleet state": STORES,
}
# Settings a person would give each cloud kind; nothing is sent with them.
CLOUD = Config(
    eventhubs=EventHubsSettings(namespace="contoso.servicebus.windows.net", name="records"),
    loganalytics=LogAnalyticsSettings(
        endpoint="https://dce.westeurope-1.ingest.monitor.azure.com", rule_id="dcr-1"
    ),
    storage=StorageSettings(account="contoso"),
)
VM = "1b1f7c1e-0000-4000-8000-000000000000"


def every_kind() -> list[Any]:
    return [
        pytest.param(registry, kind, id=f"{what}:{kind.name}")
        for what, registry in REGISTRIES.items()
        for kind in registry
    ]


def example_spec(kind: Kind[Any], where: Path) -> str:
    """`kind`'s example, with its path moved under `where`: building it may create it."""
    if kind.example is None:
        return kind.name
    assert kind.example.startswith("/"), "examples are absolute paths, as a person writes them"
    return f"{kind.name}:{where / PurePosixPath(kind.example).name}"


@pytest.mark.parametrize(("registry", "kind"), every_kind())
def test_each_kinds_example_parses_checks_and_builds(
    registry: Kinds[Any], kind: Kind[Any], tmp_path: Path
) -> None:
    if kind.example is not None:
        assert registry.parse(f"{kind.name}:{kind.example}") == (kind, kind.example)
    spec = example_spec(kind, tmp_path)
    registry.check(spec, CLOUD, "the setting")
    use(registry.build(spec, CLOUD))


def use(built: Any) -> None:
    """What the program does with what a kind builds, short of sending anything."""
    if isinstance(built, LocalChannel | StorageQueueChannel):
        built.check_inbox()
        built.sender().close()
        built.inbox(VM).close()
        return
    if isinstance(built, sinks.BaseSink):
        sink: sinks.Sink = built  # type: ignore[assignment]  # BaseSink is half of one
        try:
            assert sink.name
            assert sink.idle() is None  # nothing held before a send
            record = SpooledRecord(1, "r1", "Heartbeat", '{"RecordType": "Heartbeat"}')
            assert sink.can_wait(record) is (sink.send_interval > 0)
        finally:
            sink.close()
        return
    store: Store = built
    try:
        if type(store).__name__ != "TableStore":  # a table is reached only when used
            assert store.read("vm", "absent") is None
            assert store.write("vm", Doc("a", {"n": 1})).etag is not None
    finally:
        store.close()


def test_every_sink_kind_builds_a_sink_with_the_whole_protocol(tmp_path: Path) -> None:
    for kind in sinks.KINDS:
        sink = sinks.build(example_spec(kind, tmp_path), CLOUD)
        try:
            assert isinstance(sink, sinks.BaseSink), kind.name
        finally:
            sink.close()


@pytest.mark.parametrize(
    ("what", "spec", "expected"),
    [
        ("sink", "kafka:x", "jsonl:PATH, hub:DIRECTORY, stdout, eventhubs, loganalytics"),
        ("command channel", "servicebus", "local:DIRECTORY, storagequeue"),
        ("fleet state", "redis", "sqlite:PATH, tables"),
    ],
)
def test_an_unknown_kind_is_refused_naming_every_known_kind(
    what: str, spec: str, expected: str
) -> None:
    says = f"unknown {what} {spec!r}: expected one of {expected}"
    with pytest.raises(ValueError, match=f"^{re.escape(says)}$") as refused:
        REGISTRIES[what].parse(spec)
    with pytest.raises(ConfigError) as at_start:
        REGISTRIES[what].check(spec, Config(), "some.setting")
    assert str(at_start.value) == f"some.setting: {refused.value}"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("jsonl:", "sink 'jsonl:' needs a path, as in jsonl:/var/log/se-bridge/events.jsonl"),
        ("hub: ", "sink 'hub: ' needs a directory, as in hub:/var/lib/se-bridge/hub"),
        ("stdout:x", "sink 'stdout:x' takes no argument: write stdout"),
    ],
)
def test_a_kind_given_the_wrong_argument_says_how_it_is_written(spec: str, says: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(says)}$"):
        sinks.KINDS.parse(spec)


def test_kinds_are_named_without_regard_to_case_or_spaces(tmp_path: Path) -> None:
    kind, argument = STORES.parse(f" SQLite : {tmp_path / 'fleet.db'} ")
    assert (kind.name, argument) == ("sqlite", str(tmp_path / "fleet.db"))


def test_building_checks_the_kinds_settings_first() -> None:
    """A cloud sink without its settings is refused, naming them, before anything is made."""
    with pytest.raises(ConfigError, match=r"needs eventhubs\.namespace and eventhubs\.name"):
        sinks.build("eventhubs")
    with pytest.raises(ConfigError, match=r"loganalytics\.endpoint, loganalytics\.rule_id"):
        sinks.build("loganalytics", Config())


def test_a_bad_decision_sink_is_refused_naming_the_consumers_setting() -> None:
    with pytest.raises(ConfigError, match=r"^consumer\.sinks: unknown sink 'kafka:x'"):
        load_consumer_config(environ={"SE_BRIDGE_CONSUMER_SINKS": "kafka:x"})
