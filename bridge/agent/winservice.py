r"""`se-bridge service ...`: the agent as a Windows service, through pywin32.

How it is wired: `install` registers pywin32's service host (pythonservice.exe, which
win32serviceutil copies into the virtual environment so the host finds its packages) with
the class string `<site-packages>\bridge.agent.winservice.AgentService`. The host imports this
module and asks for `AgentService`, which is built on first use (module __getattr__), so
this module imports on Linux without pywin32. The service runs the agent in-process through
`bridge.agent.command.serve_agent`, the same code as `se-bridge agent`; a Stop or Shutdown
control sets the stop Event that SIGTERM sets on Linux: the agent flushes and returns 0.

Everything that decides something (arguments, what is registered, the recovery and grant
commands, the stop path) is plain Python and tested on Linux with a fake SCM; only
`Pywin32Scm` and `AgentService` touch Windows.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import ntpath
import os
import platform
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bridge import host
from bridge.agent.command import serve_agent

SERVICE_NAME = "se-bridge"
DISPLAY_NAME = "se-bridge agent"
DESCRIPTION = (
    "Polls Azure Scheduled Events from IMDS, ships records, runs prepare/recover hooks "
    "and applies approvals."
)
CLASS_NAME = "AgentService"
OPTION_CONFIG = "config"  # registry value under Services\<name>\Parameters
# A Preempt gives 30 s of notice: restart quickly, then back off.
RESTART_DELAYS_MS = (5_000, 15_000, 60_000)
RESET_FAILURES_AFTER_S = 86_400
# The agent's shutdown waits up to 10 s for hooks, 10 s to flush and 5 s for delivery.
STOP_WAIT_HINT_MS = 40_000
EXIT_NOT_WINDOWS = 2
EXIT_NOT_RUNNING = 3
STATES = {
    1: "STOPPED",
    2: "START_PENDING",
    3: "STOP_PENDING",
    4: "RUNNING",
    5: "CONTINUE_PENDING",
    6: "PAUSE_PENDING",
    7: "PAUSED",
}


class ServiceError(Exception):
    """A service operation failed; the message says what to do about it."""


@dataclass(frozen=True)
class ServiceSpec:
    """Everything `install` registers with the Service Control Manager."""

    name: str
    display_name: str
    description: str
    class_string: str
    config: Path | None
    account: str | None  # None: LocalSystem
    grant_dirs: tuple[str, ...] = ()
    state_dir: str = ""  # closed to all but SYSTEM and Administrators at install
    delayed_start: bool = True
    restart_delays_ms: tuple[int, ...] = RESTART_DELAYS_MS
    reset_after_s: int = RESET_FAILURES_AFTER_S


class Scm(Protocol):
    """The Service Control Manager operations the commands need."""

    def install(self, spec: ServiceSpec) -> None: ...
    def start(self, name: str) -> None: ...
    def stop(self, name: str) -> None: ...
    def state(self, name: str) -> str: ...
    def uninstall(self, name: str) -> None: ...


Runner = Callable[[Sequence[str]], None]


# --- what gets registered -----------------------------------------------------------------


def class_string(package_parent: Path | str) -> str:
    r"""The host splits at the last backslash, puts the left part on sys.path, imports the rest.

    `C:\venv\Lib\site-packages\bridge.agent.winservice.AgentService` imports
    `bridge.agent.winservice`.
    """
    return ntpath.join(str(package_parent), f"bridge.agent.winservice.{CLASS_NAME}")


def default_log_file(environ: Mapping[str, str] | None = None) -> Path:
    """%ProgramData%\\se-bridge\\logs\\agent.log, the service's log unless agent.log_file."""
    state_dir = str(host.default_state_dir("Windows", environ))
    return Path(ntpath.join(state_dir, "logs", "agent.log"))


def spec_from_args(args: argparse.Namespace, *, package_parent: Path | str) -> ServiceSpec:
    """The registration for `se-bridge service install`; ServiceError on a bad argument."""
    config = args.config
    if config is not None:
        if not config.is_file():
            raise ServiceError(f"the config file {config} does not exist")
        config = config.resolve()  # the host starts in its own directory
    virtual = args.account == "virtual"
    account = f"NT SERVICE\\{args.name}" if virtual else None
    state_dir = str(host.default_state_dir("Windows"))
    grants = (state_dir,) if virtual else ()
    return ServiceSpec(
        name=args.name,
        display_name=DISPLAY_NAME if args.name == SERVICE_NAME else f"{DISPLAY_NAME} ({args.name})",
        description=DESCRIPTION,
        class_string=class_string(package_parent),
        config=config,
        account=account,
        grant_dirs=grants,
        state_dir=state_dir,
    )


