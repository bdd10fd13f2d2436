"""infra/'s second source (issue 36): the system topics and their deliveries into an event hub
the consumer reads, declared only behind main.bicep's eventGridSource, off by default."""

from __future__ import annotations

import re
from typing import Any

from bridge import config
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


def test_arms_acknowledge_takes_the_narrowest_role_that_allows_it_and_nothing_else() -> None:
    names = bicep.role_variables(ACKNOWLEDGE)
    assert [role for _, role in names.values()] == ["Scheduled Events Contributor"]
    found = bicep.resources(ACKNOWLEDGE, "Microsoft.Authorization/roleAssignments")
    (assignment,) = found.values()
    config = bicep.unlooped(assignment["config"])
    assert "scope" not in config  # the resource group the module is deployed into
    assert config["properties"]["principalType"] == "ServicePrincipal"
    for guid, role in names.values():
        assert BUILT_IN_ROLES[guid] == role


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
                             "SE_BRIDGE_EVENTGRID_ACKNOWLEDGE"}  # fmt: skip
    settings_of = config.load(environ=environ).eventgrid
    assert (settings_of.enabled, settings_of.hub) == (True, "eventgrid")
