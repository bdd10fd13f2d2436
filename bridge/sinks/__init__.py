"""Sinks: where spooled records go. One module per kind; the `--sink` SPEC's kinds and the
check of their settings are bridge.sinks.kinds.KINDS. Cloud SDKs load only when a cloud sink
sends.
"""

from __future__ import annotations

from bridge.sinks.base import BaseSink, Sink, SpooledRecord
from bridge.sinks.kinds import KINDS, build, check_config

__all__ = ["KINDS", "BaseSink", "Sink", "SpooledRecord", "build", "check_config"]