def recovery_commands(spec: ServiceSpec) -> list[list[str]]:
    """sc.exe calls: restart after each failure, also when the service stops with an error."""
    actions = "/".join(f"restart/{delay}" for delay in spec.restart_delays_ms)
    return [
        ["sc.exe", "failure", spec.name, "reset=", str(spec.reset_after_s), "actions=", actions],
        # Without the flag only a crash counts; the agent failing to start exits cleanly.
        ["sc.exe", "failureflag", spec.name, "1"],
    ]


# Well-known SIDs, so the command means the same on a Windows of any language.
SYSTEM_SID, ADMINISTRATORS_SID = "*S-1-5-18", "*S-1-5-32-544"


def restrict_commands(spec: ServiceSpec) -> list[list[str]]:
    """%ProgramData%\\se-bridge is readable by every user by inheritance: the spool, the
    records and the log are for SYSTEM and Administrators only (then the grants below)."""
    if not spec.state_dir:
        return []
    return [
        [
            "icacls",
            spec.state_dir,
            "/inheritance:r",
            "/grant:r",
            f"{SYSTEM_SID}:(OI)(CI)F",
            f"{ADMINISTRATORS_SID}:(OI)(CI)F",
        ]
    ]


def grant_commands(spec: ServiceSpec) -> list[list[str]]:
    """A virtual account owns nothing: let it modify the state and log directory."""
    if spec.account is None:
        return []
    return [["icacls", d, "/grant", f"{spec.account}:(OI)(CI)M"] for d in spec.grant_dirs]


