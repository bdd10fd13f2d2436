"""infra/'s second source (issue 36): the system topics and their deliveries into an event hub
the consumer reads, declared only behind main.bicep's eventGridSource, off by default."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from bridge import config
from bridge.consumer import functionapp
from tests.infra.test_bicep import BUILT_IN_ROLES, MAIN, MODULES
from tests.support import bicep

EVENTGRID = MODULES / "eventgrid.bicep"


def _text() -> str:
    return EVENTGRID.read_text(encoding="utf-8")


def test_it_is_off_by_default_and_only_behind_its_parameter() -> None:
    main = MAIN.read_text(encoding="utf-8")
    assert re.search(r"^param eventGridSource bool = false$", main, re.MULTILINE)
    assert re.search(r"^param eventGridHealth bool = false$", main, re.MULTILINE)
    assert "module eventGrid 'modules/eventgrid.bicep' = if (eventGridSource) {" in main
    module = bicep.parse(MAIN)["modules"]["eventGrid"]
    params = module["config"]["config"]["params"]
    assert bicep.symbol(params["health"]) == "eventGridHealth"
    health = bicep.parse(EVENTGRID)["parameters"]["health"]
    assert health["default"] is False


def test_the_topics_are_the_subscriptions_system_topics_of_the_two_types() -> None:
    text = _text()
    assert "'Microsoft.ResourceNotifications.MaintenanceResources'" in text
    assert "'Microsoft.ResourceNotifications.HealthResources'" in text
    topics = bicep.resources(EVENTGRID, "Microsoft.EventGrid/systemTopics")["topics"]
    config = bicep.unlooped(topics["config"])
    assert config["location"] == "global"
    assert config["identity"]["type"] == "SystemAssigned"
    assert "subscription().id" in text
    assert "source: subscription().id" in text


def test_deliveries_go_to_the_hub_with_the_topics_identity_and_no_type_filter() -> None:
    found = bicep.resources(EVENTGRID, "Microsoft.EventGrid/systemTopics/eventSubscriptions")
    properties: dict[str, Any] = bicep.unlooped(found["subscriptions"]["config"])["properties"]
    delivery = properties["deliveryWithResourceIdentity"]
    assert delivery["identity"]["type"] == "SystemAssigned"
    assert delivery["destination"]["endpointType"] == "EventHub"
    target = delivery["destination"]["properties"]["resourceId"]["operator"]["operands"]
    assert (target["operand_1"], target["operand_2"]) == ("hub", "id")
    # Microsoft's page names the scheduled event's type two ways: a filter could drop them all.
    assert "filter" not in properties
    assert "destination" not in properties  # never a SAS-keyed destination


def test_the_topics_may_only_send_to_the_hub_and_the_consumer_only_read_it() -> None:
    names = bicep.role_variables(EVENTGRID)
    roles = {(scope, names[var][1]) for _, scope, var in bicep.role_assignments(EVENTGRID)}
    assert roles == {
        ("hub", "Azure Event Hubs Data Sender"),
        ("hub", "Azure Event Hubs Data Receiver"),
    }
    for guid, role in names.values():
        assert BUILT_IN_ROLES[guid] == role


ACKNOWLEDGE = MODULES / "arm-acknowledge.bicep"


def test_arms_acknowledge_is_granted_only_behind_both_parameters_off_by_default() -> None:
    main = MAIN.read_text(encoding="utf-8")
    assert re.search(r"^param eventGridAcknowledge bool = false$", main, re.MULTILINE)
    assert "if (eventGridSource && eventGridAcknowledge) {" in main
    module = bicep.parse(MAIN)["modules"]["armAcknowledge"]
    assert "scope: resourceGroup(group)" in main
    assert module["config"]["condition"]["operator"]["type"] == "and"
    assert "consumerPrincipalId" in module["config"]["config"]["params"]


@pytest.mark.parametrize(
    ("module", "role"),
    [
        (ACKNOWLEDGE, "Scheduled Events Contributor"),
        # Resource Graph answers only with rows of resources the caller may read; Reader
        # (*/read) is the narrowest built-in role that reads both of the reconciler's tables.
        (MODULES / "resource-graph-reader.bicep", "Reader"),
    ],
    ids=lambda v: v.name if isinstance(v, Path) else v,
)
def test_each_fleet_grant_takes_the_narrowest_role_that_allows_it_and_nothing_else(
    module: Path, role: str
) -> None:
    names = bicep.role_variables(module)
    assert [name for _, name in names.values()] == [role]
    (assignment,) = bicep.resources(module, "Microsoft.Authorization/roleAssignments").values()
    config = bicep.unlooped(assignment["config"])
    assert "scope" not in config  # the resource group the module is deployed into
    assert config["properties"]["principalType"] == "ServicePrincipal"
    for guid, name in names.values():
        assert BUILT_IN_ROLES[guid] == name


def test_the_first_function_app_reads_the_hub_behind_eventgridsource_only() -> None:
    """The app whose identity may read the hub gets the [eventgrid] settings that register its
    eventgrid function (bridge/consumer/functionapp.py); no other app, and none when off."""
    main = MAIN.read_text(encoding="utf-8")
    assert "eventGridHub: (eventGridSource && i == 0) ? eventGridHubName : ''" in main
    assert "consumerPrincipalId: functionApp[0].outputs.identityPrincipalId" in main
    params = bicep.parse(MAIN)["modules"]["eventGrid"]["config"]["config"]["params"]
    assert params["eventHubName"] == "eventGridHubName"
    assert bicep.variables(MAIN)["eventGridHubName"] == "eventgrid"
    app = MODULES / "functionapp.bicep"
    assert bicep.parse(app)["parameters"]["eventGridHub"]["default"] == ""
    variable = bicep.variables(app)["eventGridSettings"]["operator"]["operands"]
    assert variable["condition"]["function"] == {
        "type": "empty",
        "parameters": {"item_to_test": "eventGridHub"},
    }
    assert variable["true_value"] == {}
    settings = variable["false_value"]
    assert settings["SE_BRIDGE_EVENTGRID_HUB"] == "eventGridHub"
    # What se-bridge's config makes of them (the subscription stands for subscription()'s).
    environ = {
        "SE_BRIDGE_EVENTGRID_ENABLED": settings["SE_BRIDGE_EVENTGRID_ENABLED"],
        "SE_BRIDGE_EVENTGRID_HUB": "eventgrid",
        "SE_BRIDGE_EVENTGRID_SUBSCRIPTIONS": "8d5f9c8e-1111-4222-8333-444455556666",
    }
    assert set(settings) == {*environ, "SE_BRIDGE_EVENTGRID_HEALTH",
                             "SE_BRIDGE_EVENTGRID_ACKNOWLEDGE",
                             "SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL",
                             # Update Manager's patch runs come from the same hub (issue 40).
                             "SE_BRIDGE_PATCHRUNS_ENABLED", "SE_BRIDGE_PATCHRUNS_ON_BREACH",
                             "SE_BRIDGE_PATCHRUNS_CANCEL"}  # fmt: skip
    settings_of = config.load(environ=environ).eventgrid
    assert (settings_of.enabled, settings_of.hub) == (True, "eventgrid")


def _holds(condition: Any, parameters: dict[str, bool]) -> bool:
    """A module's condition, of parameter names, `&&` and `||` (pycep's form), evaluated."""
    if isinstance(condition, str):
        return parameters[condition]
    operator = condition["operator"]
    left, right = (_holds(o, parameters) for o in operator["operands"].values())
    assert operator["type"] in ("and", "or"), operator
    return (left and right) if operator["type"] == "and" else (left or right)


def test_resource_graph_reading_is_granted_only_behind_its_parameter_off_by_default() -> None:
    """The reconciler's Reader (issue 36) exists only with eventGridSource and
    eventGridReconcile, on the resource groups ARM's acknowledge is granted on."""
    main = MAIN.read_text(encoding="utf-8")
    assert re.search(r"^param eventGridReconcile bool = false$", main, re.MULTILINE)
    modules = bicep.parse(MAIN)["modules"]
    module = modules["resourceGraphReader"]["config"]
    for source in (False, True):
        for reconcile in (False, True):
            for acknowledge in (False, True):
                on = {"eventGridSource": source, "eventGridReconcile": reconcile,
                      "eventGridAcknowledge": acknowledge}  # fmt: skip
                assert _holds(module["condition"], on) is (source and reconcile), on
    # The fleet's resource groups (empty: this deployment's), each one deployment of its own.
    assert module["loop_type"] == modules["armAcknowledge"]["config"]["loop_type"]
    assert module["config"]["scope"] == modules["armAcknowledge"]["config"]["config"]["scope"]
    assert "consumerPrincipalId: functionApp[0].outputs.identityPrincipalId" in main


