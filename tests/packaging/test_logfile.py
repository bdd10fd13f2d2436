"""`agent.log_file` / `--log-file`: a size-rotated log, and the settings that shape it."""

from __future__ import annotations

import logging
from logging.handlers import RotatingFileHandler
from pathlib import Path

import pytest

from bridge import cli, logfile
from bridge.config import ConfigError, load


def test_the_log_file_rotates_by_size_and_keeps_the_backups(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "agent.log"  # the directory does not exist yet
    handler = logfile.handler(path, max_bytes=1000, backups=2)
    log = logging.getLogger("tests.packaging.rotation")
    log.addHandler(handler)
    log.propagate = False
    try:
        for i in range(100):
            log.warning("line %03d of a log that outgrows its file", i)
    finally:
        log.removeHandler(handler)
        handler.close()
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == ["agent.log", "agent.log.1", "agent.log.2"]
    assert all(p.stat().st_size <= 1000 for p in path.parent.iterdir())
    assert "line 099" in path.read_text(encoding="utf-8")


def test_no_log_file_means_stderr() -> None:
    handler = logfile.handler(None)
    assert type(handler) is logging.StreamHandler
    assert not isinstance(handler, RotatingFileHandler)


def test_an_unwritable_log_file_is_an_oserror(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    with pytest.raises(OSError):  # noqa: PT011 - FileExistsError or NotADirectoryError
        logfile.handler(blocker / "agent.log")


def test_log_settings_come_from_file_environment_and_flag(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nlog_file = "/a.log"\nlog_backups = 3\n', encoding="utf-8")
    env = {"SE_BRIDGE_AGENT_LOG_MAX_BYTES": "1048576"}
    settings = load(config, environ=env).agent
    assert (settings.log_file, settings.log_backups, settings.log_max_bytes) == (
        Path("/a.log"), 3, 1048576
    )  # fmt: skip
    args = cli.build_parser().parse_args(["agent", "--log-file", "/b.log"])
    assert load(config, environ={}, flags={"agent.log_file": args.log_file}).agent.log_file == (
        Path("/b.log")
    )
    assert load(None, environ={}).agent.log_file is None


def test_a_log_file_smaller_than_64_kib_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"agent\.log_max_bytes"):
        load(None, environ={"SE_BRIDGE_AGENT_LOG_MAX_BYTES": "100"})


def test_the_agent_stops_with_a_message_when_its_log_file_cannot_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    argv = ["agent", "--state-dir", str(tmp_path), "--log-file", str(blocker / "agent.log")]
    assert cli.main(argv) == 1
    assert f"cannot open the log file {blocker / 'agent.log'}" in capsys.readouterr().err
