"""The Resource Graph reconciler's settings and queries (issue 36, item 4)."""

from __future__ import annotations

import pytest

from bridge.config import ConfigError
from bridge.consumer import wiring
from bridge.consumer.sources.eventgrid import Trust
from bridge.consumer.sources.resourcegraph import queries

SUB = "8d5f9c8e-1111-4222-8333-444455556666"
ON = {
    "SE_BRIDGE_EVENTGRID_ENABLED": "true",
    "SE_BRIDGE_EVENTGRID_HUB": "eventgrid",
    "SE_BRIDGE_EVENTGRID_SUBSCRIPTIONS": SUB,
}


def test_the_reconciler_is_off_by_default() -> None:
    config = wiring.load_config(environ=ON)
    assert config.eventgrid.reconcile_interval == 0
    assert config.eventgrid.resource_graph_url == "https://management.azure.com"


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL": "5"}, r"neither 0 \(off\) nor from 60"),
        ({"SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL": "-300"}, "must be between"),
        ({"SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL": "90000"}, "must be between"),
        ({"SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL": "often"}, "reconcile_interval"),
        (
            {
                "SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL": "300",
                "SE_BRIDGE_EVENTGRID_RESOURCE_GRAPH_URL": "http://management.azure.com",
            },
            "https://",
        ),
    ],
)
def test_a_bad_interval_or_address_stops_the_consumer_at_start(
    settings: dict[str, str], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        wiring.load_config(environ={**ON, **settings})


def test_the_reconciler_needs_the_second_source() -> None:
    with pytest.raises(ConfigError, match=r"needs eventgrid\.enabled"):
        wiring.load_config(environ={"SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL": "300"})


def test_five_minutes_is_taken() -> None:
    config = wiring.load_config(environ={**ON, "SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL": "300"})
    assert config.eventgrid.reconcile_interval == 300


def test_the_queries_read_the_documented_tables_narrowed_to_the_fleets_groups() -> None:
    found = queries(Trust(frozenset({SUB}), frozenset({"rg-web", f"{SUB}/rg-app"}), health=True))
    assert found["maintenanceresources"].startswith(
        "maintenanceresources | where type =~ 'microsoft.maintenance/scheduledevents'"
    )
    assert found["healthresources"].startswith(
        "healthresources | where type =~ 'microsoft.resourcehealth/availabilitystatuses'"
    )
    assert all("resourceGroup in~ ('rg-app', 'rg-web')" in q for q in found.values())
    assert list(queries(Trust(frozenset({SUB})))) == ["maintenanceresources"]


def test_a_group_name_that_is_not_azures_is_not_put_into_a_query() -> None:
    found = queries(Trust(frozenset({SUB}), frozenset({"rg') | union (x"})))
    assert "in~" not in found["maintenanceresources"]


def test_health_reads_vms_not_available_and_those_held_down() -> None:
    held = "/subscriptions/x/resourcegroups/rg/providers/microsoft.compute/virtualmachines/web_1"
    query = queries(Trust(frozenset({SUB}), health=True), [held])["healthresources"]
    assert (
        f"| where tostring(properties.availabilityState) != 'Available' or "
        f"tolower(tostring(properties.targetResourceId)) in ('{held}')"
    ) in query
    unsafe = queries(Trust(frozenset({SUB}), health=True), ["/subscriptions/x') or (1"])
    assert "availabilityState" not in unsafe["healthresources"]
