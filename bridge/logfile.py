"""Where the process log goes: stderr (journald, Docker and a console rotate it) or a file.

A file is rotated by size in this process (RotatingFileHandler), so it works the same on
Windows, where there is no logrotate, and needs no signal to reopen it. On Linux under
systemd leave `agent.log_file` unset: the journal already rotates and caps stderr.

Two formats (`--log-format`, `agent.log_format`): `text`, a line a person reads, and `json`,
one object per line for a log pipeline (Fluent Bit, the Azure Monitor agent, Vector), such as

    {"time": "2026-11-26T07:00:11.250Z", "level": "INFO", "logger": "bridge.agent.loop",
     "message": "polling IMDS at http://169.254.169.254 every 1 s", "program": "agent",
     "version": "0.1.0", "pid": 4242, "thread": "MainThread"}

with "exception" (the traceback) when the line reports one.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import datetime, timezone
from logging.handlers import RotatingFileHandler
from pathlib import Path

from bridge import __version__

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the fields a log pipeline indexes."""

    def __init__(self, program: str) -> None:
        super().__init__()
        self.program = program

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, timezone.utc)
        line: dict[str, object] = {
            "time": moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "program": self.program,
            "version": __version__,
            "pid": os.getpid(),
            "thread": record.threadName,
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        # ensure_ascii: a lone surrogate in a message (from outside input) stays valid JSON text.
        return json.dumps(line, ensure_ascii=True, default=str)


def handler(
    log_file: Path | None, *, max_bytes: int = 10 * 1024 * 1024, backups: int = 5
) -> logging.Handler:
    """A size-rotated file handler for `log_file`, or a stderr handler when it is None.

    Creates the file's directory. Raises OSError when the file cannot be opened, so the
    caller can stop with a message instead of running without a log.
    """
    if log_file is None:
        # Logs go to stderr: stdout belongs to the stdout sink.
        return logging.StreamHandler(sys.stderr)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    return RotatingFileHandler(log_file, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")


def setup_logging(
    level: str = "INFO",
    to: logging.Handler | None = None,
    *,
    fmt: str = "text",
    program: str = "se-bridge",
) -> None:
    """Log at `level` in format `fmt` (text or json) to `to` (see `handler`), by default
    stderr; every program calls this."""
    target = to or handler(None)
    target.setFormatter(JsonFormatter(program) if fmt == "json" else logging.Formatter(LOG_FORMAT))
    logging.basicConfig(level=level, handlers=[target], force=True)
    # The Azure SDKs narrate every retry and request at INFO; the sinks report what matters.
    # So does the Kubernetes client's HTTP library (httpx2): the drains report what matters.
    for chatty in ("azure", "httpx2"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLevelName(level)))