# --- the commands -----------------------------------------------------------------------------


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "service",
        help="install and control the agent's Windows service",
        description="Install, start, stop, query or remove the agent as a Windows service "
        "(Windows only). `status` exits 0 when it runs, 3 when it does not.",
        epilog="""examples:
  se-bridge service install --config C:\\ProgramData\\se-bridge\\agent.toml --account virtual
  se-bridge service start
  se-bridge service status
""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    install = actions.add_parser("install", help="register the service (delayed auto start)")
    install.add_argument(
        "--config", type=Path, metavar="FILE", help="TOML settings file the service reads"
    )
    install.add_argument(
        "--account",
        choices=("localsystem", "virtual"),
        default="localsystem",
        help="LocalSystem (default: hooks may need admin rights) or NT SERVICE\\NAME",
    )
    for action in ("start", "stop", "status", "uninstall"):
        actions.add_parser(action, help=f"{action} the service")
    for sub in actions.choices.values():
        sub.add_argument(
            "--name", default=SERVICE_NAME, help=f"service name (default {SERVICE_NAME})"
        )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if platform.system() != "Windows":
        return _fail(
            "`se-bridge service` manages a Windows service and works only on Windows; on "
            "Linux install packaging/systemd/se-bridge-agent.service (see docs/deploying.md)",
            EXIT_NOT_WINDOWS,
        )
    return execute(args, Pywin32Scm(), _run_checked)


def execute(args: argparse.Namespace, scm: Scm, runner: Runner) -> int:
    """Carry out one `se-bridge service` action; the exit code."""
    try:
        if args.action == "install":
            return _install(args, scm, runner)
        if args.action == "status":
            state = scm.state(args.name)
            print(f"{args.name}: {state}")
            return 0 if state == "RUNNING" else EXIT_NOT_RUNNING
        getattr(scm, args.action)(args.name)
    except ServiceError as err:
        return _fail(str(err), 1)
    print(f"{args.name}: {args.action} done")
    return 0


def _install(args: argparse.Namespace, scm: Scm, runner: Runner) -> int:
    spec = spec_from_args(args, package_parent=Path(__file__).resolve().parent.parent)
    # The ACL commands need the directories to exist (on Windows: elsewhere, as in tests, a
    # Windows path would only make an oddly named directory).
    made = {*spec.grant_dirs, spec.state_dir} - {""} if os.name == "nt" else set(spec.grant_dirs)
    for directory in made:
        Path(directory).mkdir(parents=True, exist_ok=True)
    scm.install(spec)
    for argv in restrict_commands(spec) + grant_commands(spec) + recovery_commands(spec):
        runner(argv)
    account = spec.account or "LocalSystem"
    print(
        f"installed {spec.name} as {account}, delayed auto start; start it with "
        f"`se-bridge service start --name {spec.name}`"
    )
    return 0


def _run_checked(argv: Sequence[str]) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()
        raise ServiceError(f"`{' '.join(argv)}` failed ({done.returncode}): {output}")


def _fail(message: str, code: int) -> int:
    print(f"se-bridge: {message}", file=sys.stderr)
    return code


# --- the service's body ---------------------------------------------------------------------


ServeAgent = Callable[..., int]


class ServiceBody:
    """What the service does between Start and Stop, free of pywin32.

    `run` blocks until `stop` is called (from the SCM's control thread). A service has no
    console: what the agent would print at start-up is captured and handed to `report`
    (the Windows event log), and its log goes to a file.
    """

    def __init__(
        self,
        config: Path | None,
        *,
        report: Callable[[str], None],
        log_file: Path | None = None,
        serve: ServeAgent | None = None,
    ) -> None:
        self.config = config
        self.log_file = log_file or default_log_file()
        self._report = report
        self._serve = serve
        self._stop = threading.Event()

    def run(self) -> int:
        serve = self._serve
        if serve is None:
            serve = serve_agent
        captured = io.StringIO()
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            code = serve(self.config, {}, self._stop, default_log_file=self.log_file)
        if code != 0:
            said = captured.getvalue().strip() or f"see {self.log_file}"
            self._report(f"the se-bridge agent stopped with exit code {code}: {said}")
        return code

    def stop(self) -> None:
        self._stop.set()


class ServiceFailed(Exception):
    """Raised out of SvcDoRun so the host reports a failure and recovery restarts us."""


def build_service_class(
    framework: type[Any], win32service: Any, servicemanager: Any, options: Callable[..., Any]
) -> type[Any]:
    """The pywin32 service class; its pieces are parameters so tests can pass fakes."""

    class AgentService(framework):  # type: ignore[misc]
        _svc_name_ = SERVICE_NAME
        _svc_display_name_ = DISPLAY_NAME
        _svc_description_ = DESCRIPTION

        def __init__(self, args: Sequence[str]) -> None:
            super().__init__(args)
            name = args[0] if args else SERVICE_NAME
            config = options(name, OPTION_CONFIG, None)
            self.body = ServiceBody(
                Path(config) if config else None, report=servicemanager.LogErrorMsg
            )

        def SvcDoRun(self) -> None:  # noqa: N802 - pywin32's name
            servicemanager.LogInfoMsg(f"se-bridge agent starting; log: {self.body.log_file}")
            code = self.body.run()
            if code != 0:
                raise ServiceFailed(f"the agent exited with code {code}")

        def SvcStop(self) -> None:  # noqa: N802 - pywin32's name
            self.ReportServiceStatus(win32service.SERVICE_STOP_PENDING, waitHint=STOP_WAIT_HINT_MS)
            self.body.stop()

        # Defining it makes the framework accept SERVICE_CONTROL_SHUTDOWN.
        SvcShutdown = SvcStop

    return AgentService


def __getattr__(name: str) -> Any:
    if name != CLASS_NAME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    servicemanager, win32service, win32serviceutil = _pywin32(
        "servicemanager", "win32service", "win32serviceutil"
    )
    return build_service_class(
        win32serviceutil.ServiceFramework,
        win32service,
        servicemanager,
        win32serviceutil.GetServiceCustomOption,
    )


def _pywin32(*names: str) -> list[Any]:
    """pywin32's modules, imported only on Windows (pyproject installs pywin32 there)."""
    return [importlib.import_module(name) for name in names]


class Pywin32Scm:
    """The real Service Control Manager. Windows only; every call needs an elevated prompt."""

    def __init__(self) -> None:
        pywintypes, win32service, win32serviceutil = _pywin32(
            "pywintypes", "win32service", "win32serviceutil"
        )
        self._error = pywintypes.error
        self._svc = win32service
        self._util = win32serviceutil

    def install(self, spec: ServiceSpec) -> None:
        with self._errors("install"):
            self._util.InstallService(
                spec.class_string,
                spec.name,
                spec.display_name,
                startType=self._svc.SERVICE_AUTO_START,
                userName=spec.account,
                description=spec.description,
                delayedstart=spec.delayed_start,
            )
            if spec.config is not None:
                self._util.SetServiceCustomOption(spec.name, OPTION_CONFIG, str(spec.config))

    def start(self, name: str) -> None:
        with self._errors("start"):
            self._util.StartService(name)
            self._util.WaitForServiceStatus(name, self._svc.SERVICE_RUNNING, 60)

    def stop(self, name: str) -> None:
        with self._errors("stop"):
            self._util.StopService(name)
            self._util.WaitForServiceStatus(name, self._svc.SERVICE_STOPPED, 60)

    def state(self, name: str) -> str:
        with self._errors("query"):
            code = self._util.QueryServiceStatus(name)[1]
        return STATES.get(code, f"state {code}")

    def uninstall(self, name: str) -> None:
        if self.state(name) != "STOPPED":
            self.stop(name)
        with self._errors("uninstall"):
            self._util.RemoveService(name)

    @contextlib.contextmanager
    def _errors(self, action: str) -> Any:
        try:
            yield
        except self._error as err:
            hint = " (run from an elevated prompt)" if err.winerror == 5 else ""
            raise ServiceError(f"cannot {action} the service: {err.strerror}{hint}") from err
