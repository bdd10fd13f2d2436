"""Property tests: no document, however malformed, makes the normaliser raise or misreport."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.agent.normalise import Context, normalise
from bridge.records import Origin, VmIdentity
from tests.support.records import assert_valid

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)

anything = st.one_of(json_values, st.sampled_from(["Scheduled", "Started", "", "Reboot"]))
times = st.sampled_from(
    ["Mon, 11 Apr 2022 22:26:58 GMT", "Tue, 99 Foo 2022 99:99:99 GMT", "2016-09-19T18:29:47Z",
     "0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00", ""]
) | st.text(max_size=30)  # fmt: skip

events = st.fixed_dictionaries(
    {},
    optional={
        "EventId": st.sampled_from(["a", "A", "b", "c"]) | anything,
        "EventType": st.sampled_from(["Freeze", "Reboot", "Preempt"]) | anything,
        "ResourceType": anything,
        "Resources": st.lists(st.sampled_from(["vm0", "VM0", "_vm0", "vm1"]) | anything) | anything,
        "EventStatus": st.sampled_from(["Scheduled", "Started", "Completed"]) | anything,
        "NotBefore": times | anything,
        "Description": anything,
        "EventSource": anything,
        "DurationInSeconds": st.integers() | st.sampled_from(["9", "inf", "nan", "1e4"]) | anything,
    },
)

documents = (
    st.fixed_dictionaries(
        {},
        optional={
            "DocumentIncarnation": st.integers(-3, 2**70) | anything,
            "Events": st.lists(events | anything, max_size=5) | anything,
        },
    )
    | json_values
)


@settings(max_examples=400, deadline=None)
@given(
    docs=st.lists(documents, min_size=1, max_size=5),
    name=st.sampled_from(["vm0", None]),
    steps=st.lists(st.floats(0, 10_000), min_size=5, max_size=5),
    boots=st.lists(st.sampled_from(["b1", "b2", None]), min_size=5, max_size=5),
)
def test_no_document_makes_it_raise(
    docs: list[Any], name: str | None, steps: list[float], boots: list[str | None]
) -> None:
    origin = Origin(
        VmIdentity(vm_id="0000000b-0000-4000-8000-000000000002" if name else None, vm_name=name),
        host_name="h",
    )
    now = datetime(2022, 4, 11, tzinfo=timezone.utc)
    state: dict[str, Any] | None = None
    for doc, step, boot in zip(docs, steps, boots, strict=False):
        now += timedelta(seconds=step)
        result = normalise(state, doc, Context(now, origin, boot_id=boot))
        for record in result.records:
            assert_valid(record)
            json.dumps(record)
        state = json.loads(json.dumps(result.state))


@settings(max_examples=200, deadline=None)
@given(state=json_values, doc=documents)
def test_no_saved_state_makes_it_raise(state: Any, doc: Any) -> None:
    origin = Origin(VmIdentity(), host_name="h")
    result = normalise(state, doc, Context(datetime(2022, 1, 1, tzinfo=timezone.utc), origin))
    for record in result.records:
        assert_valid(record)
