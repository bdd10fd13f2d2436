"""Hooks run for real: small Python and shell commands, their environment, stdin, timeouts."""

from __future__ import annotations

import json
import os
import queue
import stat
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from bridge.agent.hookproc import Command, HookOutcome, run_hook
from bridge.agent.hooks import HookJob, HookRunner, plan
from bridge.records import Origin, VmIdentity
from tests.support.records import event_record
from tests.support.wait import eventually

PY = sys.executable
EVENT_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
ORIGIN = Origin(
    VmIdentity(vm_id="0000000a-0000-4000-8000-000000000001", vm_name="WestNO_0"), host_name="host-a"
)
T0 = datetime(2022, 4, 11, 22, 10, 0, tzinfo=timezone.utc)
WAIT = 10.0  # generous upper bound for a result that normally arrives in milliseconds


def py(code: str) -> list[str]:
    return [PY, "-c", code]


def event(
    transition: str = "Scheduled", *, rid: str = "rec-1", event_id: str = EVENT_ID, **extra: Any
) -> dict[str, Any]:
    previous = None if transition == "Scheduled" else "Scheduled"
    extra.setdefault("Description", "Host maintenance: ünïcode ✓")
    return event_record(transition, previous=previous, rid=rid, event_id=event_id, **extra)


def job(transition: str = "Scheduled", **kwargs: Any) -> HookJob:
    jobs = plan([event(transition, **kwargs)], prepare=True, recover=True)
    assert len(jobs) == 1
    return jobs[0]


def run(command: Command, hook: HookJob | None = None, **kwargs: Any) -> HookOutcome:
    """Run one hook through a runner and return its outcome."""
    with runner(prepare=command, recover=command, **kwargs) as (r, done):
        assert r.submit(hook or job())
        return done.get(timeout=WAIT)[1]


