"""The log formats: a JSON line holds what a log pipeline indexes, a traceback included."""

from __future__ import annotations

import io
import json
import logging

import pytest

from bridge.logfile import setup_logging


@pytest.fixture
def captured() -> io.StringIO:
    return io.StringIO()


def test_a_json_line_per_record_with_its_exception(captured: io.StringIO) -> None:
    setup_logging("INFO", logging.StreamHandler(captured), fmt="json", program="consumer")
    log = logging.getLogger("bridge.test")
    log.info("sent the approval of event %s", "E1")
    try:
        int("bad \ud800 value")
    except ValueError:
        log.exception("deciding event %s failed", "E2")
    first, second = (json.loads(line) for line in captured.getvalue().splitlines())
    assert first["message"] == "sent the approval of event E1"
    assert (first["level"], first["logger"], first["program"]) == (
        "INFO",
        "bridge.test",
        "consumer",
    )
    assert "exception" not in first
    assert second["level"] == "ERROR"
    assert "ValueError: invalid literal" in second["exception"]


def test_text_stays_a_line_a_person_reads(captured: io.StringIO) -> None:
    setup_logging("WARNING", logging.StreamHandler(captured))
    logging.getLogger("bridge.test").info("not shown")
    logging.getLogger("bridge.test").warning("shown")
    assert captured.getvalue().endswith("WARNING bridge.test: shown\n")


# These two run in this order on one worker: the first leaves a stderr handler bound to its
# captured stream, which the shared fixture must take away before the second logs.
def test_a_program_sets_up_its_log_in_one_test(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("INFO")
    logging.getLogger("bridge.test").warning("logged to this test's stderr")
    assert "logged to this test's stderr" in capsys.readouterr().err


def test_the_next_test_logs_to_no_closed_stream(capfd: pytest.CaptureFixture[str]) -> None:
    logging.getLogger("bridge.test").warning("logged after the other test ended")
    assert "Logging error" not in capfd.readouterr().err
