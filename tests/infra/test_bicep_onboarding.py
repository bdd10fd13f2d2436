"""The VM install scripts: the Linux one run into a temporary root, the Windows one's config."""

from __future__ import annotations

import base64
import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

import bridge
from bridge import config, extras
from tests import lock_support as lock
from tests.infra import bicep_support as bicep

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ONBOARDING = bicep.INFRA / "onboarding"
SHELL = ONBOARDING / "install-agent.sh"
POWERSHELL = ONBOARDING / "install-agent.ps1"
UNIT = bicep.ROOT / "packaging" / "systemd" / "se-bridge-agent.service"

VALUES = {
    "eventhubs-namespace": "contoso-sebridge.servicebus.windows.net",
    "eventhub": "records",
    "logs-endpoint": "https://sebridge-dce-abc123-x1y2.westeurope-1.ingest.monitor.azure.com",
    "dcr-id": "dcr-0123456789abcdef0123456789abcdef",
    "storage-account": "sebridgeabc123",
    "client-id": "11111111-2222-3333-4444-555555555555",
}


def _verify_key() -> str:
    public = Ed25519PrivateKey.generate().public_key()
    return base64.b64encode(public.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


@dataclass
class Installed:
    root: Path
    result: subprocess.CompletedProcess[str]
    systemctl_calls: list[str]
    verify_key: str


def _args(verify_key: str, **overrides: str) -> list[str]:
    values = VALUES | {"verify-key": verify_key} | overrides
    return [part for key, value in values.items() for part in (f"--{key}", value)]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """install-agent.sh run once into a temporary root, with the project's real wheel."""
    work = tmp_path_factory.mktemp("install")
    wheels = work / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(wheels),
            str(bicep.ROOT),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("se_bridge-*.whl")
    fake_bin = work / "bin"
    fake_bin.mkdir()
    log = work / "systemctl.log"
    # systemctl is faked: it records its arguments, so the test sees what would be enabled.
    (fake_bin / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {log}\n', encoding="utf-8")
    (fake_bin / "systemctl").chmod(0o755)
    verify_key = _verify_key()
    root = work / "root"
    command = [
        "bash",
        str(SHELL),
        "--wheel",
        str(wheel),
        "--python",
        sys.executable,
        "--root",
        str(root),
    ]
    env = os.environ | {"PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        command + _args(verify_key),
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    calls = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    return Installed(root, result, calls, verify_key)


def test_the_agent_is_installed_in_its_venv(installed: Installed) -> None:
    assert installed.result.returncode == 0, installed.result.stderr
    se_bridge = installed.root / "opt" / "se-bridge" / "venv" / "bin" / "se-bridge"
    version = subprocess.run(
        [str(se_bridge), "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.strip() == f"se-bridge {bridge.__version__}"


def test_the_agent_venv_holds_exactly_the_locked_agent_packages(installed: Installed) -> None:
    """The lock's agent export, installed in a fresh venv: nothing of the consumer extra."""
    got = lock.installed(installed.root / "opt" / "se-bridge" / "venv" / "bin" / "python")
    assert got == lock.locked("agent") | {"se-bridge": bridge.__version__}
    assert not set(got) & {lock.name(n) for n in extras.EXTRAS["consumer"]}


def test_the_agent_install_says_what_the_consumer_needs(installed: Installed) -> None:
    se_bridge = installed.root / "opt" / "se-bridge" / "venv" / "bin" / "se-bridge"
    done = subprocess.run(
        [str(se_bridge), "consume", "--hub", str(installed.root)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert "`consume` needs the consumer extra" in done.stderr
    assert "se-bridge[consumer]" in done.stderr
    assert "Traceback" not in done.stderr
    check = subprocess.run([str(se_bridge), "agent", "--help"], capture_output=True, check=False)
    assert check.returncode == 0


def test_the_written_config_loads_and_says_what_was_given(installed: Installed) -> None:
    path = installed.root / "etc" / "se-bridge" / "agent.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # holds no secret, but only for the agent
    loaded = config.load(path, environ={})
    assert loaded.agent.sinks == ["eventhubs", "loganalytics"]
    assert loaded.eventhubs.namespace == VALUES["eventhubs-namespace"]
    assert loaded.eventhubs.name == VALUES["eventhub"]
    assert loaded.loganalytics.endpoint == VALUES["logs-endpoint"]
    assert loaded.loganalytics.rule_id == VALUES["dcr-id"]
    assert loaded.storage.account == VALUES["storage-account"]
    assert loaded.identity.kind == "managed"
    assert loaded.identity.client_id == VALUES["client-id"]
    assert loaded.commands.channel == "storagequeue"
    assert loaded.commands.queue_prefix == "se-bridge-"
    assert loaded.commands.verify_key == installed.verify_key


def test_the_service_is_installed_and_enabled(installed: Installed) -> None:
    unit = installed.root / "etc" / "systemd" / "system" / "se-bridge-agent.service"
    assert unit.read_bytes() == UNIT.read_bytes()
    assert (
        "ExecStart=/opt/se-bridge/venv/bin/se-bridge agent --config /etc/se-bridge/agent.toml"
        in (unit.read_text(encoding="utf-8"))
    )
    assert installed.systemctl_calls == ["daemon-reload", "enable --now se-bridge-agent.service"]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("verify-key", "not-a-key"),
        ("dcr-id", "dcr-XYZ"),
        ("logs-endpoint", "http://plain.example"),
        ("storage-account", 'evil"name'),
        ("eventhubs-namespace", "https://ns.servicebus.windows.net/"),
    ],
)
def test_a_bad_value_stops_before_anything_is_installed(
    tmp_path: Path, option: str, value: str
) -> None:
    root = tmp_path / "root"
    args = _args(_verify_key(), **{option: value})
    result = subprocess.run(
        ["bash", str(SHELL), "--pip-spec", "se-bridge", "--root", str(root), "--no-start", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 2
    assert f"--{option}" in result.stderr
    assert not root.exists()


def _powershell_text(values: dict[str, str]) -> str:
    """The TOML install-agent.ps1 writes, variables filled in as PowerShell expands them."""
    text = POWERSHELL.read_text(encoding="utf-8")
    match = re.search(r'^\$toml = @"\n(.*?)\n"@$', text, re.MULTILINE | re.DOTALL)
    assert match, "install-agent.ps1 has no $toml here-string"
    identity = 'kind = "managed"\nclient_id = "' + values["ClientId"] + '"'
    return re.sub(
        r"\$(\w+)",
        lambda m: identity if m.group(1) == "identityLines" else values[m.group(1)],
        match.group(1),
    )


def test_the_windows_script_writes_the_same_config(installed: Installed, tmp_path: Path) -> None:
    values = {
        "EventHubsNamespace": VALUES["eventhubs-namespace"],
        "EventHub": VALUES["eventhub"],
        "LogsEndpoint": VALUES["logs-endpoint"],
        "DcrId": VALUES["dcr-id"],
        "Stream": "Custom-SeBridgeRecords",
        "StorageAccount": VALUES["storage-account"],
        "QueuePrefix": "se-bridge-",
        "VerifyKey": installed.verify_key,
        "ClientId": VALUES["client-id"],
    }
    text = _powershell_text(values)
    written = installed.root / "etc" / "se-bridge" / "agent.toml"
    assert tomllib.loads(text) == tomllib.loads(written.read_text(encoding="utf-8"))
    path = tmp_path / "agent.toml"
    path.write_text(text, encoding="utf-8")
    assert config.load(path, environ={}).commands.verify_key == installed.verify_key


def test_the_windows_script_installs_and_starts_the_service() -> None:
    text = POWERSHELL.read_text(encoding="utf-8")
    assert "Join-Path $env:ProgramFiles 'se-bridge'" in text
    assert "Join-Path $env:ProgramData 'se-bridge'" in text
    assert "@('service', 'install', '--config', $config)" in text
    assert "@('service', 'start')" in text
