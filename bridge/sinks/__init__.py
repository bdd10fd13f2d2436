"""Sinks: where spooled records go. One module per kind; cloud SDKs load only when configured.

A sink is handed batches in spool order and either returns (every record of the batch
is accepted and may be acknowledged) or raises one of the failure kinds of
`bridge.retry`: RetryableError / ThrottledError (the same batch comes back after a
backoff), PoisonRecords (those records are set aside, the rest retried), or
PermanentError (a person must fix something; retried slowly and logged at ERROR).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from bridge.config import Config


@dataclass(frozen=True)
class SpooledRecord:
    """A record as the spool holds it: its sequence number and its JSON text."""

    seq: int
    record_id: str
    record_type: str
    body: str


class Sink(Protocol):
    @property
    def name(self) -> str:
        """Unique, stable name; the spool keeps this sink's progress under it."""

    @property
    def max_batch(self) -> int:
        """Most records one `send` may be handed."""

    def send(self, batch: Sequence[SpooledRecord]) -> None:
        """Deliver every record of `batch`, in order, or raise a bridge.retry failure."""

    def close(self) -> None:
        """Release files and connections; called once at shutdown."""


def check(sink: Sink) -> str:
    """A harmless real round trip to `sink`: what worked, or a bridge.retry failure with advice."""
    probe = getattr(sink, "check", None)
    if probe is None:
        return "no check for this sink"
    result: str = probe()
    return result


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
    # Each kind is imported only when configured, so a cloud sink's SDK loads only if used.
    if kind == "jsonl":
        from bridge.sinks.jsonl import JsonlSink  # noqa: PLC0415

        return JsonlSink(Path(arg))
    if kind == "hub":
        from bridge.sinks.hub import HubSink  # noqa: PLC0415

        return HubSink(Path(arg))
    if kind == "stdout":
        from bridge.sinks.stdout import StdoutSink  # noqa: PLC0415

        return StdoutSink()
    if config is None:
        raise ValueError(f"sink {spec!r} needs its settings")
    if kind == "eventhubs":
        from bridge.sinks.eventhubs import EventHubsSink  # noqa: PLC0415

        return EventHubsSink(config)
    from bridge.sinks.loganalytics import LogAnalyticsSink  # noqa: PLC0415

    return LogAnalyticsSink(config)
