"""Fuzzing Event Grid's deliveries at the consumer (issue 36): whatever a sender to the hub
puts there, `eventgrid.parse` returns what it took, left aside and refused, and never raises
(an exception would fail the batch, retried for ever: one bad delivery would stall its
partition), and every Event record it returns is valid against the record schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from bridge.consumer import validation
from bridge.consumer.sources.eventgrid import Trust, parse
from tests.fuzz.strategies import DEEP_JSON, FUZZ, NASTY_TEXT, json_values, mutations

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "eventgrid"
SUB = "8d5f9c8e-1111-4222-8333-444455556666"
TRUST = Trust(frozenset({SUB}), health=True)


def samples() -> list[bytes]:
    return [path.read_bytes() for path in sorted(SAMPLES.glob("*.json"))]


def sample(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SAMPLES / name).read_text(encoding="utf-8"))
    return loaded


def near(delivery: dict[str, Any], changes: dict[str, Any]) -> str:
    """`delivery` with some of its resource's properties replaced."""
    properties = delivery["data"]["resourceInfo"]["properties"]
    properties.update(changes)
    return json.dumps(delivery)


PROPERTY_NAMES = st.sampled_from(
    ["EventId", "EventStatus", "EventType", "Resources", "NotBefore", "DurationInSeconds",
     "resources", "eventstatus", "targetResourceId", "availabilityState", "occurredTime"]
)  # fmt: skip


def check(body: str) -> None:
    parsed = parse(body, TRUST)
    for record in parsed.events:
        assert validation.problem(dict(record)) is None, record
    for change in parsed.health:
        assert change.state in ("Available", "Unavailable", "Degraded")
        change.resource.id.encode("utf-8")  # it keys a document in the fleet state


@FUZZ
@given(st.sampled_from(sorted(p.name for p in SAMPLES.glob("*.json"))),
       st.dictionaries(PROPERTY_NAMES, json_values | NASTY_TEXT, max_size=4))  # fmt: skip
@example("scheduled-vmss-eventgrid-schema.json", {"EventType": "\ud800"})
@example("scheduled-vmss-eventgrid-schema.json", {"Resources": ["web_\ud800"]})
@example("scheduled-vmss-eventgrid-schema.json", {"DurationInSeconds": 2**80})
@example("health-vm-cloudevents.json", {"targetResourceId": "/subscriptions/8d5f9c8e-1111-4222-"
         "8333-444455556666/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/\ud800",
         "availabilityState": "Unavailable"})  # fmt: skip
def test_a_delivery_near_a_real_one_never_breaks_the_parser(
    name: str, changes: dict[str, Any]
) -> None:
    check(near(sample(name), changes))


@FUZZ
@given(mutations(samples()))
@example(DEEP_JSON[0].encode())
@example(DEEP_JSON[1].encode())
def test_mutated_bytes_never_break_the_parser(body: bytes) -> None:
    check(body.decode("utf-8", errors="backslashreplace"))


@FUZZ
@given(json_values)
def test_any_json_never_breaks_the_parser(value: Any) -> None:
    check(json.dumps(value))
