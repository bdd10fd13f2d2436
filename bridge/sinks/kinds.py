"""The kinds of sink a `--sink` SPEC (agent.sinks, consumer.sinks) may name, and the check of
their settings: the one module of bridge.sinks that reads the configuration. A new sink is a
module with its BaseSink subclass and one line in KINDS.
"""

from __future__ import annotations

from pathlib import Path

from bridge.config import Config, ConfigError, EventHubsSettings, LogAnalyticsSettings
from bridge.sinks.base import Sink
from bridge.sinks.eventhubs import EventHubsSink
from bridge.sinks.hub import HubSink
from bridge.sinks.jsonl import JsonlSink
from bridge.sinks.loganalytics import LogAnalyticsSink
from bridge.sinks.stdout import StdoutSink
from bridge.specs import Kind, Kinds


def check_eventhubs(settings: EventHubsSettings) -> None:
    if settings.connection_string:
        if "endpoint=" not in settings.connection_string.lower():
            raise ConfigError(
                "eventhubs.connection_string is not a connection string (no Endpoint=)"
            )
        return
    if not (settings.namespace and settings.name):
        raise ConfigError(
            "the eventhubs sink needs eventhubs.namespace and eventhubs.name (Entra ID auth), "
            "or eventhubs.connection_string (SE_BRIDGE_EVENTHUBS_NAMESPACE, ..._NAME, "
            "..._CONNECTION_STRING)"
        )
    if "://" in settings.namespace or "/" in settings.namespace:
        raise ConfigError(
            f"eventhubs.namespace: give the host name only, such as "
            f"contoso.servicebus.windows.net, got {settings.namespace!r}"
        )


def check_loganalytics(settings: LogAnalyticsSettings, user: str) -> None:
    """ConfigError unless `user` (what uploads) has every Logs Ingestion setting it needs."""
    missing = [k for k in ("endpoint", "rule_id", "stream") if not getattr(settings, k)]
    if missing:
        names = ", ".join(f"loganalytics.{k}" for k in missing)
        env = ", ".join(f"SE_BRIDGE_LOGANALYTICS_{k.upper()}" for k in missing)
        raise ConfigError(f"{user} needs {names} ({env})")
    if not settings.endpoint.lower().startswith("https://"):
        raise ConfigError(
            f"loganalytics.endpoint must be an https:// URL, got {settings.endpoint!r}"
        )


KINDS: Kinds[Sink] = Kinds(
    "sink",
    Kind("jsonl", "/var/log/se-bridge/events.jsonl", lambda path, _: JsonlSink(Path(path))),
    Kind("hub", "/var/lib/se-bridge/hub", lambda path, _: HubSink(Path(path)),
         argument="directory"),
    Kind("stdout", None, lambda _, __: StdoutSink()),
    Kind("eventhubs", None, lambda _, c: EventHubsSink(c.eventhubs, c.identity),
         lambda _, c: check_eventhubs(c.eventhubs)),
    Kind("loganalytics", None, lambda _, c: LogAnalyticsSink(c.loganalytics, c.identity),
         lambda _, c: check_loganalytics(c.loganalytics, "the loganalytics sink")),
)  # fmt: skip


def build(spec: str, config: Config | None = None) -> Sink:
    """The sink a `--sink` SPEC names; cloud sinks take their settings from `config` (refused,
    naming what is missing, when it has none)."""
    return KINDS.build(spec, config or Config())


def check_config(config: Config, specs: list[str], setting: str = "agent.sinks") -> None:
    """ConfigError naming the setting unless every spec of `specs` (from `setting`) parses and
    the cloud sinks among them have the settings they need: checked at start, before anything
    runs."""
    for spec in specs:
        KINDS.check(spec, config, setting)