@contextmanager
def runner(
    *,
    prepare: Command | None,
    recover: Command | None = None,
    timeout: float = 5.0,
    stop_timeout: float = 5.0,
    **kwargs: Any,
) -> Iterator[tuple[HookRunner, queue.Queue[tuple[HookJob, HookOutcome]]]]:
    done: queue.Queue[tuple[HookJob, HookOutcome]] = queue.Queue()
    r = HookRunner(
        prepare=prepare,
        recover=recover,
        timeout=timeout,
        on_done=lambda j, o: done.put((j, o)),
        **kwargs,
    )
    try:
        yield r, done
    finally:
        r.stop(stop_timeout)


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie waiting for its parent to reap it counts as dead)."""
    stat_file = Path(f"/proc/{pid}/stat")
    if stat_file.exists():
        with_state = stat_file.read_text().rsplit(")", 1)[-1].split()
        return bool(with_state) and with_state[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# --- one hook ------------------------------------------------------------------------------


def test_hook_sees_the_event_in_its_environment() -> None:
    code = "import os, json; print(json.dumps({k: v for k, v in os.environ.items()})) "
    outcome = run(py(code), job(), max_output=1_000_000)
    assert outcome.ok, outcome
    env = json.loads(outcome.output)
    assert env["SE_BRIDGE_HOOK_PHASE"] == "prepare"
    assert env["SE_BRIDGE_EVENT_ID"] == EVENT_ID
    assert env["SE_BRIDGE_EVENT_TYPE"] == "Reboot"
    assert env["SE_BRIDGE_EVENT_STATUS"] == "Scheduled"
    assert env["SE_BRIDGE_TRANSITION"] == "Scheduled"
    assert env["SE_BRIDGE_NOT_BEFORE"] == "2022-04-11T22:26:58.000Z"
    assert env["SE_BRIDGE_RESOURCES"] == "WestNO_0,WestNO_1"
    assert env["SE_BRIDGE_EVENT_SOURCE"] == "Platform"
    assert env["SE_BRIDGE_DURATION_SECONDS"] == "-1"
    assert env["SE_BRIDGE_DESCRIPTION"] == "Host maintenance: ünïcode ✓"
    assert env["SE_BRIDGE_AFFECTS_THIS_VM"] == "true"
    assert env["SE_BRIDGE_RECORD_ID"] == "rec-1"
    assert env["SE_BRIDGE_VM_NAME"] == "WestNO_0"
    assert env["SE_BRIDGE_VM_ID"] == "0000000a-0000-4000-8000-000000000001"
    # On top of the agent's own environment, not instead of it.
    assert env.get("PATH") == os.environ.get("PATH")


def test_recover_hook_gets_empty_strings_for_nulls() -> None:
    code = (
        "import os; e = os.environ; "
        "print(repr(e['SE_BRIDGE_EVENT_STATUS']), e['SE_BRIDGE_HOOK_PHASE'])"
    )
    outcome = run(py(code), job("Completed"))
    assert outcome.output.strip() == "'' recover"


def test_hook_reads_the_event_as_json_on_stdin() -> None:
    hook = job()
    code = "import sys; data = sys.stdin.buffer.read(); sys.stdout.buffer.write(data)"
    outcome = run(py(code), hook, max_output=100_000)
    assert outcome.ok, outcome
    assert json.loads(outcome.output) == hook.trigger


def test_stdin_is_closed_after_the_event() -> None:
    code = "import sys; sys.stdin.read(); sys.stdin.read(); print('eof')"
    outcome = run(py(code), timeout=3.0)
    assert not outcome.timed_out
    assert outcome.output.strip() == "eof"


def test_hook_that_ignores_a_large_stdin_does_not_hang() -> None:
    hook = job(Description="x" * 300_000)  # beyond a pipe's buffer and an env var's limit
    outcome = run(py("print('ignored')"), hook, timeout=5.0)
    assert outcome.ok, outcome
    assert outcome.output.strip() == "ignored"


@pytest.mark.parametrize("code", [0, 1, 3, 255])
def test_exit_code_is_reported(code: int) -> None:
    outcome = run(py(f"import sys; print('bye'); sys.exit({code})"))
    assert outcome.exit_code == code
    assert outcome.ok is (code == 0)
    assert not outcome.timed_out
    assert outcome.error is None
    assert outcome.output.strip() == "bye"
    assert outcome.duration_ms >= 0


def test_stdout_and_stderr_are_merged() -> None:
    code = (
        "import sys; print('out', flush=True); print('err', file=sys.stderr, flush=True); "
        "print('out2', flush=True)"
    )
    outcome = run(py(code))
    assert outcome.output.split() == ["out", "err", "out2"]


def test_shell_string_runs_through_the_shell() -> None:
    if sys.platform == "win32":
        command = "echo %SE_BRIDGE_EVENT_ID%& exit /b 3"
    else:
        command = 'echo "$SE_BRIDGE_EVENT_ID" | tr A-Z a-z; exit 3'
    outcome = run(command)
    assert outcome.exit_code == 3
    expected = EVENT_ID if sys.platform == "win32" else EVENT_ID.lower()
    assert outcome.output.strip() == expected


def test_argv_list_is_not_given_to_a_shell() -> None:
    outcome = run([*py("import sys; print(sys.argv[1:])"), "$HOME", "a b", ";", "%PATH%"])
    assert outcome.output.strip() == "['$HOME', 'a b', ';', '%PATH%']"


def test_output_keeps_only_the_tail() -> None:
    code = (
        "import sys\n"
        "for i in range(20000):\n"
        "    sys.stdout.write('noise %d ' % i + 'é' * 40 + '\\n')\n"
        "sys.stdout.write('THE END')\n"
    )
    outcome = run(py(code), max_output=100)
    assert outcome.ok, outcome
    assert len(outcome.output) == 100
    assert outcome.output.endswith("THE END")
    assert "\ufffd" not in outcome.output


def test_timeout_kills_the_whole_process_tree() -> None:
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    outcome = run(py(code), timeout=1.0)
    assert time.monotonic() - started < 8.0
    assert outcome.timed_out
    assert outcome.exit_code is None
    assert outcome.error is None
    assert 900 <= outcome.duration_ms < 8000
    child = int(outcome.output.split()[0])
    eventually(lambda: not alive(child), 5.0, "the hook's child to die with the hook's timeout")


def test_background_child_holding_the_pipe_does_not_hold_the_hook() -> None:
    code = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "print(child.pid, flush=True)\n"
    )
    started = time.monotonic()
    outcome = run(py(code), timeout=10.0)
    try:
        assert outcome.ok, outcome
        assert time.monotonic() - started < 5.0
    finally:
        os.kill(int(outcome.output.split()[0]), 9)


def test_command_not_found() -> None:
    outcome = run(["/nonexistent/se-bridge-hook", "--drain"])
    assert outcome.error == "hook command not found: /nonexistent/se-bridge-hook"
    assert outcome.exit_code is None
    assert not outcome.timed_out


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")
def test_command_not_executable(tmp_path: Path) -> None:
    script = tmp_path / "hook.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    outcome = run([str(script)])
    assert outcome.error == f"hook command not permitted: {script}"


@pytest.mark.parametrize("command", [[], ""])
def test_empty_command_is_an_error_not_an_exception(command: Sequence[str]) -> None:
    outcome = run_hook(command, stdin=b"", env=dict(os.environ), timeout=1.0, max_output=10)
    assert outcome.error is not None
    assert outcome.error.startswith("hook command could not start")


def test_phase_without_a_command_is_reported() -> None:
    with runner(prepare=py("pass"), recover=None) as (r, done):
        assert r.submit(job("Completed"))
        finished, outcome = done.get(timeout=WAIT)
    assert finished.phase == "recover"
    assert outcome.error == "no recover hook configured"
    assert not r.configured("recover")
    assert r.configured("prepare")


# --- the runner -------------------------------------------------------------------------------


def test_submit_never_blocks_and_refuses_beyond_the_bound(tmp_path: Path) -> None:
    flag = tmp_path / "started"
    sleeper = py(f"import time; open({str(flag)!r}, 'w').close(); time.sleep(30)")
    with runner(prepare=sleeper, max_concurrent=1, max_pending=2, stop_timeout=0) as (r, done):
        assert r.submit(job(rid="r0", event_id="e0"))
        eventually(flag.exists, WAIT, "the hook to start")
        started = time.monotonic()
        accepted = [r.submit(job(rid=f"r{i}", event_id=f"e{i}")) for i in range(1, 5)]
        assert time.monotonic() - started < 0.5
        # One running, two pending; the rest stay with the caller, who resubmits later.
        assert accepted == [True, True, False, False]
        assert r.active() == 3
    assert r.active() == 0
    assert done.empty(), "a hook killed by stop must stay pending, not be reported"
    assert not r.submit(job(rid="late")), "a stopped runner accepts nothing"


def test_resubmitting_a_queued_job_runs_it_once(tmp_path: Path) -> None:
    log = tmp_path / "runs"
    code = f"open({str(log)!r}, 'a').write('x')"
    with runner(prepare=py(code), max_concurrent=1) as (r, done):
        hook = job()
        assert r.submit(hook)
        assert r.submit(hook)
        done.get(timeout=WAIT)
        assert r.active() == 0
        assert r.submit(hook), "once finished, the same job may run again"
        done.get(timeout=WAIT)
    assert log.read_text() == "xx"


def test_jobs_of_one_event_run_in_order_others_in_parallel(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    code = (
        "import os, time\n"
        "phase, event = os.environ['SE_BRIDGE_HOOK_PHASE'], os.environ['SE_BRIDGE_EVENT_ID']\n"
        "time.sleep(0.6 if phase == 'prepare' and event == 'A' else 0)\n"
        f"open({str(trace)!r}, 'a').write(f'{{event}}-{{phase}}\\n')\n"
    )
    with runner(prepare=py(code), recover=py(code), max_concurrent=4) as (r, done):
        assert r.submit(job(rid="a1", event_id="A"))
        assert r.submit(job("Completed", rid="a2", event_id="A"))
        assert r.submit(job(rid="b1", event_id="B"))
        finished = [done.get(timeout=WAIT)[0].trigger["RecordId"] for _ in range(3)]
    assert finished == ["b1", "a1", "a2"]
    assert trace.read_text().split() == ["B-prepare", "A-prepare", "A-recover"]


def test_stop_waits_for_running_hooks(tmp_path: Path) -> None:
    flag = tmp_path / "started"
    code = f"import time; open({str(flag)!r}, 'w').close(); time.sleep(0.4); print('done')"
    with runner(prepare=py(code)) as (r, done):
        assert r.submit(job())
        eventually(flag.exists, WAIT, "the hook to start")
        r.stop(5.0)
        assert r.active() == 0
        _, outcome = done.get_nowait()
    assert outcome.ok, outcome
    assert outcome.output.strip() == "done"


def test_stop_kills_hooks_past_its_timeout(tmp_path: Path) -> None:
    flag = tmp_path / "started"
    code = f"import time; open({str(flag)!r}, 'w').close(); time.sleep(60)"
    with runner(prepare=py(code), timeout=60.0) as (r, done):
        assert r.submit(job())
        eventually(flag.exists, WAIT, "the hook to start")
        started = time.monotonic()
        r.stop(0.3)
        assert 0.3 <= time.monotonic() - started < 5.0
        assert r.active() == 0
    assert done.empty()


def test_a_failing_on_done_does_not_kill_the_worker() -> None:
    seen: list[str] = []

    def on_done(j: HookJob, o: HookOutcome) -> None:
        seen.append(j.job_id)
        raise RuntimeError("spool is full")

    r = HookRunner(prepare=py("pass"), recover=None, timeout=5.0, max_concurrent=1, on_done=on_done)
    try:
        first, second = job(rid="a", event_id="A"), job(rid="b", event_id="B")
        assert r.submit(first)
        assert r.submit(second)
        eventually(lambda: r.active() == 0, WAIT, "both hooks to finish")
        assert seen == [first.job_id, second.job_id]
    finally:
        r.stop(5.0)


def test_outcome_logging(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="bridge.agent.hooks")
    run(py("pass"))
    run(py("import sys; sys.exit(2)"))
    logged = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in logged] == ["INFO", "WARNING"]
    assert logged[0][1].startswith(f"prepare hook for event {EVENT_ID} succeeded in ")
    assert logged[1][1].startswith(f"prepare hook for event {EVENT_ID} exited with 2 after ")


def test_a_hook_gets_none_of_the_agents_cloud_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {"AZURE_CLIENT_SECRET": "s3cret", "IDENTITY_HEADER": "hdr", "MSI_SECRET": "msi",
               "SE_BRIDGE_EVENTHUBS_CONNECTION_STRING": "Endpoint=sb://x/;SharedAccessKey=K",
               "APP_MODE": "prod"}  # fmt: skip
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    code = "import os, json; print(json.dumps(dict(os.environ)))"
    outcome = run(py(code), job(), max_output=1_000_000, environment=("APP_MODE",))
    assert outcome.ok, outcome
    env = json.loads(outcome.output)
    assert env["APP_MODE"] == "prod"
    assert not {"s3cret", "hdr", "msi", "Endpoint=sb://x/;SharedAccessKey=K"} & set(env.values())


def test_an_event_field_full_of_shell_metacharacters_arrives_unchanged_on_stdin() -> None:
    """What a Windows `cmd` hook should read (docs/hooks.md): cmd expands %VAR% before it
    parses a line, so a Description such as this one would run `calc` there; the JSON on
    stdin carries it as data, byte for byte."""
    hostile = 'x" & calc & echo "%PATH%" | more ^ <nul >out !VAR! `id` $(id)'
    hook = job()
    hook.trigger["Description"] = hostile
    code = "import sys, json; print(json.load(sys.stdin)['Description'])"
    outcome = run(py(code), hook)
    assert outcome.ok, outcome
    assert outcome.output.rstrip("\r\n") == hostile