def test_the_first_app_reconciles_at_the_interval_only_behind_the_parameter() -> None:
    """SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL is set with the rest of [eventgrid] (on the first
    app, with eventGridSource): the interval with eventGridReconcile, 0 (no reconciler)
    without; and the interval is one the app's timer keeps (functionapp.RECONCILE_INTERVALS)."""
    interval = bicep.parse(MAIN)["parameters"]["eventGridReconcileInterval"]
    assert interval["type"] == "int"
    assert interval["default"] == 300
    decorators = {d["type"]: d["argument"] for d in interval["decorators"]}
    assert decorators["allowed"] == list(functionapp.RECONCILE_INTERVALS)
    (given,) = [bicep.unlooped(bicep.parse(MAIN)["modules"]["functionApp"]["config"])["params"]]
    operands = given["eventGridReconcileInterval"]["operator"]["operands"]
    assert (operands["condition"], operands["true_value"], operands["false_value"]) == (
        "eventGridReconcile", "eventGridReconcileInterval", 0)  # fmt: skip
    app = MODULES / "functionapp.bicep"
    assert bicep.parse(app)["parameters"]["eventGridReconcileInterval"]["default"] == 0
    settings = bicep.variables(app)["eventGridSettings"]["operator"]["operands"]["false_value"]
    value = settings["SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL"]
    assert value["function"] == {
        "type": "string",
        "parameters": {"value_to_convert": "eventGridReconcileInterval"},
    }
