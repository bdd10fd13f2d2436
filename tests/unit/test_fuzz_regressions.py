"""Bugs the fuzz suite (tests/fuzz) found in parsers of outside input, one test each."""

from __future__ import annotations

import pytest

from bridge.agent import imds
from bridge.agent.document import DocumentError, parse_document
from bridge.consumer import documents as fleetstate
from bridge.policy.file import PolicyError, loads

RULES = "rules:\n  - {name: r, action: hold}\n"


@pytest.mark.parametrize("incarnation", ["--5", "²", "9" * 5000])
def test_an_incarnation_int_cannot_read_is_a_document_error(incarnation: str) -> None:
    with pytest.raises(DocumentError, match="DocumentIncarnation"):
        parse_document({"DocumentIncarnation": incarnation, "Events": []})


@pytest.mark.parametrize("domain", ["--5", "²", "9" * 5000])
def test_a_fault_domain_int_cannot_read_is_unknown(domain: str) -> None:
    identity = imds.parse_instance({"compute": {"platformFaultDomain": domain}})
    assert identity.platform_fault_domain is None


def test_deeply_nested_instance_metadata_is_a_retryable_error() -> None:
    from tests.fuzz.test_fuzz_imds import instance_body

    assert instance_body(b"[" * 100_000 + b"]" * 100_000) is None


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("version: 1\n" + RULES + "x: a\x00b\n", 4),
        ("version: 1\nrules: " + "[" * 5000 + "]" * 5000 + "\n", 1),
        ("version: " + "1" * 5000 + "\n" + RULES, 1),
        ("version: 1\nbudgets:\n  - {name: b, group: fleet, max_percent: 1" + "0" * 400 + "}\n"
         + RULES, 3),
        ("version: 1\nrules:\n  - name: r\n    action: {approve_when_ready: "
         "{deadline: 99999999999999999999h}}\n", 4),
        ("version: 1\nrules:\n  - name: r\n    action: {approve_when_ready: {deadline: ²}}\n", 4),
    ],
    ids=["nul", "deep", "huge-int", "huge-float", "huge-duration", "superscript-duration"],
)  # fmt: skip
def test_a_policy_yaml_cannot_hold_is_a_policy_error_with_its_line(text: str, line: int) -> None:
    with pytest.raises(PolicyError, match=rf"^p\.yaml:{line}: "):
        loads(text, "p.yaml")


def test_record_fields_of_the_wrong_type_are_not_folded_into_the_fleet_state() -> None:
    value: fleetstate.EventDocument = {}
    record = {"RecordType": "Event", "VmId": "v", "TimeGenerated": "2026-01-01T00:00:00Z",
              "EventId": ["x"], "Resources": [["web_0"], "web_1"], "EventStatus": ["Started"],
              "DurationInSeconds": True, "EventType": 5}  # fmt: skip
    fleetstate.merge_event(value, record)
    assert value["event_id"] is None
    assert value["resources"] == ["web_1"]
    assert value["duration"] is None
    assert value["event_type"] is None
    assert fleetstate.status(value) == fleetstate.GONE


@pytest.mark.parametrize("field", ["EventId", "Description", "EventType", "Resources"])
def test_text_that_is_not_unicode_is_kept_with_a_replacement_and_a_problem(field: str) -> None:
    # JSON lets "\ud800" through (an unpaired surrogate); UTF-8 cannot carry it, so the
    # EventId crashed the normaliser (uuid5) and any other field made the record one the
    # consumer refuses. The event is kept, its text with U+FFFD, and the problem is said.
    from bridge.agent.normalise import Context, normalise
    from tests.support.records import ORIGIN, T0, assert_valid

    event: dict[str, object] = {"EventId": "e1", "EventType": "Reboot", "EventStatus": "Scheduled"}
    event[field] = ["web\ud800"] if field == "Resources" else "x\ud800y"
    result = normalise(None, {"DocumentIncarnation": 1, "Events": [event]}, Context(T0, ORIGIN))
    [record] = result.records
    assert_valid(record)
    assert "\ufffd" in str(record[field])  # type: ignore[literal-required]
    for value in record.values():
        str(value).encode("utf-8")  # every text is Unicode now
    assert any("not valid Unicode" in p for p in result.problems), result.problems
