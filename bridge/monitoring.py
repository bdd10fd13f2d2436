"""What `se-bridge status` and `status --consumer` share as monitoring checks: the exit codes
of the monitoring-plugin convention (Nagios, Icinga, Sensu, a Zabbix external check), a report
that keeps the worst level flagged, and how it prints (text, or `--json` as one object)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TypeVar

from bridge.redact import printable

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
LEVELS = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}


@dataclass
class CheckReport:
    """The level (the exit code) and the problems behind it; a check's own fields follow."""

    level: int = OK
    problems: list[str] = field(default_factory=list)

    def flag(self, level: int, problem: str) -> None:
        self.level = max(self.level, level)
        self.problems.append(f"{LEVELS[level]}: {problem}")


Report = TypeVar("Report", bound=CheckReport)


def said(report: Report, as_json: bool, render: Callable[[Report], str]) -> str:
    if as_json:
        return json.dumps({"status": LEVELS[report.level], **asdict(report)}, indent=2)
    return render(report)


def unknown(report: Report, problem: str, as_json: bool, render: Callable[[Report], str]) -> int:
    """Say UNKNOWN (a check that cannot look): `--json` still one object, else one line, on
    stdout as every other level (a monitoring system reads the first line of stdout); exit 3,
    never 1 or 2, which a monitoring system would take for the state it checks."""
    report.flag(UNKNOWN, problem)
    emit(said(report, as_json, render) if as_json else printable(report.problems[0]))
    return UNKNOWN


def emit(text: str) -> None:
    """Print a check's output; a reader that left early (`| head -1`) is no error, and the
    level stays the exit code."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_gone()


def stdout_gone() -> None:
    """The reader of stdout has gone: point stdout at the null device, so that nothing still
    buffered fails again as the interpreter exits (an "Exception ignored" traceback)."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())
    os.close(null)
