"""The consumer's approve_when_ready with an agent of two prepare steps (issue 38): a node
that drains and then runs its prepare hook is ready once both succeeded, as its Hook records
say (PrepareSteps), not at the first of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge.policy.model import Action
from tests.component.consumer.test_core import E1, Rig
from tests.component.consumer.test_drains import N0, ONE_PER_POOL, names, nodes_rig, sent
from tests.support.records import assert_valid

STEPS = ["drain", "hook"]


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Rig]:
    made = nodes_rig(tmp_path / "fleet.db", Action("approve_when_ready"), ONE_PER_POOL)
    yield made
    made.store.close()


def hook(rig: Rig, exit_code: int) -> dict[str, Any]:
    """The prepare hook's record, after the drain, of an agent with both steps."""
    record = rig.fleet.hook_ready(N0, E1)
    record.update(RecordId=f"hook-{exit_code}-{rig.fleet.now.isoformat()}", HookName=None,
                  HookExitCode=exit_code, HookOutput="hook", PrepareSteps=STEPS)  # fmt: skip
    assert_valid(record)
    return record


def drained(rig: Rig) -> dict[str, Any]:
    record = rig.fleet.drain(N0, E1, "Drained", exit_code=0)
    record["PrepareSteps"] = STEPS
    assert_valid(record)
    return record


def test_a_node_with_a_drain_and_a_hook_is_approved_once_both_succeeded(pool: Rig) -> None:
    rig = pool
    rig.consumer.process([rig.fleet.event(N0, E1)])
    assert names(rig, sent(rig, "Prepare")) == [N0]
    rig.fleet.advance(20)
    rig.consumer.process([drained(rig)])
    assert sent(rig, "Approve") == []  # drained, the hook still to run
    rig.fleet.advance(5)
    rig.consumer.process([hook(rig, 0)])
    assert names(rig, sent(rig, "Approve")) == [N0]


def test_a_hook_that_fails_after_the_drain_leaves_the_node_unready(pool: Rig) -> None:
    rig = pool
    rig.consumer.process([rig.fleet.event(N0, E1)])
    rig.fleet.advance(20)
    rig.consumer.process([drained(rig)])
    rig.fleet.advance(5)
    rig.consumer.process([hook(rig, 3)])
    rig.consumer.tick()
    assert sent(rig, "Approve") == []


def test_an_agent_that_names_one_step_is_ready_on_its_one_success(pool: Rig) -> None:
    rig = pool
    rig.consumer.process([rig.fleet.event(N0, E1)])
    rig.fleet.advance(20)
    record = drained(rig)
    record["PrepareSteps"] = ["drain"]
    rig.consumer.process([record])
    assert names(rig, sent(rig, "Approve")) == [N0]


def test_a_drained_node_waiting_for_its_hook_is_explained_as_such(pool: Rig) -> None:
    rig = pool
    rig.consumer.process([rig.fleet.event(N0, E1)])
    rig.fleet.advance(20)
    rig.consumer.process([drained(rig)])
    reason = rig.decisions[-1]["DecisionReason"]
    assert f"prepare hook not yet succeeded after the drain on {N0}" in reason, reason
    assert "drain not finished" not in reason, reason
