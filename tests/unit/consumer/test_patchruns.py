"""Update Manager's pre- and post-maintenance events (issue 40, item 1): Microsoft's samples
become run notices, and every delivery se-bridge must not act on is refused."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from bridge.consumer.sources.eventgrid import Trust, parse

DATA = Path(__file__).parents[2] / "data" / "patchruns"
SUB = "00000000-0000-0000-0000-000000000000"
CONFIG = (
    f"/subscriptions/{SUB}/resourceGroups/testrg/providers/Microsoft.Maintenance/"
    "maintenanceConfigurations/contosomaintenanceconfiguration"
)
TRUST = Trust(frozenset({SUB}), patch_runs=True)
UTC = timezone.utc


def sample(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / name).read_text(encoding="utf-8"))
    return loaded


def pre() -> dict[str, Any]:
    return sample("pre-maintenance-eventgrid-schema.json")


def post() -> dict[str, Any]:
    return sample("post-maintenance-cloudevent.json")


def test_the_docs_pre_event_is_a_run_with_its_window_and_cut_off() -> None:
    parsed = parse(json.dumps([pre()]), TRUST)
    assert not parsed.refused
    assert not parsed.ignored
    assert not parsed.events
    (run,) = parsed.runs
    assert run.kind == "pre"
    assert (
        run.run_id
        == f"{CONFIG}/providers/microsoft.maintenance/applyupdates/20230509150000".lower()
    )
    assert run.configuration_id == CONFIG
    assert run.name == "20230509150000"
    assert run.start == datetime(2023, 5, 9, 15, 0, tzinfo=UTC)
    assert run.end == datetime(2023, 5, 9, 18, 55, tzinfo=UTC)
    assert run.cutoff == datetime(2023, 5, 9, 14, 59, tzinfo=UTC)
    assert run.status is None
    # The sample's resourceSubscriptionIds are placeholders, trusted by none: the run's own.
    assert run.subscriptions == (SUB,)


def test_the_docs_post_event_in_cloudevents_and_pascal_case_ends_the_same_run() -> None:
    (run,) = parse(json.dumps(post()), TRUST).runs
    assert run.kind == "post"
    assert run.status == "Succeeded"
    assert run.cutoff is None
    assert run.run_id == parse(json.dumps(pre()), TRUST).runs[0].run_id


def test_patch_runs_off_leaves_the_events_aside_not_refused() -> None:
    parsed = parse(json.dumps(pre()), Trust(frozenset({SUB})))
    assert not parsed.runs
    assert not parsed.refused
    assert parsed.ignored == ["a patch run's event, which patchruns.enabled leaves off"]


def hostile(change: str) -> dict[str, Any]:
    delivery = copy.deepcopy(pre())
    data = delivery["data"]
    other = CONFIG.replace("contosomaintenanceconfiguration", "other")
    if change == "foreign-topic":
        delivery["topic"] = CONFIG.replace(SUB, "11111111-1111-1111-1111-111111111111")
    elif change == "topic-not-a-configuration":
        delivery["topic"] = f"/subscriptions/{SUB}"
    elif change == "data-names-another-configuration":
        data["maintenanceConfigurationId"] = other
    elif change == "run-of-another-configuration":
        data["correlationId"] = (
            f"{other}/providers/microsoft.maintenance/applyupdates/20230509150000"
        )
    elif change == "run-name-not-a-time":
        data["correlationId"] = f"{CONFIG}/providers/microsoft.maintenance/applyupdates/x"
    elif change == "cut-off-after-start":
        data["cancellationCutOffDateTime"] = "2023-05-09T15:01:00Z"
    elif change == "no-cut-off":
        del data["cancellationCutOffDateTime"]
    elif change == "end-before-start":
        data["endDateTime"] = "2023-05-09T14:00:00Z"
    elif change == "window-of-a-day":
        data["endDateTime"] = "2023-05-10T15:00:00Z"
    elif change == "unreadable-start":
        data["startDateTime"] = "Tuesday"
    return delivery


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ("foreign-topic", "untrusted-topic"),
        ("topic-not-a-configuration", "untrusted-topic"),
        ("data-names-another-configuration", "malformed"),
        ("run-of-another-configuration", "malformed"),
        ("run-name-not-a-time", "malformed"),
        ("cut-off-after-start", "malformed"),
        ("no-cut-off", "malformed"),
        ("end-before-start", "malformed"),
        ("window-of-a-day", "malformed"),
        ("unreadable-start", "malformed"),
    ],
)
def test_a_hostile_or_foreign_maintenance_event_is_refused(change: str, code: str) -> None:
    parsed = parse(json.dumps(hostile(change)), TRUST)
    assert not parsed.runs
    assert [r.code for r in parsed.refused] == [code]


def test_a_refused_event_does_not_spoil_its_neighbours_in_one_message() -> None:
    parsed = parse(json.dumps([hostile("foreign-topic"), pre()]), TRUST)
    assert len(parsed.runs) == 1
    assert len(parsed.refused) == 1


def test_only_trusted_resource_subscriptions_are_kept() -> None:
    other = "22222222-2222-2222-2222-222222222222"
    delivery = pre()
    delivery["data"]["resourceSubscriptionIds"] = [SUB.upper(), other]
    (run,) = parse(json.dumps(delivery), TRUST).runs
    assert run.subscriptions == (SUB,)
