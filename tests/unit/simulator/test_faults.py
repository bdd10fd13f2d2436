"""The simulator's fault plan: settings, per-VM overrides and reproducible dice."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from bridge.simulator.faults import (
    NOT_DOCUMENT_BODIES,
    NOT_JSON_BODIES,
    FaultError,
    FaultPlan,
    Faults,
)


def statuses(plan: FaultPlan, vm: str, n: int = 400) -> Counter[int | None]:
    return Counter(plan.decide(vm, first_call=False).status for _ in range(n))


def test_no_faults_means_no_delay_no_error_and_no_corruption() -> None:
    decision = FaultPlan().decide("vm-0", first_call=True)
    assert (decision.delay, decision.status, decision.corrupt_body) == (0.0, None, None)


@pytest.mark.parametrize(
    ("key", "status"), [("rate429", 429), ("rate410", 410), ("rate500", 500), ("rate503", 503)]
)
def test_a_rate_of_one_fails_every_request_with_that_status(key: str, status: int) -> None:
    plan = FaultPlan()
    plan.set({key: 1.0})
    assert statuses(plan, "vm-0", 50) == Counter({status: 50})


def test_rates_are_roughly_honoured_and_repeat_for_a_seed() -> None:
    def run(seed: int) -> list[int | None]:
        plan = FaultPlan(Faults(rate_503=0.25, rate_429=0.25), seed=seed)
        return [plan.decide("vm-0", first_call=False).status for _ in range(400)]

    counts = Counter(run(3))
    assert 60 < counts[503] < 140
    assert 60 < counts[429] < 140
    assert run(3) == run(3) != run(4)


def test_per_vm_faults_override_only_that_vm() -> None:
    plan = FaultPlan(Faults(latency=0.5))
    plan.set({"rate503": 1.0, "latency": 2.0}, vm="web_0")
    assert statuses(plan, "web_0", 20) == Counter({503: 20})
    assert statuses(plan, "web_1", 20) == Counter({None: 20})
    assert plan.decide("web_0", first_call=False).delay == 2.0
    assert plan.decide("web_1", first_call=False).delay == 0.5
    assert plan.snapshot()["perVm"] == {"web_0": {"rate503": 1.0, "latency": 2.0}}
    plan.clear("web_0")
    assert statuses(plan, "web_0", 20) == Counter({None: 20})


def test_the_first_call_delay_adds_to_the_latency() -> None:
    plan = FaultPlan(Faults(latency=0.25, first_call_delay=3.0))
    assert plan.decide("vm-0", first_call=True).delay == 3.25
    assert plan.decide("vm-0", first_call=False).delay == 0.25


def test_retry_after_is_carried_with_the_decision() -> None:
    plan = FaultPlan(Faults(rate_429=1.0, retry_after=7))
    assert plan.decide("vm-0", first_call=False).retry_after == 7


@pytest.mark.parametrize(
    ("key", "bodies"), [("rateNotJson", NOT_JSON_BODIES), ("rateNotDocument", NOT_DOCUMENT_BODIES)]
)
def test_corrupt_bodies_come_from_their_family(key: str, bodies: tuple[bytes, ...]) -> None:
    plan = FaultPlan()
    plan.set({key: 1.0})
    seen = {plan.decide("vm-0", first_call=False).corrupt_body for _ in range(60)}
    assert seen == set(bodies)


@pytest.mark.parametrize("body", NOT_JSON_BODIES)
def test_not_json_bodies_really_are_not_json(body: bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 (json raises a plain ValueError subclass)
        json.loads(body)


@pytest.mark.parametrize("body", NOT_DOCUMENT_BODIES)
def test_not_document_bodies_are_json_without_a_usable_document(body: bytes) -> None:
    value = json.loads(body)
    usable = (
        isinstance(value, dict)
        and isinstance(value.get("DocumentIncarnation"), int)
        and isinstance(value.get("Events"), list)
    )
    assert not usable


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"rate999": 0.1}, "unknown fault 'rate999'"),
        ({"rate503": 1.5}, "out of range"),
        ({"latency": -1}, "out of range"),
        ({"rate503": "high"}, "must be a number"),
        ({"rate503": True}, "must be a number"),
        ({"rate503": 0.6, "rate500": 0.6}, "must not exceed 1"),
        ({"rateNotJson": 0.6, "rateNotDocument": 0.6}, "must not exceed 1"),
    ],
)
def test_bad_settings_are_refused_and_leave_the_plan_unchanged(
    changes: dict[str, Any], fragment: str
) -> None:
    plan = FaultPlan()
    with pytest.raises(FaultError, match=fragment):
        plan.set(changes)
    with pytest.raises(FaultError, match=fragment):
        plan.set(changes, vm="vm-0")
    assert plan.snapshot() == {"global": Faults().to_json(), "perVm": {}}


def test_snake_case_field_names_are_accepted_too() -> None:
    plan = FaultPlan()
    assert plan.set({"rate_503": 0.5, "first_call_delay": 2}).rate_503 == 0.5
    assert plan.snapshot()["global"]["firstCallDelay"] == 2
