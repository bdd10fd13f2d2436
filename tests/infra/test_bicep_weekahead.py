"""infra/'s week ahead (issue 40, item 2): the first Function App reads the maintenance
configurations through Resource Graph only behind main.bicep's weekAhead (off by default), at an
interval the app's timer keeps, with Reader on the resource groups it names and nothing wider."""

from __future__ import annotations

import re
from typing import Any

from bridge import config
from bridge.consumer import functionapp
from tests.infra.test_bicep import MAIN, MODULES
from tests.support import bicep

APP = MODULES / "functionapp.bicep"


def _module(name: str) -> dict[str, Any]:
    found: dict[str, Any] = bicep.parse(MAIN)["modules"][name]["config"]
    return found


def test_the_week_ahead_is_off_by_default_and_read_only_by_the_first_app() -> None:
    main = MAIN.read_text(encoding="utf-8")
    assert re.search(r"^param weekAhead bool = false$", main, re.MULTILINE)
    given = bicep.unlooped(_module("functionApp"))["params"]
    assert given["weekAheadInterval"] == "weekAheadInterval"
    assert "weekAhead: weekAhead && i == 0" in main  # the first app only: one read an interval
    assert bicep.parse(APP)["parameters"]["weekAhead"]["default"] is False


def test_the_interval_is_one_the_apps_timer_keeps_and_consume_takes() -> None:
    interval = bicep.parse(MAIN)["parameters"]["weekAheadInterval"]
    assert interval["default"] == 21600
    allowed = {d["type"]: d["argument"] for d in interval["decorators"]}["allowed"]
    low = config.WeekAheadSettings.__dataclass_fields__["interval"].metadata["low"]
    assert allowed == [i for i in functionapp.RECONCILE_INTERVALS if i >= low]
    for seconds in allowed:
        functionapp.reconcile_schedule(seconds)


def test_the_apps_settings_are_the_week_ahead_settings_se_bridge_reads() -> None:
    variable = bicep.variables(APP)["weekAheadSettings"]["operator"]["operands"]
    assert variable["condition"] == "weekAhead"
    assert variable["false_value"] == {}
    settings = variable["true_value"]
    assert set(settings) == {"SE_BRIDGE_WEEKAHEAD_ENABLED", "SE_BRIDGE_WEEKAHEAD_INTERVAL",
                             "SE_BRIDGE_WEEKAHEAD_SUBSCRIPTIONS"}  # fmt: skip
    assert settings["SE_BRIDGE_WEEKAHEAD_ENABLED"] == "true"
    text = APP.read_text(encoding="utf-8")
    assert "SE_BRIDGE_WEEKAHEAD_SUBSCRIPTIONS: subscription().subscriptionId" in text
    assert re.search(r"properties: union\([^)]*\bweekAheadSettings\b", text)
    environ = {
        "SE_BRIDGE_WEEKAHEAD_ENABLED": "true",
        "SE_BRIDGE_WEEKAHEAD_INTERVAL": "21600",
        "SE_BRIDGE_WEEKAHEAD_SUBSCRIPTIONS": "8d5f9c8e-1111-4222-8333-444455556666",
    }
    assert functionapp.week_ahead_timer(environ) == "0 0 */6 * * *"


def test_reading_is_reader_on_the_named_groups_only_behind_the_parameter() -> None:
    module = _module("weekAheadReader")
    assert module["condition"] == "weekAhead"
    text = MAIN.read_text(encoding="utf-8")
    assert "module weekAheadReader 'modules/resource-graph-reader.bicep'" in text
    assert "empty(weekAheadResourceGroups) ? [resourceGroup().name] : weekAheadResourceGroups" in (
        text)  # fmt: skip
    reader = MODULES / "resource-graph-reader.bicep"
    assert [name for _, name in bicep.role_variables(reader).values()] == ["Reader"]
    assert "scope: resourceGroup(group)" in text.split("module weekAheadReader", 1)[1][:400]
