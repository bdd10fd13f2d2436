"""InstanceMetadata: this VM's identity, refreshed when due, never traded for an answer that
is not metadata, and kept in the spool across a restart."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from bridge.agent.instance import IDENTITY_RETRY_SECONDS, InstanceMetadata
from bridge.outbox.spool import Spool
from bridge.retry import RetryableError

VM_ID = "02aab8a4-74ef-476e-8182-f6d2ba4166a6"
EVERY = 3600.0


def metadata(vm_id: str = VM_ID, name: str = "web_3") -> Callable[[], Mapping[str, Any]]:
    return lambda: {"compute": {"vmId": vm_id, "name": name, "vmScaleSetName": "web"}}


def unavailable() -> Mapping[str, Any]:
    raise RetryableError("IMDS answered 503")


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.spool = Spool(tmp_path / "spool.db", ["jsonl"])
        self.clock = [1000.0]
        self.stopping = False

    def instance(self, vm_name: str | None = None) -> InstanceMetadata:
        """A fresh one on this spool, as after a restart."""
        return InstanceMetadata(self.spool, host_name="host-a", vm_name=vm_name,
                                refresh_every=EVERY, stopping=lambda: self.stopping,
                                clock=lambda: self.clock[0])  # fmt: skip


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path)
    yield rig
    rig.spool.close()


def test_the_first_answer_names_the_vm_and_is_kept_across_a_restart(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    instance = rig.instance()
    assert not instance.origin.identity.known
    with caplog.at_level(logging.INFO, logger="bridge.agent.loop"):
        assert instance.refresh(metadata())
    assert (instance.origin.identity.vm_id, instance.origin.identity.vm_name) == (VM_ID, "web_3")
    assert instance.origin.host_name == "host-a"
    assert caplog.messages == [f"this VM is web_3 ({VM_ID})"]
    assert not instance.refresh(metadata())  # the same answer changes nothing
    assert rig.instance().origin == instance.origin


def test_a_refresh_is_due_after_refresh_every_and_a_retry_after_a_minute(rig: Rig) -> None:
    instance = rig.instance()
    assert instance.due(rig.clock[0])
    instance.refresh(metadata())
    assert not instance.due(rig.clock[0] + EVERY - 0.001)
    assert instance.due(rig.clock[0] + EVERY)
    instance.refresh(unavailable)
    assert not instance.due(rig.clock[0] + IDENTITY_RETRY_SECONDS - 0.001)
    assert instance.due(rig.clock[0] + IDENTITY_RETRY_SECONDS)


def test_unavailable_metadata_is_said_once_with_what_records_carry(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    instance = rig.instance()
    with caplog.at_level(logging.WARNING, logger="bridge.agent.loop"):
        assert not instance.refresh(unavailable)
        assert not instance.refresh(unavailable)
    # Only what this refresh said: a thread a test before this one left may log meanwhile.
    [said] = [m for m in caplog.messages if "instance metadata" in m]
    assert "instance metadata is unavailable (IMDS answered 503)" in said
    assert "records carry null VM fields" in said
    assert "set agent.vm_name" in said  # no name to match Resources with
    caplog.clear()
    instance.refresh(metadata())
    with caplog.at_level(logging.WARNING, logger="bridge.agent.loop"):
        instance.refresh(unavailable)  # a new streak: said again, with the identity kept
    [again] = [m for m in caplog.messages if "instance metadata" in m]
    assert f"records carry the identity last seen (web_3, {VM_ID})" in again
    assert "agent.vm_name" not in again


def test_nothing_is_said_while_the_agent_stops(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    rig.stopping = True
    with caplog.at_level(logging.WARNING, logger="bridge.agent.loop"):
        assert not rig.instance().refresh(unavailable)
    assert caplog.messages == []


def test_an_answer_that_is_not_this_vms_metadata_never_replaces_a_known_identity(
    rig: Rig,
) -> None:
    instance = rig.instance()
    instance.refresh(metadata())
    known = instance.origin
    answers: list[Mapping[str, Any]] = [
        {},
        {"compute": []},
        {"compute": {"vmId": "x/../y", "name": "evil"}},
    ]
    for answer in answers:
        assert not instance.refresh(lambda answer=answer: answer)  # type: ignore[misc]
        assert instance.origin == known


def test_agent_vm_name_names_a_vm_metadata_gives_no_name(rig: Rig) -> None:
    instance = rig.instance(vm_name="web-3")
    assert instance.refresh(metadata(name=""))
    assert instance.origin.identity.vm_name == "web-3"
    named = rig.instance(vm_name="other")
    assert named.origin.identity.vm_name == "web-3"  # the saved identity has its name
