"""Fuzzing what IMDS sends: Scheduled Events bodies and instance metadata.

Property: whatever the bytes, the agent's path (JSON decode, then the normaliser) yields valid
records or a problem, and instance metadata yields a VmIdentity or a RetryableError; no other
exception, no hang.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import requests
from hypothesis import example, given
from hypothesis import strategies as st

from bridge.agent import imds
from bridge.agent.document import DocumentError, parse_document
from bridge.agent.normalise import Context, normalise
from bridge.imdstime import parse_time
from bridge.records import Origin, VmIdentity
from bridge.retry import RetryableError
from tests.doubles.imds_transport import SessionTransport
from tests.fuzz.strategies import (
    DEEP_JSON,
    FUZZ,
    NASTY_TEXT,
    as_json_bytes,
    json_values,
    mutations,
    seed_bodies,
)
from tests.support.records import assert_valid

SEEDS = seed_bodies()
ORIGIN = Origin(
    VmIdentity(vm_id="0000000c-0000-4000-8000-000000000003", vm_name="WestNO_0"), host_name="h"
)
T0 = datetime(2022, 4, 11, 22, 10, tzinfo=timezone.utc)

# Near the real shape: the seeds' events with any field replaced by anything.
_FIELDS = ("EventId", "EventType", "ResourceType", "Resources", "EventStatus", "NotBefore",
           "Description", "EventSource", "DurationInSeconds")  # fmt: skip
near_events = st.dictionaries(st.sampled_from(_FIELDS), json_values | NASTY_TEXT, max_size=9)
near_documents = st.fixed_dictionaries(
    {"DocumentIncarnation": json_values | NASTY_TEXT, "Events": st.lists(near_events, max_size=4)}
)
bodies = (
    mutations(SEEDS)
    | st.binary(max_size=300)
    | json_values.map(as_json_bytes)
    | near_documents.map(as_json_bytes)
)


def decode(body: bytes) -> Any:
    """As the agent decodes a body (bridge.agent.loop Agent._observe): not JSON is skipped."""
    try:
        return json.loads(body)
    except ValueError:
        return None


@FUZZ
@given(first=bodies, second=bodies, gap=st.floats(0, 100_000))
@example(first=SEEDS[0], second=b'{"DocumentIncarnation": "--5", "Events": []}', gap=1.0)
@example(first=SEEDS[0], second=b'{"DocumentIncarnation": "\\u00b2", "Events": []}', gap=1.0)
@example(first=SEEDS[0], second=b'{"DocumentIncarnation": "' + b"9" * 5000 + b'", "Events": []}',
         gap=1.0)  # fmt: skip
@example(first=SEEDS[0], second=b'{"DocumentIncarnation": 0, "Events": [{"EventId": "\\ud800"}]}',
         gap=1.0)  # fmt: skip
def test_any_two_bodies_in_a_row_give_valid_records_or_problems(
    first: bytes, second: bytes, gap: float
) -> None:
    state: dict[str, Any] | None = None
    now = T0
    for body in (first, second):
        result = normalise(state, decode(body), Context(now, ORIGIN, boot_id="b1"))
        for record in result.records:
            assert_valid(record)
        assert all(isinstance(p, str) and p for p in result.problems)
        state = json.loads(json.dumps(result.state))  # the spool stores it as JSON
        now += timedelta(seconds=gap)


@FUZZ
@given(raw=json_values | near_documents)
def test_parse_document_raises_only_document_error(raw: Any) -> None:
    try:
        parsed = parse_document(raw)
    except DocumentError as err:
        problem = str(err)
    else:
        assert isinstance(parsed.incarnation, int)
        assert len({e.key for e in parsed.events}) == len(parsed.events)
        return
    assert problem


@FUZZ
@given(text=st.text(max_size=60) | NASTY_TEXT | json_values)
def test_not_before_parses_to_an_aware_utc_time_or_none(text: Any) -> None:
    moment = parse_time(text)
    assert moment is None or moment.utcoffset() == timedelta(0)


# --- instance metadata -------------------------------------------------------------------

_COMPUTE = ("vmId", "name", "resourceId", "subscriptionId", "resourceGroupName", "location",
            "zone", "vmScaleSetName", "platformFaultDomain", "platformUpdateDomain", "tagsList",
            "tags")  # fmt: skip
tag_lists = st.lists(
    st.dictionaries(st.sampled_from(["name", "value"]), json_values | NASTY_TEXT, max_size=2)
    | json_values,
    max_size=4,
)
computes = st.dictionaries(
    st.sampled_from(_COMPUTE), json_values | NASTY_TEXT | tag_lists, max_size=len(_COMPUTE)
)
instances = st.fixed_dictionaries({"compute": computes}) | st.dictionaries(
    st.text(max_size=8), json_values, max_size=3
)

INT_OR_NONE = (int, type(None))


@FUZZ
@given(raw=instances)
@example(raw={"compute": {"platformFaultDomain": "--5"}})
@example(raw={"compute": {"platformUpdateDomain": "²"}})
@example(raw={"compute": {"platformFaultDomain": "9" * 5000}})
def test_instance_metadata_gives_an_identity_of_the_right_types(raw: dict[str, Any]) -> None:
    identity = imds.parse_instance(raw)
    assert isinstance(identity.platform_fault_domain, INT_OR_NONE)
    assert isinstance(identity.platform_update_domain, INT_OR_NONE)
    for value in (identity.vm_id, identity.vm_name, identity.zone, identity.vm_scale_set_name):
        assert value is None or (isinstance(value, str) and value == value.strip() and value)
    assert all(isinstance(k, str) and k and isinstance(v, str) for k, v in identity.tags)


class CannedSession(requests.Session):
    """Answers every request with one canned body, as a broken IMDS or a middlebox might."""

    def __init__(self, body: bytes, status: int = 200) -> None:
        super().__init__()
        self.body, self.status = body, status

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> Any:
        response = requests.Response()
        response.status_code, response._content = self.status, self.body
        response.url = str(url)
        return response


def instance_body(body: bytes) -> dict[str, Any] | None:
    session = CannedSession(body)
    client = imds.ImdsClient(
        "http://imds.invalid",
        max_rps=1e9,
        transport=SessionTransport("http://imds.invalid", session),
    )
    try:
        return client.instance_metadata()
    except RetryableError as err:
        problem = str(err)
    finally:
        client.close()
    assert problem
    return None


@FUZZ
@given(body=st.binary(max_size=200) | instances.map(as_json_bytes) | json_values.map(as_json_bytes))
@example(body=DEEP_JSON[0].encode())
@example(body=DEEP_JSON[1].encode())
def test_instance_metadata_body_is_an_object_or_a_retryable_error(body: bytes) -> None:
    data = instance_body(body)
    if data is not None:
        assert isinstance(data, dict)
        imds.parse_instance(data)


@pytest.mark.parametrize("body", DEEP_JSON, ids=["arrays", "objects", "unclosed"])
def test_deeply_nested_json_is_not_a_document(body: str) -> None:
    # json.loads raises RecursionError, not ValueError, on deep nesting; decoded in pieces
    # of the agent's own path it must still end as a problem, never an exception.
    with pytest.raises(RecursionError):
        json.loads(body)
