"""The systemd units: the fixed interface, the hardening, and systemd's own checks."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "packaging" / "systemd"
ANALYZE = shutil.which("systemd-analyze")
COMMANDS = {
    "se-bridge-agent.service": "agent --config /etc/se-bridge/agent.toml",
    "se-bridge-consumer.service": "consume --config /etc/se-bridge/consumer.toml",
}
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
    "RestrictNamespaces": "yes",
    "LockPersonality": "yes",
    "MemoryDenyWriteExecute": "yes",
    "SystemCallFilter": "@system-service",
    "CapabilityBoundingSet": "",
    "User": "se-bridge",
    "StateDirectory": "se-bridge",
    "LogsDirectory": "se-bridge",
    "Restart": "on-failure",
    "KillSignal": "SIGTERM",
}


def directives(unit: Path) -> dict[str, list[str]]:
    """`Key=value` lines of the [Service] section; a key may repeat, as systemd allows."""
    found: dict[str, list[str]] = {}
    section = ""
    for raw in unit.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_unit_runs_the_fixed_command_as_se_bridge(name: str) -> None:
    found = directives(UNITS / name)
    assert found["ExecStart"] == [f"/opt/se-bridge/venv/bin/se-bridge {COMMANDS[name]}"]
    for key, value in HARDENING.items():
        assert found.get(key) == [value], key
    # Longer than the agent's own shutdown (10 s hooks + 10 s flush + 5 s delivery).
    timeout = found["TimeoutStopSec"][0]
    assert int(timeout.removesuffix("s")) > 25


def test_the_agents_state_directory_is_its_default_state_dir() -> None:
    from bridge import host

    assert host.default_state_dir("Linux") == Path("/var/lib") / "se-bridge"


needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")


@needs_analyze
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_systemd_analyze_verify_accepts_the_unit(name: str, tmp_path: Path) -> None:
    # verify insists that ExecStart exists: point it at this environment's console script.
    script = Path(sys.executable).parent / "se-bridge"
    text = (UNITS / name).read_text(encoding="utf-8")
    unit = tmp_path / name
    unit.write_text(text.replace("/opt/se-bridge/venv/bin/se-bridge", str(script)), "utf-8")
    done = subprocess.run(
        [str(ANALYZE), "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


@needs_analyze
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_systemd_analyze_security_rates_the_unit_ok(name: str) -> None:
    done = subprocess.run(
        [str(ANALYZE), "security", "--offline=true", "--no-pager", str(UNITS / name)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", done.stdout)
    assert match, done.stdout + done.stderr
    assert float(match.group(1)) <= 2.0, done.stdout  # 1.5 when written; 10 is unprotected


PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1
MDWE_CHILD = f"""
import ctypes, mmap, sqlite3, ssl, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl({PR_SET_MDWE}, {PR_MDWE_REFUSE_EXEC_GAIN}, 0, 0, 0) != 0:
    sys.exit(77)
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
except PermissionError:
    pass
else:
    sys.exit("write+execute memory was allowed: the check below proves nothing")
import bridge.agent.loop, bridge.consumer.service, bridge.sinks.eventhubs, bridge.sinks.loganalytics
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
key = Ed25519PrivateKey.generate()
key.public_key().verify(key.sign(b"approve"), b"approve")
ssl.create_default_context()
sqlite3.connect(":memory:").execute("create table t (x)")
print("ok")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_MDWE is a Linux prctl")
def test_python_and_its_native_libraries_run_without_write_execute_memory() -> None:
    """What MemoryDenyWriteExecute=yes allows: the kernel's own MDWE (Linux 6.3+) is the same
    rule (systemd 255+ uses it, older systemd a seccomp filter with the same effect)."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "prctl"):
        pytest.skip("no prctl")
    done = subprocess.run(
        [sys.executable, "-c", MDWE_CHILD],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    if done.returncode == 77:
        pytest.skip("this kernel has no PR_SET_MDWE (Linux < 6.3)")
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr


@pytest.mark.parametrize("unit", sorted(COMMANDS))
def test_units_use_the_notify_protocol_a_watchdog_and_memory_limits(unit: str) -> None:
    text = (UNITS / unit).read_text(encoding="utf-8")
    settings = dict(re.findall(r"^(\w+)=(.*)$", text, flags=re.MULTILINE))
    assert settings["Type"] == "notify"
    assert settings["NotifyAccess"] == "main"
    assert settings["WatchdogSec"].endswith("s")
    assert settings["MemoryMax"]
    assert settings["MemoryHigh"]


@pytest.mark.parametrize("unit", sorted(COMMANDS))
def test_units_bound_open_files_and_tasks(unit: str) -> None:
    """A flood of connections to the metrics endpoint, or a hook that forks without end,
    stops at the unit's own limits, not the host's."""
    found = directives(UNITS / unit)
    for key in ("LimitNOFILE", "TasksMax"):
        assert len(found.get(key, [])) == 1, key
        assert found[key][0].isdigit(), f"{key}={found[key][0]}: a number, not infinity"
    # The endpoint's connections, the threads and the hooks fit well inside.
    assert int(found["LimitNOFILE"][0]) >= 1024
    assert int(found["TasksMax"][0]) >= 64
