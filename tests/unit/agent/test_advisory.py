"""Spot rebalance recommendations: taken out of the document, written as Advisory records."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

from bridge.agent.advisory import AdviceState, advise, not_served, restore, split
from bridge.agent.normalise import Context, normalise
from bridge.records import Origin, VmIdentity
from tests.support.records import assert_valid

T0 = datetime(2026, 12, 2, 19, 0, tzinfo=timezone.utc)
ORIGIN = Origin(
    VmIdentity(vm_id="0000000a-0000-4000-8000-000000000001", vm_name="spot_1"), host_name="h"
)
# The only public sample (OpenShift's termination handler tests, api-version 2024-07-09).
HANDLER_SAMPLE = (
    '{"DocumentIncarnation":0,"Events":[{"EventType":"SpotRebalanceRecommendation", '
    '"ResourceType": "VirtualMachine"}]}'
)
PREEMPT: dict[str, Any] = {
    "EventId": "7A3E0C71-2C5B-4B0E-9D59-F3A1D6C0B2A4",
    "EventStatus": "Scheduled",
    "EventType": "Preempt",
    "ResourceType": "VirtualMachine",
    "Resources": ["spot_1"],
    "NotBefore": "Wed, 02 Dec 2026 19:00:30 GMT",
    "Description": "",
    "EventSource": "Platform",
    "DurationInSeconds": -1,
}
RECOMMENDATION: dict[str, Any] = {
    **PREEMPT,
    "EventId": "5D0B7A4E-1111-4C3B-8E2A-0A9B8C7D6E5F",
    "EventType": "SpotRebalanceRecommendation",
    "NotBefore": "",
}


def doc(*events: dict[str, Any], incarnation: int = 1) -> dict[str, Any]:
    return {"DocumentIncarnation": incarnation, "Events": list(events)}


def test_split_takes_the_recommendation_out_and_leaves_the_preempt() -> None:
    rest, found = split(doc(RECOMMENDATION, PREEMPT))
    assert rest == doc(PREEMPT)
    assert found == [RECOMMENDATION]
    # The Preempt is an Event record on this very poll: the fast path is untouched.
    result = normalise(None, rest, Context(T0, ORIGIN))
    assert [(r["EventType"], r["Transition"]) for r in result.records] == [("Preempt", "Scheduled")]


def test_split_leaves_a_document_without_recommendations_as_it_is() -> None:
    raw = doc(PREEMPT)
    rest, found = split(raw)
    assert rest is raw
    assert found == []


def test_split_reads_any_case_and_leaves_what_is_no_document_to_the_normaliser() -> None:
    lower = {"documentincarnation": 2, "events": [{"eventtype": "spotrebalancerecommendation"}]}
    assert split(lower) == ({"documentincarnation": 2, "events": []}, lower["events"])
    nothing: list[object] = [None, [], "x", {"Events": "nope"}, {"DocumentIncarnation": 1}]
    for raw in nothing:
        assert split(raw) == (raw, [])


def test_raised_once_then_cleared_when_gone() -> None:
    first = advise({}, [RECOMMENDATION], ORIGIN, T0)
    again = advise(first.state, [RECOMMENDATION], ORIGIN, T0 + timedelta(seconds=1))
    gone = advise(again.state, [], ORIGIN, T0 + timedelta(seconds=2))
    assert [(r["EventId"], r["AdvisoryState"]) for r in first.records] == [
        (RECOMMENDATION["EventId"], "Raised")
    ]
    assert again.records == []
    assert [r["AdvisoryState"] for r in gone.records] == ["Cleared"]
    assert gone.state == {}
    for record in [*first.records, *gone.records]:
        assert_valid(record)
    raised = first.records[0]
    assert raised["AffectsThisVm"] is True
    assert raised["NotBefore"] is None
    assert raised["Source"] == "Agent"


def test_the_handler_sample_without_an_event_id_is_known_by_what_it_says() -> None:
    [entry] = split(json.loads(HANDLER_SAMPLE))[1]
    first = advise({}, [entry], ORIGIN, T0)
    again = advise(first.state, [dict(entry)], ORIGIN, T0 + timedelta(seconds=1))
    [raised] = first.records
    assert_valid(raised)
    assert raised["EventId"].startswith("digest-")
    assert raised["AffectsThisVm"] is None  # names no VM: taken as this VM's, maybe
    assert raised["Resources"] == []
    assert again.records == []


def test_a_replayed_observation_makes_the_same_record_ids() -> None:
    one = advise({}, [RECOMMENDATION], ORIGIN, T0)
    two = advise({}, [RECOMMENDATION], ORIGIN, T0)
    assert [r["RecordId"] for r in one.records] == [r["RecordId"] for r in two.records]


def test_a_recommendation_listed_twice_is_one_and_said() -> None:
    advice = advise({}, [RECOMMENDATION, RECOMMENDATION], ORIGIN, T0)
    assert len(advice.records) == 1
    assert len(advice.problems) == 1


def test_restore_drops_what_is_malformed() -> None:
    kept = advise({}, [RECOMMENDATION], ORIGIN, T0).state
    saved: Any = {**kept, "bad": {"EventId": 3}, "worse": "x"}
    assert restore(saved) == kept
    assert restore(None) == {}
    empty: AdviceState = {}
    assert restore([]) == empty


def test_an_api_version_not_served_is_a_400_or_a_404() -> None:
    assert not_served(400)
    assert not_served(404)
    assert not not_served(403)
    assert not not_served(410)
