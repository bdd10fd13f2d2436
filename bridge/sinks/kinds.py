"""The kinds of sink a `--sink` SPEC (agent.sinks, consumer.sinks) may name: the one module of
bridge.sinks that reads the configuration. A new sink is a module with its BaseSink subclass
(and the check of its settings, if it has any) and one line in KINDS.
"""

from __future__ import annotations

from pathlib import Path

from bridge.config import Config
from bridge.sinks import eventhubs_https, loganalytics
from bridge.sinks.base import Sink
from bridge.sinks.eventhubs import EventHubsSink
from bridge.sinks.eventhubs_https import EventHubsHttpsSink
from bridge.sinks.hub import HubSink
from bridge.sinks.jsonl import JsonlSink
from bridge.sinks.loganalytics import LogAnalyticsSink
from bridge.sinks.stdout import StdoutSink
from bridge.specs import Kind, Kinds

KINDS: Kinds[Sink] = Kinds(
    "sink",
    Kind("jsonl", "/var/log/se-bridge/events.jsonl", lambda path, _: JsonlSink(Path(path))),
    Kind(
        "hub", "/var/lib/se-bridge/hub", lambda path, _: HubSink(Path(path)), argument="directory"
    ),
    Kind("stdout", None, lambda _, __: StdoutSink()),
    Kind(
        "eventhubs",
        None,
        lambda _, c: (
            EventHubsHttpsSink(c.eventhubs, c.identity)
            if c.eventhubs.transport == "https"
            else EventHubsSink(c.eventhubs, c.identity)
        ),
        lambda _, c: eventhubs_https.check_settings(c.eventhubs, c.eventhubs.transport),
    ),
    Kind(
        "loganalytics",
        None,
        lambda _, c: LogAnalyticsSink(c.loganalytics, c.identity),
        lambda _, c: loganalytics.check_settings(c.loganalytics, "the loganalytics sink"),
    ),
)


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
