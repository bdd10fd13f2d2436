"""The Windows service, on Linux: what `install` registers, and the stop path into the agent.

pywin32 exists only on Windows, so the SCM is a fake and the pywin32 base class is a stand-in
with the two methods the service uses; the agent inside is real, polling the IMDS simulator.
"""

from __future__ import annotations

import argparse
import importlib
import ntpath
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bridge import cli
from bridge.agent import winservice
from bridge.simulator import SimulatorServer
from tests.support.processes import read_records
from tests.support.wait import eventually


class FakeScm:
    def __init__(self, state: str = "RUNNING", fail: str | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self._state, self._fail = state, fail

    def _call(self, action: str, arg: Any) -> None:
        if action == self._fail:
            raise winservice.ServiceError(f"cannot {action} the service: Access is denied.")
        self.calls.append((action, arg))

    def install(self, spec: winservice.ServiceSpec) -> None:
        self._call("install", spec)

    def start(self, name: str) -> None:
        self._call("start", name)

    def stop(self, name: str) -> None:
        self._call("stop", name)

    def state(self, name: str) -> str:
        self._call("state", name)
        return self._state

    def uninstall(self, name: str) -> None:
        self._call("uninstall", name)


def parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["service", *argv])


def test_install_registers_a_delayed_auto_start_localsystem_service(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text("[agent]\n", encoding="utf-8")
    scm, commands = FakeScm(), list[Sequence[str]]()
    code = winservice.execute(parse("install", "--config", str(config)), scm, commands.append)
    assert code == 0
    [(action, spec)] = scm.calls
    assert action == "install"
    assert (spec.name, spec.account, spec.delayed_start) == ("se-bridge", None, True)
    assert spec.config == config.resolve()
    package_parent = Path(winservice.__file__).resolve().parent.parent
    assert spec.class_string == ntpath.join(
        str(package_parent), "bridge.agent.winservice.AgentService"
    )
    assert commands == [
        ["icacls", spec.state_dir, "/inheritance:r", "/grant:r", "*S-1-5-18:(OI)(CI)F",
         "*S-1-5-32-544:(OI)(CI)F"],
        ["sc.exe", "failure", "se-bridge", "reset=", "86400", "actions=",
         "restart/5000/restart/15000/restart/60000"],
        ["sc.exe", "failureflag", "se-bridge", "1"],
    ]  # fmt: skip


def test_a_virtual_account_is_granted_the_state_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    args = parse("install", "--account", "virtual", "--name", "se-bridge-2")
    spec = winservice.spec_from_args(args, package_parent="C:\\venv\\Lib\\site-packages")
    assert spec.account == "NT SERVICE\\se-bridge-2"
    assert spec.display_name == "se-bridge agent (se-bridge-2)"
    monkeypatch.setenv("ProgramData", "D:\\Data")
    spec = winservice.spec_from_args(args, package_parent="C:\\venv\\Lib\\site-packages")
    assert winservice.grant_commands(spec) == [
        ["icacls", "D:\\Data\\se-bridge", "/grant", "NT SERVICE\\se-bridge-2:(OI)(CI)M"]
    ]


def test_install_refuses_a_config_file_that_does_not_exist(tmp_path: Path) -> None:
    args = parse("install", "--config", str(tmp_path / "missing.toml"))
    with pytest.raises(winservice.ServiceError, match=r"missing\.toml does not exist"):
        winservice.spec_from_args(args, package_parent=tmp_path)


@pytest.mark.parametrize("action", ["start", "stop", "uninstall"])
def test_control_actions_reach_the_scm(action: str) -> None:
    scm = FakeScm()
    assert winservice.execute(parse(action, "--name", "x"), scm, print) == 0
    assert scm.calls == [(action, "x")]


@pytest.mark.parametrize(("state", "code"), [("RUNNING", 0), ("STOPPED", 3)])
def test_status_prints_the_state(state: str, code: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert winservice.execute(parse("status"), FakeScm(state), print) == code
    assert capsys.readouterr().out == f"se-bridge: {state}\n"


def test_an_scm_error_is_a_message_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert winservice.execute(parse("start"), FakeScm(fail="start"), print) == 1
    assert "cannot start the service: Access is denied." in capsys.readouterr().err


@pytest.mark.skipif(sys.platform == "win32", reason="checks the message on other systems")
def test_service_commands_say_they_are_windows_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["service", "status"]) == 2
    assert "works only on Windows" in capsys.readouterr().err


def test_the_service_log_defaults_to_program_data() -> None:
    path = winservice.default_log_file({"ProgramData": "C:\\ProgramData"})
    assert str(path) == "C:\\ProgramData\\se-bridge\\logs\\agent.log"


# --- the service class and its stop path -------------------------------------------------------


class FakeFramework:
    """The two methods of win32serviceutil.ServiceFramework the service calls."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.statuses: list[tuple[int, int]] = []

    def ReportServiceStatus(self, status: int, waitHint: int = 5000) -> None:  # noqa: N803
        self.statuses.append((status, waitHint))


class EventLog:
    def __init__(self) -> None:
        self.info: list[str] = []
        self.errors: list[str] = []

    def LogInfoMsg(self, text: str) -> None:
        self.info.append(text)

    def LogErrorMsg(self, text: str) -> None:
        self.errors.append(text)


def service_class(config: Path, events: EventLog) -> type[Any]:
    def options(name: str, option: str, default: str | None) -> str | None:
        return str(config) if (name, option) == ("se-bridge", "config") else default

    svc = SimpleNamespace(SERVICE_STOP_PENDING=3)
    return winservice.build_service_class(FakeFramework, svc, events, options)


def write_config(root: Path, imds: SimulatorServer, extra: str = "") -> Path:
    config = root / "agent.toml"
    config.write_text(
        f'[agent]\npoll_interval = 0.2\nstate_dir = "{root / "state"}"\n'
        f'sinks = ["jsonl:{root / "records.jsonl"}"]\nlog_file = "{root / "logs" / "agent.log"}"\n'
        f'{extra}\n[imds]\nurl = "{imds.vm_url("vm-0")}"\nfirst_call_timeout = 5\n',
        encoding="utf-8",
    )
    return config


def heartbeats(root: Path) -> list[str]:
    records = read_records(root / "records.jsonl")
    return [r["HeartbeatReason"] for r in records if r["RecordType"] == "Heartbeat"]


def test_stop_control_flushes_the_agent_and_ends_the_run(
    tmp_path: Path, imds: SimulatorServer
) -> None:
    events = EventLog()
    service = service_class(write_config(tmp_path, imds), events)(["se-bridge"])
    failures: list[BaseException] = []

    def run() -> None:
        try:
            service.SvcDoRun()
        except BaseException as err:  # handed to the test thread
            failures.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        eventually(lambda: "Start" in heartbeats(tmp_path), what="the agent's Start heartbeat")
    finally:
        service.SvcStop()
    thread.join(timeout=30)
    ignored_stop = thread.is_alive()
    service.body.stop()  # so a failing test does not leave the agent running
    thread.join()
    assert not ignored_stop, "the agent kept running after SvcStop"
    assert failures == []
    assert service.statuses == [(3, winservice.STOP_WAIT_HINT_MS)]
    assert heartbeats(tmp_path)[-1] == "Stop"  # flushed before the run returned
    log = (tmp_path / "logs" / "agent.log").read_text(encoding="utf-8")
    assert "stopping: flushing the spool" in log
    assert events.errors == []


def test_shutdown_takes_the_stop_path(tmp_path: Path) -> None:
    # Defining SvcShutdown is also what makes pywin32 accept SERVICE_CONTROL_SHUTDOWN.
    cls = service_class(tmp_path / "agent.toml", EventLog())
    assert cls.SvcShutdown is cls.SvcStop


def test_a_bad_setting_fails_the_service_and_reaches_the_event_log(
    tmp_path: Path, imds: SimulatorServer
) -> None:
    events = EventLog()
    config = write_config(tmp_path, imds, extra="poll_interval_typo = 1\n")
    service = service_class(config, events)(["se-bridge"])
    with pytest.raises(winservice.ServiceFailed, match="exited with code 2"):
        service.SvcDoRun()
    [error] = events.errors
    assert "exit code 2" in error
    assert "unknown setting agent.poll_interval_typo" in error


def test_the_host_finds_the_class_by_its_registered_string(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What pywin32's service host does with the PythonClass value (LoadPythonServiceClass).
    for name in ("servicemanager", "win32service", "win32serviceutil"):
        fake = SimpleNamespace(
            ServiceFramework=FakeFramework, GetServiceCustomOption=lambda *a: None
        )
        monkeypatch.setitem(sys.modules, name, fake)
    registered = winservice.class_string("C:\\venv\\Lib\\site-packages")
    module_name, _, class_name = registered.rpartition("\\")[2].rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    assert issubclass(cls, FakeFramework)
    assert cls._svc_name_ == "se-bridge"
    with pytest.raises(AttributeError):
        winservice.NoSuchThing  # noqa: B018
