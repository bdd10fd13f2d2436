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


SUBSCRIPTION_READER = MODULES / "subscription-reader.bicep"


def test_reader_at_the_subscription_is_granted_only_behind_its_own_parameter() -> None:
    """Service Health's events and impacted resources, AKS's notices and dynamic scopes are
    subscription-level rows: Resource Graph answers them only to a Reader of the
    subscription. Off by default: the deployer must be allowed to grant it there."""
    main = MAIN.read_text(encoding="utf-8")
    assert re.search(r"^param weekAheadSubscriptionReader bool = false$", main, re.MULTILINE)
    module = bicep.parse(MAIN)["modules"]["weekAheadSubscriptionRead"]
    assert module["detail"]["path"] == "modules/subscription-reader.bicep"
    condition = module["config"]["condition"]["operator"]
    assert condition["type"] == "and"
    assert set(condition["operands"].values()) == {"weekAhead", "weekAheadSubscriptionReader"}
    config = bicep.unlooped(module["config"])
    assert config["scope"]["function"] == {
        "type": "subscription",
        "parameters": {"subscription_id": None},
    }  # this deployment's subscription, none other
    assert set(config["params"]) == {"consumerPrincipalId"}
    assert (
        "consumerPrincipalId: functionApp[0].outputs.identityPrincipalId"
        in main.split("module weekAheadSubscriptionRead", 1)[1][:400]
    )


def test_the_subscription_grant_is_reader_only_named_deterministically() -> None:
    text = SUBSCRIPTION_READER.read_text(encoding="utf-8")
    assert re.search(r"^targetScope = 'subscription'$", text, re.MULTILINE)
    assert [name for _, name in bicep.role_variables(SUBSCRIPTION_READER).values()] == ["Reader"]
    (assignment,) = bicep.resources(
        SUBSCRIPTION_READER, "Microsoft.Authorization/roleAssignments"
    ).values()
    config = bicep.unlooped(assignment["config"])
    assert "scope" not in config  # the subscription the module is deployed to
    assert config["properties"]["principalType"] == "ServicePrincipal"
    # The same name each deployment: deploying again finds the assignment, adds none.
    assert "name: guid(subscription().id, consumerPrincipalId, reader)" in text
    definition = "subscriptionResourceId('Microsoft.Authorization/roleDefinitions', reader)"
    assert f"roleDefinitionId: {definition}" in text
