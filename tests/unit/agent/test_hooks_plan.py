"""Which Event records call for a hook, the Hook record, and the platform choices of the runner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timezone
from typing import Any

import pytest
from jsonschema import Draft202012Validator, FormatChecker

from bridge import schema
from bridge.agent import hookproc
from bridge.agent.hookproc import HookOutcome, OutputTail
from bridge.agent.hooks import HookJob, hook_environment, hook_record, plan
from bridge.records import Origin, RecordView, VmIdentity, record_id
from tests.support.records import common_fields, event_record

T0 = datetime(2022, 4, 11, 22, 10, 0, tzinfo=timezone.utc)
EVENT_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
ORIGIN = Origin(
    VmIdentity(vm_id="0000000a-0000-4000-8000-000000000001", vm_name="WestNO_0"), host_name="host-a"
)
VALIDATOR = Draft202012Validator(schema.load(), format_checker=FormatChecker())


def assert_valid(record: RecordView) -> None:
    errors = [f"{list(e.path)}: {e.message}" for e in VALIDATOR.iter_errors(record)]
    assert not errors, "\n".join(errors)


def event(
    transition: str,
    *,
    previous: str | None = None,
    affects: bool | None = True,
    changed: tuple[str, ...] = (),
    rid: str = "rec-1",
) -> dict[str, Any]:
    """An Event record as the normaliser writes it (checked against the schema)."""
    record = event_record(transition, previous=previous, affects=affects, changed=changed, rid=rid)
    assert_valid(record)
    return record


ATV = ("AffectsThisVm",)

# (name, record, the phase it calls for)
PLAN_CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("scheduled affects us", event("Scheduled"), "prepare"),
    ("scheduled, vm name unknown", event("Scheduled", affects=None), "prepare"),
    ("scheduled for other vms", event("Scheduled", affects=False), None),
    ("first seen as started", event("Started"), "prepare"),
    ("first seen as started, name unknown", event("Started", affects=None), "prepare"),
    ("first seen as started, other vms", event("Started", affects=False), None),
    ("scheduled then started", event("Started", previous="Scheduled"), None),
    ("completed", event("Completed", previous="Started"), "recover"),
    ("completed, name unknown", event("Completed", previous="Started", affects=None), "recover"),
    ("completed for other vms", event("Completed", previous="Started", affects=False), None),
    ("canceled", event("Canceled", previous="Scheduled"), "recover"),
    ("canceled, name unknown", event("Canceled", previous="Scheduled", affects=None), "recover"),
    ("canceled for other vms", event("Canceled", previous="Scheduled", affects=False), None),
    ("resources now include us", event("Updated", previous="Scheduled", changed=ATV), "prepare"),
    (
        "resources no longer include us",
        event("Updated", previous="Scheduled", affects=False, changed=ATV),
        "recover",
    ),
    (
        "vm name became unknown",
        event("Updated", previous="Scheduled", affects=None, changed=ATV),
        None,
    ),
    (
        "notbefore moved",
        event("Updated", previous="Scheduled", changed=("NotBefore", "NotBeforeRaw")),
        None,
    ),
    (
        "resources changed, still ours",
        event("Updated", previous="Scheduled", changed=("Resources",)),
        None,
    ),
]


@pytest.mark.parametrize(
    ("record", "phase"), [c[1:] for c in PLAN_CASES], ids=[c[0] for c in PLAN_CASES]
)
def test_plan_rules(record: dict[str, Any], phase: str | None) -> None:
    jobs = plan([record], prepare=True, recover=True)
    assert [j.phase for j in jobs] == ([phase] if phase else [])
    for job in jobs:
        assert job.trigger == record
        assert job.job_id == record_id(record["RecordId"], phase)


@pytest.mark.parametrize(
    ("prepare", "recover", "expected"),
    [
        (True, True, ["prepare", "recover"]),
        (True, False, ["prepare"]),
        (False, True, ["recover"]),
        (False, False, []),
    ],
)
def test_plan_only_configured_hooks(prepare: bool, recover: bool, expected: list[str]) -> None:
    records = [event("Scheduled", rid="a"), event("Completed", previous="Started", rid="b")]
    jobs = plan(records, prepare=prepare, recover=recover)
    assert [j.phase for j in jobs] == expected


def test_plan_ignores_other_record_types() -> None:
    heartbeat = common_fields(ORIGIN, "Heartbeat", "hb-1", T0)
    hook = {**event("Scheduled"), "RecordType": "Hook"}
    assert plan([heartbeat, hook, {}], prepare=True, recover=True) == []


def test_plan_one_job_per_record_and_phase() -> None:
    first = event("Scheduled", rid="a")
    jobs = plan([first, dict(first), event("Scheduled", rid="b")], prepare=True, recover=True)
    assert [j.trigger["RecordId"] for j in jobs] == ["a", "b"]


def test_plan_skips_event_without_record_id() -> None:
    record = event("Scheduled")
    del record["RecordId"]
    assert plan([record], prepare=True, recover=True) == []


def test_job_ids_are_deterministic_and_distinct() -> None:
    again = plan([event("Scheduled")], prepare=True, recover=True)
    assert again == plan([event("Scheduled")], prepare=True, recover=True)
    other = plan([event("Scheduled", rid="rec-2")], prepare=True, recover=True)
    assert again[0].job_id != other[0].job_id
    assert len({again[0], other[0]}) == 2  # hashable despite the dict trigger


def test_payload_round_trip_through_json() -> None:
    job = plan([event("Completed", previous="Started")], prepare=True, recover=True)[0]
    payload = json.loads(json.dumps(job.to_payload()))
    assert HookJob.from_payload(payload) == job


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"job_id": "j", "phase": "drain", "trigger": {}},
        {"job_id": 1, "phase": "prepare", "trigger": {}},
        {"job_id": "j", "phase": "prepare", "trigger": []},
    ],
)
def test_from_payload_rejects_garbage(payload: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="not a hook job payload"):
        HookJob.from_payload(payload)


OUTCOMES = [
    HookOutcome(0, False, 1200, "drained\n", None),
    HookOutcome(3, False, 15, "boom", None),
    HookOutcome(None, True, 30000, "", None),
    HookOutcome(None, False, 0, "", "hook command not found: /opt/drain"),
]


@pytest.mark.parametrize("outcome", OUTCOMES)
@pytest.mark.parametrize("phase_record", ["prepare", "recover"])
def test_hook_record_matches_schema(outcome: HookOutcome, phase_record: str) -> None:
    trigger = (
        event("Scheduled") if phase_record == "prepare" else event("Canceled", previous="Scheduled")
    )
    job = plan([trigger], prepare=True, recover=True)[0]
    record = hook_record(ORIGIN, job, outcome, T0)
    assert_valid(record)
    assert record["RecordType"] == "Hook"
    assert record["HookPhase"] == phase_record
    assert record["TriggerRecordId"] == trigger["RecordId"]
    assert record["EventId"] == EVENT_ID
    assert record["Transition"] == trigger["Transition"]
    assert record["HookExitCode"] == outcome.exit_code
    assert record["HookTimedOut"] is outcome.timed_out
    assert record["HookDurationMs"] == outcome.duration_ms
    assert record["HookOutput"] == outcome.output
    assert record["HookError"] == outcome.error
    assert record["TimeGenerated"] == "2022-04-11T22:10:00.000Z"


def test_hook_record_id_survives_a_replay() -> None:
    job = plan([event("Scheduled")], prepare=True, recover=True)[0]
    replayed = HookJob.from_payload(job.to_payload())
    first = hook_record(ORIGIN, job, OUTCOMES[0], T0)
    second = hook_record(ORIGIN, replayed, OUTCOMES[1], datetime.now(timezone.utc))
    assert first["RecordId"] == second["RecordId"]
    assert first["RecordId"] not in (job.job_id, job.trigger["RecordId"])


def test_environment_carries_the_event() -> None:
    job = plan([event("Scheduled", affects=None)], prepare=True, recover=True)[0]
    env = hook_environment(job, {"PATH": "/bin", "SE_BRIDGE_EVENT_ID": "stale"})
    assert env["PATH"] == "/bin"
    assert env["SE_BRIDGE_HOOK_PHASE"] == "prepare"
    assert env["SE_BRIDGE_EVENT_ID"] == EVENT_ID
    assert env["SE_BRIDGE_EVENT_STATUS"] == "Scheduled"
    assert env["SE_BRIDGE_RESOURCES"] == "WestNO_0,WestNO_1"
    assert env["SE_BRIDGE_DURATION_SECONDS"] == "-1"
    assert env["SE_BRIDGE_AFFECTS_THIS_VM"] == ""
    assert env["SE_BRIDGE_VM_NAME"] == "WestNO_0"
    assert env["SE_BRIDGE_VM_ID"] == "0000000a-0000-4000-8000-000000000001"
    assert env["SE_BRIDGE_RECORD_ID"] == "rec-1"
    assert env["SE_BRIDGE_NOT_BEFORE"] == "2022-04-11T22:26:58.000Z"
    assert all(isinstance(v, str) for v in env.values())


def test_environment_leaves_out_the_agents_own_settings() -> None:
    job = plan([event("Scheduled")], prepare=True, recover=True)[0]
    base = {
        "PATH": "/bin",
        "SE_BRIDGE_EVENTHUBS_CONNECTION_STRING": "Endpoint=sb://x/;SharedAccessKey=SECRET",
        "se_bridge_agent_sinks": "stdout",
    }
    env = hook_environment(job, base)
    assert "SE_BRIDGE_EVENTHUBS_CONNECTION_STRING" not in env
    assert "se_bridge_agent_sinks" not in env
    assert "SECRET" not in "".join(env.values())
    assert env["PATH"] == "/bin"


def test_environment_booleans_nulls_and_nul() -> None:
    record = {**event("Completed", previous="Started"), "Description": "a\0b", "VmId": None}
    job = plan([record], prepare=True, recover=True)[0]
    env = hook_environment(job, {})
    assert env["SE_BRIDGE_AFFECTS_THIS_VM"] == "true"
    assert env["SE_BRIDGE_EVENT_STATUS"] == ""
    assert env["SE_BRIDGE_VM_ID"] == ""
    assert env["SE_BRIDGE_DESCRIPTION"] == "ab"


def test_output_tail_keeps_the_end_in_bounded_memory() -> None:
    tail = OutputTail(10)
    for i in range(10_000):
        tail.feed(f"line {i}\n".encode())
        assert len(tail._data) <= 40
    assert tail.text() == "line 9999\n"[-10:]


def test_output_tail_never_starts_with_half_a_character() -> None:
    tail = OutputTail(3)
    tail.feed("ééééééé".encode())  # 2 bytes each: the 12-byte cut lands inside a character
    tail.feed(b"\xff")
    assert tail.text() == "éé\ufffd"


def test_output_tail_zero_keeps_nothing() -> None:
    tail = OutputTail(0)
    tail.feed(b"abc")
    assert tail.text() == ""


@pytest.mark.parametrize(
    ("system", "expected"),
    [
        ("Linux", {"start_new_session": True}),
        ("Darwin", {"start_new_session": True}),
        ("Windows", {"creationflags": 0x200}),
    ],
)
def test_spawn_options_per_platform(system: str, expected: dict[str, Any]) -> None:
    assert hookproc.spawn_options(system) == expected


class FakeProc:
    pid = 4242

    def __init__(self) -> None:
        self.killed = False

    def kill(self) -> None:
        self.killed = True


def test_kill_tree_on_windows_uses_taskkill(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda args, **_: calls.append(args))
    monkeypatch.setattr(os, "killpg", lambda *a: pytest.fail("killpg"), raising=False)
    proc = FakeProc()
    hookproc.kill_tree(proc, "Windows")  # type: ignore[arg-type]
    assert len(calls) == 1
    assert calls[0][0].lower().endswith("taskkill.exe")
    assert calls[0][1:] == ["/T", "/F", "/PID", "4242"]
    assert proc.killed


@pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX")
def test_kill_tree_on_posix_kills_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    groups: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: groups.append((pgid, sig)))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("taskkill on POSIX"))
    proc = FakeProc()
    hookproc.kill_tree(proc, "Linux")  # type: ignore[arg-type]
    assert groups == [(4242, signal.SIGKILL)]
    assert proc.killed


@pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX")
def test_kill_tree_tolerates_a_vanished_group(monkeypatch: pytest.MonkeyPatch) -> None:
    def gone(pgid: int, sig: int) -> None:
        raise ProcessLookupError

    monkeypatch.setattr(os, "killpg", gone)
    hookproc.kill_tree(FakeProc(), "Linux")  # type: ignore[arg-type]


CLOUD_CREDENTIALS = {
    "AZURE_CLIENT_SECRET": "s3cret",
    "AZURE_CLIENT_ID": "11111111-2222-3333-4444-555555555555",
    "AZURE_FEDERATED_TOKEN_FILE": "/var/run/secrets/token",
    "IDENTITY_HEADER": "hdr",
    "IDENTITY_ENDPOINT": "http://localhost:42356/msi/token",
    "MSI_ENDPOINT": "http://localhost:42356/msi/token",
    "MSI_SECRET": "msi",
    "AWS_SECRET_ACCESS_KEY": "aws",
}


def test_environment_is_minimal_and_carries_no_cloud_credentials() -> None:
    job = plan([event("Scheduled")], prepare=True, recover=True)[0]
    base = {"PATH": "/bin", "HOME": "/root", "LANG": "C.UTF-8", "LC_TIME": "de_DE.UTF-8",
            "TZ": "UTC", "APP_MODE": "prod", **CLOUD_CREDENTIALS}  # fmt: skip
    env = hook_environment(job, base)
    assert [k for k in env if not k.startswith("SE_BRIDGE_")] == [
        "PATH", "HOME", "LANG", "LC_TIME", "TZ"
    ]  # fmt: skip
    assert not set(CLOUD_CREDENTIALS.values()) & set(env.values())


def test_environment_passes_what_hooks_environment_allows() -> None:
    job = plan([event("Scheduled")], prepare=True, recover=True)[0]
    base = {"PATH": "/bin", "APP_MODE": "prod", "app_region": "eu", **CLOUD_CREDENTIALS}
    env = hook_environment(job, base, allow=("APP_MODE", "APP_REGION", "ABSENT"))
    assert env["APP_MODE"] == "prod"
    assert "ABSENT" not in env
    assert "AZURE_CLIENT_SECRET" not in env
    # Names are matched as the platform does: exactly on POSIX, in any case on Windows.
    assert ("app_region" in env) == (os.name == "nt")


def test_environment_never_passes_the_agents_own_settings_even_when_allowed() -> None:
    job = plan([event("Scheduled")], prepare=True, recover=True)[0]
    base = {"SE_BRIDGE_EVENTHUBS_CONNECTION_STRING": "Endpoint=sb://x/;SharedAccessKey=SECRET"}
    env = hook_environment(job, base, allow=("SE_BRIDGE_EVENTHUBS_CONNECTION_STRING",))
    assert "SECRET" not in "".join(env.values())
