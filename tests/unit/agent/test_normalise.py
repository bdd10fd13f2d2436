"""The normaliser, fed with the seeds' real documents and every messy shape IMDS has sent."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from bridge import recordtypes as rt
from bridge.agent.normalise import Context, NormaliserState, Result, empty_state, normalise
from bridge.records import Origin, VmIdentity
from tests.support.records import assert_valid, seed

T0 = datetime(2022, 4, 11, 22, 10, 0, tzinfo=timezone.utc)
EVENT_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"


def origin(name: str | None = "WestNO_0") -> Origin:
    return Origin(
        VmIdentity(vm_id="0000000a-0000-4000-8000-000000000001" if name else None, vm_name=name),
        host_name="host-a",
    )


def run(
    docs: list[Any], *, name: str | None = "WestNO_0", step: float = 1.0
) -> list[list[rt.Event]]:
    """Feed documents one poll apart; the records each produced, each checked against the schema."""
    state: NormaliserState | None = None
    out = []
    for i, doc in enumerate(docs):
        result = normalise(state, doc, Context(T0 + timedelta(seconds=i * step), origin(name)))
        for record in result.records:
            assert_valid(record)
        out.append(result.records)
        state = result.state
    return out


def event(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "EventId": "e1",
        "EventStatus": "Scheduled",
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["WestNO_0"],
        "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
        "Description": "Host server is undergoing maintenance.",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not _DROP}


_DROP: Any = object()


def doc(incarnation: Any, *events: dict[str, Any]) -> dict[str, Any]:
    return {"DocumentIncarnation": incarnation, "Events": list(events)}


def transitions(batches: list[list[rt.Event]]) -> list[list[str]]:
    return [[r["Transition"] for r in batch] for batch in batches]


# --- the seeds' live-migration sequence -----------------------------------------------------


def seed_sequence() -> list[Any]:
    return [seed(f"live_migration_{i}.json") for i in range(1, 5)]


def test_seed_sequence_gives_scheduled_started_completed() -> None:
    batches = run(seed_sequence())
    assert transitions(batches) == [[], ["Scheduled"], ["Started"], ["Completed"]]
    scheduled, started, completed = batches[1][0], batches[2][0], batches[3][0]
    assert scheduled["NotBefore"] == "2022-04-11T22:26:58.000Z"
    assert scheduled["NotBeforeRaw"] == "Mon, 11 Apr 2022 22:26:58 GMT"
    assert scheduled["EventId"] == EVENT_ID
    assert scheduled["Resources"] == ["WestNO_0", "WestNO_1"]
    assert scheduled["DurationInSeconds"] == 5
    assert (scheduled["EventStatus"], scheduled["PreviousStatus"]) == ("Scheduled", None)
    assert (started["EventStatus"], started["PreviousStatus"]) == ("Started", "Scheduled")
    assert (started["NotBefore"], started["NotBeforeRaw"]) == (None, "")
    assert (completed["EventStatus"], completed["PreviousStatus"]) == (None, "Started")
    assert [r["DocumentIncarnation"] for r in (scheduled, started, completed)] == [2, 3, 4]
    assert [r["PreviousIncarnation"] for r in (scheduled, started, completed)] == [1, 2, 3]
    assert not any(r["Inferred"] for r in (scheduled, started, completed))
    assert all(r["AffectsThisVm"] is True for r in (scheduled, started, completed))


def test_time_generated_is_observation_time_not_notbefore() -> None:
    batches = run(seed_sequence())
    assert batches[1][0]["TimeGenerated"] == "2022-04-11T22:10:01.000Z"


@pytest.mark.parametrize(
    ("name", "affects"),
    [("WestNO_1", True), ("westno_1", True), ("WestNO_2", False), (None, None)],
)
def test_affects_this_vm(name: str | None, affects: bool | None) -> None:
    batches = run(seed_sequence(), name=name)
    assert batches[1][0]["AffectsThisVm"] is affects


@pytest.mark.parametrize("listed", ["web_3", "_web_3", "WEB_3"])
def test_scale_set_instance_names_match(listed: str) -> None:
    batches = run([doc(1, event(Resources=[listed]))], name="web_3")
    assert batches[0][0]["AffectsThisVm"] is True


def test_unchanged_document_yields_nothing() -> None:
    d = doc(2, event())
    assert transitions(run([d, copy.deepcopy(d), copy.deepcopy(d)])) == [["Scheduled"], [], []]


def test_record_ids_are_deterministic_and_distinct() -> None:
    first, second = run(seed_sequence()), run(seed_sequence())
    ids = [r["RecordId"] for batch in first for r in batch]
    assert ids == [r["RecordId"] for batch in second for r in batch]
    assert len(set(ids)) == 3


# --- transitions --------------------------------------------------------------------------

TRANSITION_CASES = {
    "canceled while scheduled": (
        [doc(1, event()), doc(2)],
        [["Scheduled"], ["Canceled"]],
    ),
    "hardware failure appears directly as started": (
        [doc(1), doc(2, event(EventStatus="Started", NotBefore=""))],
        [[], ["Started"]],
    ),
    "notbefore moved": (
        [doc(1, event()), doc(2, event(NotBefore="Mon, 11 Apr 2022 23:00:00 GMT"))],
        [["Scheduled"], ["Updated"]],
    ),
    "reformatted notbefore is no change": (
        [doc(1, event()), doc(2, event(NotBefore="2022-04-11T22:26:58Z"))],
        [["Scheduled"], []],
    ),
    "two events in one document": (
        [doc(1), doc(2, event(), event(EventId="e2", EventType="Freeze")), doc(3)],
        [[], ["Scheduled", "Scheduled"], ["Canceled", "Canceled"]],
    ),
    "incarnation goes backwards (24-hour reset): diff by EventId": (
        [doc(57, event()), doc(1, event()), doc(2, event(EventStatus="Started", NotBefore=""))],
        [["Scheduled"], [], ["Started"]],
    ),
    "skipped incarnations still diff correctly": (
        [doc(2), doc(4, event(EventStatus="Started", NotBefore="")), doc(9)],
        [[], ["Started"], ["Completed"]],
    ),
    "same EventId twice: the started one wins": (
        [doc(1, event(), event(EventStatus="Started", NotBefore=""))],
        [["Started"]],
    ),
    "status back from started to scheduled is an update": (
        [doc(1, event(EventStatus="Started")), doc(2, event())],
        [["Started"], ["Updated"]],
    ),
}


@pytest.mark.parametrize(("docs", "expected"), TRANSITION_CASES.values(), ids=TRANSITION_CASES)
def test_transitions(docs: list[Any], expected: list[list[str]]) -> None:
    assert transitions(run(docs)) == expected


def test_updated_names_changed_fields() -> None:
    moved = event(NotBefore="Mon, 11 Apr 2022 23:00:00 GMT", Resources=["WestNO_0", "WestNO_9"])
    batches = run([doc(1, event()), doc(2, moved)])
    assert batches[1][0]["ChangedFields"] == ["Resources", "NotBefore"]


def test_dropped_from_resources_flips_affects_this_vm() -> None:
    batches = run([doc(1, event()), doc(2, event(Resources=["WestNO_1"]))])
    record = batches[1][0]
    assert record["ChangedFields"] == ["Resources", "AffectsThisVm"]
    assert record["AffectsThisVm"] is False


def test_canceled_carries_last_known_fields() -> None:
    record = run([doc(1, event()), doc(2)])[1][0]
    assert record["EventType"] == "Reboot"
    assert record["NotBefore"] == "2022-04-11T22:26:58.000Z"
    assert (record["EventStatus"], record["PreviousStatus"], record["Inferred"]) == (
        None,
        "Scheduled",
        False,
    )


# --- messy real-world documents ------------------------------------------------------------


def single(d: Any, name: str | None = "WestNO_0") -> rt.Event:
    records = run([d], name=name)[0]
    assert len(records) == 1
    return records[0]


def test_tabs_and_key_order() -> None:
    import json

    text = '{"Events":\t[{"NotBefore":"Mon, 11 Apr 2022 22:26:58 GMT",\t"EventId":"e1",'
    text += '"Resources":["WestNO_0"],"EventStatus":"Scheduled","EventType":"Freeze"}],'
    text += '\t"DocumentIncarnation":\t7}'
    record = single(json.loads(text))
    assert (record["EventType"], record["DocumentIncarnation"]) == ("Freeze", 7)


def test_empty_resources() -> None:
    record = single(doc(1, event(Resources=[])))
    assert (record["Resources"], record["AffectsThisVm"]) == ([], False)


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ("Mon, 11 Apr 2022 22:26:58 GMT", "2022-04-11T22:26:58.000Z"),
        ("Fri, 11 Apr 2022 22:26:58 GMT", "2022-04-11T22:26:58.000Z"),  # wrong weekday
        ("11 Apr 2022 22:26:58 GMT", "2022-04-11T22:26:58.000Z"),
        ("2016-09-19T18:29:47Z", "2016-09-19T18:29:47.000Z"),
        ("2016-09-19T18:29:47.123+02:00", "2016-09-19T16:29:47.123Z"),
        ("2016-09-19T18:29:47", "2016-09-19T18:29:47.000Z"),
        ("", None),
        ("next tuesday", None),
        ("Mon, 31 Feb 2022 22:26:58 GMT", None),
    ],
)
def test_notbefore_formats(raw: str, parsed: str | None) -> None:
    record = single(doc(1, event(NotBefore=raw)))
    assert (record["NotBefore"], record["NotBeforeRaw"]) == (parsed, raw)


def test_missing_notbefore() -> None:
    record = single(doc(1, event(NotBefore=_DROP)))
    assert (record["NotBefore"], record["NotBeforeRaw"]) == (None, None)


def test_2017_shape_from_the_seeds() -> None:
    record = single(seed("shape_2017.json"), name="FrontEnd_IN_0")
    assert record["DocumentIncarnation"] == 5
    assert (record["EventSource"], record["Description"], record["DurationInSeconds"]) == (
        None,
        None,
        None,
    )
    assert record["NotBefore"] == "2016-09-19T18:29:47.000Z"


def test_older_api_shape_after_newer_is_no_change() -> None:
    newer = event()
    older = event(EventSource=_DROP, Description=_DROP, DurationInSeconds=_DROP)
    assert transitions(run([doc(1, newer), doc(2, older)])) == [["Scheduled"], []]


def test_unknown_event_type_passes_through() -> None:
    assert single(doc(1, event(EventType="LiveResize")))["EventType"] == "LiveResize"


def test_string_duration_and_incarnation() -> None:
    record = single(doc("12", event(DurationInSeconds="9")))
    assert (record["DocumentIncarnation"], record["DurationInSeconds"]) == (12, 9)


def test_bad_event_entries_are_skipped_with_a_problem() -> None:
    d = doc(1, event(), {"EventType": "Reboot"}, "junk")  # type: ignore[arg-type]
    result = normalise(None, d, Context(T0, origin()))
    assert [r["EventId"] for r in result.records] == ["e1"]
    assert len(result.problems) == 2


@pytest.mark.parametrize(
    "body",
    [
        [],
        "x",
        None,
        42,
        {"DocumentIncarnation": "x", "Events": []},
        {"DocumentIncarnation": True, "Events": []},
        {"Events": []},
        {"DocumentIncarnation": 1},
        {"DocumentIncarnation": 1, "Events": {}},
        {"error": "Bad request: . Required metadata header not specified"},
    ],
)
def test_not_a_document_keeps_state_and_says_why(body: Any) -> None:
    before = normalise(None, doc(3, event()), Context(T0, origin())).state
    result = normalise(before, body, Context(T0 + timedelta(seconds=1), origin()))
    assert result.records == []
    assert result.state == before
    assert result.problems
    assert result.problems[0].startswith("not a Scheduled Events document")


def test_malformed_saved_state_is_ignored() -> None:
    result = normalise({"events": {"x": {"EventId": 3}}}, doc(1, event()), Context(T0, origin()))
    assert [r["Transition"] for r in result.records] == ["Scheduled"]
    assert result.problems == ["ignored 1 malformed event(s) in the saved state"]


# --- restarts, reboots and gaps: inferred transitions ---------------------------------------


def after_restart(
    first: Any, second: Any, *, downtime: float, boots: tuple[str, str] = ("b1", "b1")
) -> Result:
    state = normalise(None, first, Context(T0, origin(), boot_id=boots[0])).state
    later = T0 + timedelta(seconds=downtime)
    return normalise(state, second, Context(later, origin(), boot_id=boots[1]))


def one(result: Result) -> tuple[str, bool]:
    assert len(result.records) == 1
    assert_valid(result.records[0])
    return result.records[0]["Transition"], result.records[0]["Inferred"]


SOON = "Mon, 11 Apr 2022 22:15:00 GMT"  # 5 min after T0
LATER = "Mon, 11 Apr 2022 23:59:00 GMT"

INFERENCE_CASES = {
    "reboot scheduled, machine rebooted, gone: completed": (
        event(NotBefore=LATER), 60, ("b1", "b2"), ("Completed", True)),
    "freeze scheduled, machine rebooted, notbefore ahead: canceled, unsure": (
        event(EventType="Freeze", NotBefore=LATER), 60, ("b1", "b2"), ("Canceled", True)),
    "agent down across notbefore: completed": (
        event(NotBefore=SOON), 600, ("b1", "b1"), ("Completed", True)),
    "agent down, notbefore still ahead: canceled, unsure": (
        event(NotBefore=LATER), 600, ("b1", "b1"), ("Canceled", True)),
    "short restart, notbefore ahead: canceled": (
        event(NotBefore=LATER), 5, ("b1", "b1"), ("Canceled", False)),
    "started, agent down, gone: completed, inferred": (
        event(EventStatus="Started", NotBefore=""), 600, ("b1", "b1"), ("Completed", True)),
    "started, short restart, gone: completed": (
        event(EventStatus="Started", NotBefore=""), 5, ("b1", "b1"), ("Completed", False)),
}  # fmt: skip


@pytest.mark.parametrize(
    ("ev", "downtime", "boots", "expected"), INFERENCE_CASES.values(), ids=INFERENCE_CASES
)
def test_inference_across_restarts(
    ev: dict[str, Any], downtime: float, boots: tuple[str, str], expected: tuple[str, bool]
) -> None:
    assert one(after_restart(doc(4, ev), doc(5), downtime=downtime, boots=boots)) == expected


def test_skipped_incarnations_past_notbefore_infer_completion() -> None:
    result = after_restart(doc(4, event(NotBefore=SOON)), doc(7), downtime=400)
    assert one(result) == ("Completed", True)


def test_reboot_of_another_vm_is_not_evidence() -> None:
    other = event(NotBefore=LATER, Resources=["WestNO_1"])
    assert one(after_restart(doc(4, other), doc(5), downtime=60, boots=("b1", "b2"))) == (
        "Canceled",
        True,
    )


def test_state_round_trips_through_json() -> None:
    import json

    state = normalise(None, doc(1, event()), Context(T0, origin())).state
    restored = json.loads(json.dumps(state))
    result = normalise(restored, doc(1, event()), Context(T0, origin()))
    assert result.records == []
    assert result.problems == []


def test_empty_state_shape() -> None:
    assert empty_state()["events"] == {}


@pytest.mark.parametrize(
    ("listed", "affects"),
    [(["HOST-A"], True), (["other", "host-a"], True), (["_host-a"], True), (["other"], None)],
)
def test_without_a_vm_name_the_host_name_recognises_this_vm_but_never_rules_it_out(
    listed: list[str], affects: bool | None
) -> None:
    """An IMDS with no instance metadata: a scale-set instance's host name differs from its
    instance name, so a miss says nothing (null), while a match is this VM."""
    [[record]] = run([doc(1, event(Resources=listed))], name=None)
    assert record["AffectsThisVm"] is affects
    assert record["VmId"] is None  # never guessed
