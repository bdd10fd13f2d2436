"""Where the process log goes: stderr (journald, Docker and a console rotate it) or a file.

A file is rotated by size in this process (RotatingFileHandler), so it works the same on
Windows, where there is no logrotate, and needs no signal to reopen it. On Linux under
systemd leave `agent.log_file` unset: the journal already rotates and caps stderr.
"""

from __future__ import annotations

import logging
import sys
from logging.handlers import RotatingFileHandler
from pathlib import Path

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


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


def setup_logging(level: str = "INFO", to: logging.Handler | None = None) -> None:
    """Log at `level` to `to` (see `handler`), by default stderr; every program calls this."""
    logging.basicConfig(level=level, handlers=[to or handler(None)], format=LOG_FORMAT, force=True)
    # The Azure SDKs narrate every retry and request at INFO; the sinks report what matters.
    logging.getLogger("azure").setLevel(max(logging.WARNING, logging.getLevelName(level)))
