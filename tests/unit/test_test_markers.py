"""The markers a test gets from what it needs (tests/support/markers.py), read from code that is
never run here."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.support import markers

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


class Server:
    """Stands for a class that starts a server of its own (Azurite, the broker)."""


class Harness:
    def start(self) -> Server:
        return Server()


def starts_a_server() -> Server:
    return Server()


def calls_a_helper_that_starts_one() -> object:
    return starts_a_server()


def uses_a_harness() -> object:
    return Harness().start()


def needs_nothing() -> int:
    return len("Server")


def asks_for_a_fixture_by_name(request: Any) -> object:
    return request.getfixturevalue("azurite")


NEEDS: dict[object, str] = {Server: "broker"}


def test_a_test_naming_the_server_needs_it() -> None:
    assert markers.reached([starts_a_server], NEEDS) == {"broker"}


def test_a_test_reaching_it_through_helpers_of_tests_needs_it() -> None:
    assert markers.reached([calls_a_helper_that_starts_one], NEEDS) == {"broker"}
    assert markers.reached([uses_a_harness], NEEDS) == {"broker"}


def test_a_fixture_asked_for_by_name_is_needed() -> None:
    # Looked up, not named: this test itself needs no Azurite.
    asks = globals()["asks_for_a_fixture_by_name"]
    assert markers.reached([asks], NEEDS) == {"azurite"}
    assert markers.reached([asks], NEEDS, by_name=False) == set()


def test_a_test_that_only_names_it_in_a_string_needs_nothing() -> None:
    assert markers.reached([needs_nothing], NEEDS) == set()


def test_a_helper_deeper_than_the_depth_is_not_read() -> None:
    assert markers.reached([calls_a_helper_that_starts_one], NEEDS, depth=1) == set()


def test_directories_give_their_markers() -> None:
    assert markers.by_directory(TESTS / "e2e" / "test_x.py", TESTS) == {"e2e", "subprocess"}
    assert markers.by_directory(TESTS / "infra" / "test_x.py", TESTS) == {"tools"}
    assert markers.by_directory(TESTS / "unit" / "agent" / "test_x.py", TESTS) == set()
    assert markers.by_directory(TESTS / "test_x.py", TESTS) == set()


def test_every_heavy_marker_is_registered_and_every_registered_one_is_known() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    registered = {m.split(":")[0] for m in pyproject["tool"]["pytest"]["ini_options"]["markers"]}
    assert registered == set(markers.HEAVY)
    assert "--strict-markers" in pyproject["tool"]["pytest"]["ini_options"]["addopts"]
