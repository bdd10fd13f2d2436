"""A VM document's view, made for every heartbeat the consumer folds (FleetCache): made
without VmView's frozen __init__ (issue 40, a replay of a million records), it is the view
that __init__ makes, field for field."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.consumer import documents as fs
from bridge.policy.model import VmView
from bridge.records import parse_time

TEXT = st.none() | st.sampled_from(["", "web_0", "rg", "2026-11-21T10:00:00.000Z"])
DOCUMENTS = st.fixed_dictionaries(
    {},
    optional={
        "name": TEXT,
        "subscription_id": TEXT,
        "resource_group": TEXT,
        "location": TEXT,
        "zone": TEXT,
        "scale_set": TEXT,
        "fault_domain": st.none() | st.integers(0, 3),
        "update_domain": st.none() | st.integers(0, 3),
        "tags": st.none() | st.dictionaries(st.sampled_from(["a", "b"]), st.sampled_from(["x"])),
        "last_seen": TEXT,
        "heard": TEXT,
        "stopped": TEXT,
        "prepare_hook": st.none() | st.booleans(),
        "partition": TEXT,
        "node_name": TEXT,
        "node_pool": TEXT,
        "node_cordoned": st.none() | st.booleans(),
        "node_draining": TEXT,
        "resource_id": TEXT,
    },
)


@given(DOCUMENTS)
def test_the_view_is_the_one_init_makes(value: dict[str, Any]) -> None:
    view = fs.vm_view("vm-0", value)  # type: ignore[arg-type]
    expected = VmView(**vars(view))  # what __init__ makes of the same fields
    assert view == expected
    assert view.name == str(value.get("name") or "vm-0")
    assert view.last_seen == (
        None if value.get("stopped") else parse_time(value.get("heard") or value.get("last_seen"))
    )
    assert vars(view) == vars(expected)  # every field set, none beside
    assert [f.name for f in dataclasses.fields(view)] == list(vars(view))
    assert not hasattr(VmView, "__post_init__")


def test_the_view_is_frozen_and_made_without_init(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: VmView, *args: object, **kwargs: object) -> None:
        raise AssertionError("VmView.__init__ is most of a heartbeat's view")

    monkeypatch.setattr(VmView, "__init__", refuse)
    view = fs.vm_view("vm-0", {"name": "web_0", "last_seen": "2026-11-21T10:00:00.000Z"})
    assert view.name == "web_0"
    assert view.last_seen is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.name = "web_1"  # type: ignore[misc]
