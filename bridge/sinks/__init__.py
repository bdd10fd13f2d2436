"""Sinks: where spooled records go. One module per kind (`--sink` SPEC grammar and the check of
each kind's settings live here, with the kinds); cloud SDKs load only when a cloud sink sends.
"""

from __future__ import annotations

from pathlib import Path

from bridge.config import Config, ConfigError
from bridge.sinks import eventhubs, loganalytics
from bridge.sinks.base import Sink, SpooledRecord, check
from bridge.sinks.eventhubs import EventHubsSink
from bridge.sinks.hub import HubSink
from bridge.sinks.jsonl import JsonlSink
from bridge.sinks.loganalytics import LogAnalyticsSink
from bridge.sinks.stdout import StdoutSink

__all__ = ["Sink", "SpooledRecord", "build", "check", "check_config", "parse_spec"]

SINK_KINDS = ("jsonl", "stdout", "eventhubs", "loganalytics", "hub")
_WITH_ARGUMENT = ("jsonl", "hub")


def parse_spec(spec: str) -> tuple[str, str]:
    """Split `jsonl:PATH` / `hub:DIR` / `stdout` into (kind, argument); ValueError names what
    is wrong."""
    kind, _, arg = spec.partition(":")
    kind = kind.strip().lower()
    if kind not in SINK_KINDS:
        raise ValueError(
            f"unknown sink {spec!r}: expected one of jsonl:PATH, hub:DIR, stdout, eventhubs, "
            "loganalytics"
        )
    if kind == "jsonl" and not arg.strip():
        raise ValueError(f"sink {spec!r} needs a path, as in jsonl:/var/log/se-bridge/events.jsonl")
    if kind == "hub" and not arg.strip():
        raise ValueError(f"sink {spec!r} needs a directory, as in hub:/var/lib/se-bridge/hub")
    if kind not in _WITH_ARGUMENT and arg:
        raise ValueError(f"sink {spec!r} takes no argument")
    return kind, arg.strip()


def build(spec: str, config: Config | None = None) -> Sink:
    """The sink a `--sink` SPEC names; cloud sinks take their settings from `config`."""
    kind, arg = parse_spec(spec)
    if kind == "jsonl":
        return JsonlSink(Path(arg))
    if kind == "hub":
        return HubSink(Path(arg))
    if kind == "stdout":
        return StdoutSink()
    if config is None:
        raise ValueError(f"sink {spec!r} needs its settings")
    if kind == "eventhubs":
        return EventHubsSink(config)
    return LogAnalyticsSink(config)


def check_config(config: Config, specs: list[str]) -> None:
    """ConfigError naming the setting unless every spec of `specs` parses and the cloud
    sinks among them have the settings they need: checked at start, before anything runs."""
    kinds = set()
    for spec in specs:
        try:
            kinds.add(parse_spec(spec)[0])
        except ValueError as err:
            raise ConfigError(f"agent.sinks: {err}") from err
    if "eventhubs" in kinds:
        eventhubs.check_settings(config.eventhubs)
    if "loganalytics" in kinds:
        loganalytics.check_settings(config.loganalytics, "the loganalytics sink")
