"""Every Resource Graph query the consumer sends (the reconciler's, the patch runs', the week
ahead's) passes Microsoft's Kusto parser against Resource Graph's tables, as infra/'s KQL does
(tools/kql_check): the Resource Graph double serves rows by table and does not run KQL, so a
query it answers may still be one Azure refuses."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from types import ModuleType
from typing import Any

import pytest

from bridge.consumer import weekahead
from bridge.consumer.planned import more_upcoming
from bridge.consumer.sources import patchruns, planned, resourcegraph
from bridge.consumer.sources.eventgrid import Trust
from tests.unit.consumer import test_planned as samples
from tests.unit.consumer.test_weekahead import _graph as configurations
from tests.unit.policy.test_model import NOW, fleet
from tools import kql_check
from tools.kql_check import KqlText

MODULES: tuple[ModuleType, ...] = (weekahead, patchruns, planned, resourcegraph)
SUB = samples.SUB
VM = samples.compute("virtualMachines", "vm0").lower()
SCALE_SET = samples.compute("virtualMachineScaleSets", "web").lower()
TRUST = Trust(frozenset({SUB}), frozenset({"rg-web", f"{SUB}/rg-app"}), health=True)

# Every function that writes a query, with arguments as the consumer gives them.
BUILT: Mapping[Callable[..., Any], tuple[tuple[Any, ...], ...]] = {
    weekahead.configuration_query: ((),),
    patchruns.assignment_query: ((samples.WEB_TUE,),),
    patchruns.scope_query: (
        ({},),
        ({"resourcegroups": ["rg-web", "rg-app"], "locations": ["westeurope"]},),
    ),
    patchruns.placement_query: (([VM, VM.replace("vm0", "vm1")],),),
    patchruns.instances_queries: (([SCALE_SET],),),
    planned.event_query: ((),),
    planned.impacted_query: ((["PYN_-ZL8", "1J14-8LG"],),),
    planned.notice_query: ((),),
    planned.cluster_query: (([samples.CLUSTER.lower()],),),
    resourcegraph.queries: ((TRUST,), (TRUST, [VM]), (Trust(frozenset({SUB})),)),
}


def _built() -> list[KqlText]:
    texts: list[KqlText] = []
    for function, calls in BUILT.items():
        for n, args in enumerate(calls):
            made = function(*args)
            found = made.values() if isinstance(made, dict) else [made] if isinstance(made, str) \
                else made  # fmt: skip
            texts += [KqlText(f"{function.__qualname__}#{n}.{i}", q, "resourcegraph")
                      for i, q in enumerate(found)]  # fmt: skip
    return texts


def _sent() -> list[KqlText]:
    """The queries the week ahead's read sends, recorded on their way to Resource Graph."""
    sent: list[str] = []

    def recorded(
        rows: Callable[[str, list[str]], Iterable[Mapping[str, Any]]],
    ) -> Callable[[str, list[str]], Iterable[Mapping[str, Any]]]:
        def send(query: str, subscriptions: list[str]) -> Iterable[Mapping[str, Any]]:
            sent.append(query)
            return rows(query, subscriptions)

        return send

    weekahead.read_runs(recorded(configurations), [samples.SUB], NOW)
    graph = samples.Graph(
        servicehealthresources=[samples.event_row(), samples.impacted_row(VM)],
        containerserviceeventresources=[samples.notice_row()],
        resources=[samples.cluster_row(system={"count": 3})],
    )
    more_upcoming(recorded(graph), [SUB], fleet(*samples.WEB), (), NOW, "c")
    return [KqlText(f"sent#{n}", q, "resourcegraph") for n, q in enumerate(sent)]


@cache
def _checked() -> dict[str, tuple[KqlText, kql_check.Result]]:
    texts = _built() + _sent()
    return {t.name: (t, r) for t, r in zip(texts, kql_check.run(texts), strict=True)}


def test_every_function_that_writes_a_query_is_checked() -> None:
    writers = {
        f"{module.__name__}.{name}"
        for module in MODULES
        for name, function in inspect.getmembers(module, inspect.isfunction)
        if function.__module__ == module.__name__
        and (name.endswith(("_query", "_queries")) or name == "queries")
    }
    assert writers == {f"{f.__module__}.{f.__name__}" for f in BUILT}


def test_the_week_aheads_read_sends_queries_of_every_source() -> None:
    tables = {t.text.split("|", 1)[0].strip() for t, _ in _checked().values()
              if t.name.startswith("sent#")}  # fmt: skip
    assert tables == {"resources", "maintenanceresources", "servicehealthresources",
                      "containerserviceeventresources"}  # fmt: skip


@pytest.mark.parametrize("name", [t.name for t in _built()] + ["sent"])
def test_the_query_passes_the_kusto_parser(name: str) -> None:
    checked = [c for n, c in _checked().items() if n == name or n.startswith(f"{name}#")]
    assert checked
    problems = kql_check.problems([t for t, _ in checked], [r for _, r in checked])
    assert problems == [], "\n".join([*problems, *(t.text for t, _ in checked)])
    for _, result in checked:
        assert set(result.sources) <= set(kql_check.RESOURCE_GRAPH_TABLES)


def test_the_parser_refuses_what_resource_graph_would() -> None:
    bad = [
        KqlText("bad:column", "resources | where typ =~ 'x'", "resourcegraph"),
        KqlText("bad:table", "servicehealthresource | project id", "resourcegraph"),
        KqlText("bad:syntax", "resources | where tolower(id) in ('a',", "resourcegraph"),
    ]
    results = kql_check.run(bad)
    assert all(r.errors for r in results), results
