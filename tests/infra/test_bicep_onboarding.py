"""The VM install scripts: the Linux one run into a temporary root, the Windows one's config."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shlex
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
from bridge.commands import signing
from tests.support import bicep, lock, sourcetree

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
    verify_keys: list[str]


def _args(verify_key: str, **overrides: str) -> list[str]:
    values = VALUES | {"verify-key": verify_key} | overrides
    return [part for key, value in values.items() for part in (f"--{key}", value)]


def _fake_systemctl(work: Path) -> tuple[dict[str, str], Path]:
    """A PATH whose systemctl only records its arguments, so a test sees every call."""
    fake_bin = work / "bin"
    fake_bin.mkdir()
    log = work / "systemctl.log"
    (fake_bin / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {log}\n', encoding="utf-8")
    (fake_bin / "systemctl").chmod(0o755)
    return os.environ | {"PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}"}, log


def _calls(log: Path) -> list[str]:
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's real wheel."""
    wheels = tmp_path_factory.mktemp("wheels")
    with sourcetree.building():
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
    (built,) = wheels.glob("se_bridge-*.whl")
    _sums(built)
    return built


def _sums(*files: Path, sha256: str | None = None) -> Path:
    """A SHA256SUMS beside `files` as a release has one (sha256sum's format); `sha256` in place
    of each file's own."""
    lines = [f"{sha256 or hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n" for f in files]
    sums = files[0].parent / "SHA256SUMS"
    sums.write_text("".join(lines), encoding="utf-8")
    return sums


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Installed:
    """install-agent.sh run once into a temporary root, with the project's real wheel and the
    two verify keys of a key rotation."""
    work = tmp_path_factory.mktemp("install")
    env, log = _fake_systemctl(work)
    old, new = _verify_key(), _verify_key()
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
    result = subprocess.run(
        [*command, *_args(old), "--verify-key", new],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    return Installed(root, result, _calls(log), [old, new])


def _installed_version(root: Path) -> str:
    # The venv's python where it was built (its scripts name the venv where it will live).
    python = root / "opt" / "se-bridge" / "venv" / "bin" / "python"
    done = subprocess.run([str(python), "-m", "bridge", "--version"], capture_output=True,
                          text=True, check=True)  # fmt: skip
    return done.stdout.strip()


def test_the_agent_is_installed_in_its_venv(installed: Installed) -> None:
    assert installed.result.returncode == 0, installed.result.stderr
    assert _installed_version(installed.root) == f"se-bridge {bridge.__version__}"


def test_the_agent_venv_holds_exactly_the_locked_agent_packages(installed: Installed) -> None:
    """The lock's agent export, installed in a fresh venv: nothing of the consumer extra."""
    got = lock.installed(installed.root / "opt" / "se-bridge" / "venv" / "bin" / "python")
    assert got == lock.locked("agent") | {"se-bridge": bridge.__version__}
    assert not set(got) & {lock.name(n) for n in extras.EXTRAS["consumer"]}


def test_the_agent_install_says_what_the_consumer_needs(installed: Installed) -> None:
    python = installed.root / "opt" / "se-bridge" / "venv" / "bin" / "python"
    se_bridge = [str(python), "-m", "bridge"]
    done = subprocess.run(
        [*se_bridge, "consume", "--hub", str(installed.root)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert "`consume` needs the consumer extra" in done.stderr
    assert "packaging/requirements/consumer.txt" in done.stderr
    assert "Traceback" not in done.stderr
    check = subprocess.run([*se_bridge, "agent", "--help"], capture_output=True, check=False)
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
    assert loaded.commands.verify_key == ",".join(installed.verify_keys)


def test_every_verify_key_given_is_trusted(installed: Installed) -> None:
    """Key rotation (docs/signed-commands.md): the agent trusts the old and the new key."""
    loaded = config.load(installed.root / "etc" / "se-bridge" / "agent.toml", environ={})
    verifier = signing.load_verifier(loaded.commands)
    assert verifier.key_ids == sorted(
        signing.key_id(signing.parse_public(key)) for key in installed.verify_keys
    )


def test_the_service_is_installed_and_enabled(installed: Installed) -> None:
    unit = installed.root / "etc" / "systemd" / "system" / "se-bridge-agent.service"
    assert unit.read_bytes() == UNIT.read_bytes()
    assert (
        "ExecStart=/opt/se-bridge/venv/bin/se-bridge agent --config /etc/se-bridge/agent.toml"
        in (unit.read_text(encoding="utf-8"))
    )
    # Installed under --root: the host's systemd is never asked to load or start anything.
    assert installed.systemctl_calls == []
    assert "not starting the service (--root)" in installed.result.stdout


def _hinted_command(installed: Installed) -> list[str]:
    (hint,) = [line for line in installed.result.stdout.splitlines() if "check it with: " in line]
    return shlex.split(hint.split("check it with: ", 1)[1])


def test_the_final_hint_names_a_command_that_runs(installed: Installed) -> None:
    """The hint's command is the venv's se-bridge by its full path: nothing puts the venv on
    PATH, and sudo's secure_path would not keep it."""
    command = _hinted_command(installed)
    assert command[1:] == ["check", "--config", "/etc/se-bridge/agent.toml"]
    executable = Path(command[0])
    assert executable.is_absolute()
    inside = installed.root / executable.relative_to("/")
    assert os.access(inside, os.X_OK)


# Where the tree installed under --root lives once that root is /.
FINAL_VENV = Path("/opt/se-bridge/venv")


def test_the_venv_names_no_staging_root(installed: Installed) -> None:
    """Every script of the venv, and its pyvenv.cfg, name the venv where it will live: a
    shebang into the --root directory fails once that directory is /."""
    venv = installed.root / FINAL_VENV.relative_to("/")
    named = [
        path.name
        for path in [*sorted((venv / "bin").iterdir()), venv / "pyvenv.cfg"]
        if path.is_file() and not path.is_symlink()
        and str(installed.root).encode() in path.read_bytes()
    ]  # fmt: skip
    assert named == []
    # pip writes a `#!/bin/sh` and `exec` line for a long path: the python is in the first three.
    head = (venv / "bin" / "se-bridge").read_text(encoding="utf-8").splitlines()[:3]
    assert f"{FINAL_VENV}/bin/python" in "\n".join(head)


def _where_it_will_live(root: Path, script: str) -> subprocess.CompletedProcess[str]:
    """`script` run in a private mount namespace where the tree under `root` is where it will
    live (its /opt/se-bridge at /opt/se-bridge) and `root` itself is hidden: what the VM sees
    once `root` is /. The host's mounts are left alone."""
    opt = root / "opt" / "se-bridge"
    inside = f"""set -e
mount -t tmpfs staging-hidden /opt
mkdir -p /opt/se-bridge
mount --bind {shlex.quote(str(opt))} /opt/se-bridge
mount -t tmpfs staging-hidden {shlex.quote(str(root))}
{script}
"""
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", inside],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_the_installed_tree_runs_where_it_will_live(installed: Installed) -> None:
    probe = _where_it_will_live(installed.root, "true")
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here (root and unshare needed): {probe.stderr}")
    done = _where_it_will_live(
        installed.root,
        f"{FINAL_VENV}/bin/se-bridge --version\n"
        f"{FINAL_VENV}/bin/pip --version\n"
        f"{FINAL_VENV}/bin/se-bridge agent --help >/dev/null",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"se-bridge {bridge.__version__}"
    assert str(FINAL_VENV) in done.stdout.splitlines()[1]  # pip runs from the venv there


def test_missing_azure_values_are_named_not_called_invalid(tmp_path: Path) -> None:
    root = tmp_path / "root"
    nothing = _run_script(*UNKNOWN_RELEASE, "--root", str(root))
    assert nothing.returncode == 2
    assert "is not valid" not in nothing.stderr, nothing.stderr
    for option in ("--eventhubs-namespace", "--logs-endpoint", "--dcr-id", "--storage-account",
                   "--verify-key"):  # fmt: skip
        assert option in nothing.stderr, (option, nothing.stderr)
    assert "--trial" in nothing.stderr
    some = _run_script(*UNKNOWN_RELEASE, "--root", str(root), "--dcr-id", VALUES["dcr-id"],
                       "--storage-account", VALUES["storage-account"])  # fmt: skip
    assert some.returncode == 2
    assert "--dcr-id" not in some.stderr, some.stderr
    assert "--storage-account" not in some.stderr, some.stderr
    assert "--eventhubs-namespace" in some.stderr
    assert not root.exists()


# What --pip-spec needs: an exact version and the hash of its file. This one matches no file.
UNKNOWN_RELEASE = ["--pip-spec", "se-bridge==0.1.0", "--pip-hash", "sha256:" + "0" * 64]


def _run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SHELL), *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=900,
    )


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
    result = _run_script(*UNKNOWN_RELEASE, "--root", str(root), "--no-start", *args)
    assert result.returncode == 2
    assert f"--{option}" in result.stderr
    assert not root.exists()


@pytest.mark.parametrize(
    ("spec", "hashes", "says"),
    [
        ("se-bridge", ["--pip-hash", "sha256:" + "0" * 64], "an exact version"),
        ("se-bridge>=0.1", ["--pip-hash", "sha256:" + "0" * 64], "an exact version"),
        ("se-bridge==0.1.0", [], "--pip-hash"),
        ("se-bridge==0.1.0", ["--pip-hash", "md5:0123"], "--pip-hash"),
    ],
)
def test_a_pip_spec_without_its_hash_installs_nothing(
    tmp_path: Path, spec: str, hashes: list[str], says: str
) -> None:
    """se-bridge comes from an index only as the exact file the release names: an unpinned
    spec or one without its sha256 would take whatever the index (or a squatter) serves."""
    root = tmp_path / "root"
    result = _run_script("--pip-spec", spec, *hashes, "--root", str(root), *_args(_verify_key()))
    assert result.returncode == 2, result.stderr
    assert says in result.stderr
    assert not root.exists()


def test_a_pip_spec_whose_file_has_another_hash_installs_nothing(
    tmp_path: Path, wheel: Path
) -> None:
    root = tmp_path / "root"
    # The index is the project's wheel folder: pip finds se-bridge there, with another hash.
    env = os.environ | {"PIP_FIND_LINKS": str(wheel.parent)}
    spec = ["--pip-spec", f"se-bridge=={bridge.__version__}", "--pip-hash", "sha256:" + "0" * 64]
    result = _run_script(
        *spec, "--python", sys.executable, "--root", str(root), *_args(_verify_key()), env=env
    )
    assert result.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in result.stderr
    assert not (root / "opt" / "se-bridge" / "venv" / "bin" / "se-bridge").exists()
    assert not (root / "etc" / "se-bridge").exists()


def _copy(wheel: Path, folder: Path) -> Path:
    folder.mkdir()
    copied = folder / wheel.name
    copied.write_bytes(wheel.read_bytes())
    return copied


def test_a_wheel_is_installed_only_with_the_sha256_its_release_lists(
    tmp_path: Path, wheel: Path
) -> None:
    """The wheel given is checked against the release's SHA256SUMS beside it (or --sums):
    one that is not the release's file, or has no sums to be checked against, installs
    nothing."""
    root = tmp_path / "root"
    args = ["--python", sys.executable, "--root", str(root), "--no-start", *_args(_verify_key())]
    alone = _copy(wheel, tmp_path / "alone")
    result = _run_script("--wheel", str(alone), *args)
    assert result.returncode == 2, result.stderr
    assert "SHA256SUMS" in result.stderr
    other = _copy(wheel, tmp_path / "other")
    _sums(other, sha256="0" * 64)
    result = _run_script("--wheel", str(other), *args)
    assert result.returncode == 2, result.stderr
    assert f"is not the {'0' * 64} that" in result.stderr
    unlisted = _copy(wheel, tmp_path / "unlisted")
    (unlisted.parent / "SHA256SUMS").write_text(f"{'1' * 64}  something-else.txt\n")
    result = _run_script("--wheel", str(unlisted), *args)
    assert result.returncode == 2, result.stderr
    assert f"lists no sha256 for {unlisted.name}" in result.stderr
    # --sums names the file when it is not beside the wheel.
    result = _run_script("--wheel", str(alone), "--sums", str(other.parent / "SHA256SUMS"), *args)
    assert result.returncode == 2, result.stderr
    assert "is not the" in result.stderr
    assert not root.exists()


def test_the_sums_are_checked_against_the_release_workflows_attestation(
    tmp_path: Path, wheel: Path
) -> None:
    """--attested-by OWNER/REPO: gh checks that the release workflow of that repository
    signed SHA256SUMS (its build provenance) before a line of it is trusted."""
    log = tmp_path / "gh.log"
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "gh").write_text(f'#!/bin/sh\necho "$*" >> {log}\nexit 1\n', encoding="utf-8")
    (fake_bin / "gh").chmod(0o755)
    env = os.environ | {"PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}"}
    root = tmp_path / "root"
    result = _run_script("--wheel", str(wheel), "--attested-by", "contoso/se-bridge",
                         "--python", sys.executable, "--root", str(root), "--no-start",
                         *_args(_verify_key()), env=env)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "attestation" in result.stderr
    sums = wheel.parent / "SHA256SUMS"
    assert log.read_text().split() == ["attestation", "verify", str(sums), "--repo",
                                       "contoso/se-bridge"]  # fmt: skip
    assert not root.exists()


def test_a_python_older_than_3_10_is_refused_before_anything_changes(tmp_path: Path) -> None:
    # Python 3.9 as far as a check can tell: it prints its version and fails the comparison;
    # it records every call, so the test sees that nothing was asked to make a venv.
    log = tmp_path / "python.log"
    old = tmp_path / "python3.9"
    old.write_text(f'#!/bin/sh\necho "$*" >> {log}\necho 3.9.18\nexit 1\n', encoding="utf-8")
    old.chmod(0o755)
    root = tmp_path / "root"
    result = _run_script(
        *UNKNOWN_RELEASE, "--python", str(old), "--root", str(root), *_args(_verify_key())
    )
    assert result.returncode == 2
    assert f"{old} is Python 3.9.18: the agent needs Python 3.10 or newer" in result.stderr
    assert "-m venv" not in log.read_text(encoding="utf-8")
    assert not root.exists()
    missing = _run_script(
        *UNKNOWN_RELEASE, "--python", "no-such-python3", "--root", str(root), *_args(_verify_key())
    )
    assert missing.returncode == 2
    assert "no-such-python3 is not on PATH: the agent needs Python 3.10 or newer" in (
        missing.stderr
    )
    assert not root.exists()


@pytest.fixture(scope="module")
def trial(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Installed:
    """A trial install: local sinks only, se-bridge from an index by its exact version and hash
    (the index here is the project's wheel folder)."""
    work = tmp_path_factory.mktemp("trial")
    env, log = _fake_systemctl(work)
    env |= {"PIP_FIND_LINKS": str(wheel.parent)}
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    root = work / "root"
    result = _run_script(
        "--trial",
        "--pip-spec",
        f"se-bridge=={bridge.__version__}",
        "--pip-hash",
        f"sha256:{digest}",
        "--python",
        sys.executable,
        "--root",
        str(root),
        env=env,
    )
    return Installed(root, result, _calls(log), [])


def test_a_trial_install_writes_local_sinks_only(trial: Installed) -> None:
    assert trial.result.returncode == 0, trial.result.stderr
    assert _installed_version(trial.root) == f"se-bridge {bridge.__version__}"
    loaded = config.load(trial.root / "etc" / "se-bridge" / "agent.toml", environ={})
    assert loaded.sink_specs() == ["jsonl:/var/lib/se-bridge/records.jsonl"]
    assert loaded.commands.channel == ""
    assert "/var/lib/se-bridge/records.jsonl" in trial.result.stdout
    assert trial.systemctl_calls == []


@pytest.mark.parametrize("option", ["--eventhubs-namespace", "--verify-key", "--storage-account"])
def test_a_trial_takes_no_azure_value(tmp_path: Path, option: str) -> None:
    root = tmp_path / "root"
    args = _args(_verify_key())
    value = args[args.index(option) + 1]
    result = _run_script("--trial", *UNKNOWN_RELEASE, "--root", str(root), option, value)
    assert result.returncode == 2
    assert f"--trial writes local sinks only: leave out {option}" in result.stderr
    assert not root.exists()


def _powershell_text(values: dict[str, str], variable: str = "toml") -> str:
    """The TOML install-agent.ps1 writes, variables filled in as PowerShell expands them."""
    text = POWERSHELL.read_text(encoding="utf-8")
    match = re.search(rf'^\${variable} = @"\n(.*?)\n"@$', text, re.MULTILINE | re.DOTALL)
    assert match, f"install-agent.ps1 has no ${variable} here-string"
    identity = 'kind = "managed"\nclient_id = "' + values.get("ClientId", "") + '"'
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
        "verifyKeys": ",".join(installed.verify_keys),
        "ClientId": VALUES["client-id"],
    }
    text = _powershell_text(values)
    written = installed.root / "etc" / "se-bridge" / "agent.toml"
    assert tomllib.loads(text) == tomllib.loads(written.read_text(encoding="utf-8"))
    path = tmp_path / "agent.toml"
    path.write_text(text, encoding="utf-8")
    loaded = config.load(path, environ={})
    assert len(signing.load_verifier(loaded.commands).key_ids) == 2


def test_the_windows_trial_writes_the_same_config(trial: Installed) -> None:
    text = _powershell_text({}, variable="trialToml")
    written = trial.root / "etc" / "se-bridge" / "agent.toml"
    assert tomllib.loads(text) == tomllib.loads(written.read_text(encoding="utf-8"))


def _powershell_code() -> str:
    """install-agent.ps1 without its comments and here-strings."""
    text = POWERSHELL.read_text(encoding="utf-8")
    text = re.sub(r'@"\n.*?\n"@', "", text, flags=re.DOTALL)
    text = re.sub(r"<#.*?#>", "", text, flags=re.DOTALL)
    return "\n".join(
        line.split(" #")[0] for line in text.splitlines() if not line.lstrip().startswith("#")
    )


def test_the_windows_script_installs_and_starts_the_service() -> None:
    text = POWERSHELL.read_text(encoding="utf-8")
    assert "Join-Path $env:ProgramFiles 'se-bridge'" in text
    assert "Join-Path $env:ProgramData 'se-bridge'" in text
    assert "@('service', 'install', '--config', $config)" in text
    assert "@('service', 'start')" in text


# PowerShell is not on this machine: these read the .ps1 for what the Linux tests run.
def test_the_windows_script_installs_from_an_index_only_with_hashes() -> None:
    """Every pip install checks hashes, but the local wheel's (the one file the operator
    brought); pip itself is the venv's own, never upgraded from an index."""
    installs = [line for line in _powershell_code().splitlines() if "'pip', 'install'" in line]
    assert len(installs) == 3
    unhashed = [line for line in installs if "'--require-hashes'" not in line]
    assert len(unhashed) == 1
    assert unhashed[0].rstrip().endswith("'--no-deps', $Wheel)")
    assert "'--upgrade'" not in _powershell_code()
    assert re.search(
        r"ValidatePattern\('\^se-bridge==[^']*'\)\]\[string\]\$PipSpec", _powershell_code()
    )
    assert re.search(
        r"\[Parameter\(Mandatory, ParameterSetName = 'PipSpec'\)\]"
        r"\[ValidatePattern\('\^sha256:\[0-9a-f\]\{64\}\$'\)\]\[string\[\]\]\$PipHash",
        _powershell_code(),
    )


def test_the_windows_script_checks_the_wheel_against_its_sums_before_it_changes_anything() -> None:
    """As install-agent.sh: -Wheel is installed only when the SHA256SUMS beside it (or -Sums)
    lists its sha256, checked before the venv is made."""
    code = _powershell_code()
    assert "[Parameter(ParameterSetName = 'Wheel')][string]$Sums" in code
    check = code.index("(Get-FileHash -LiteralPath $Wheel -Algorithm SHA256)")
    assert check < code.index("'-m', 'venv'")
    assert "lists no sha256 for $name" in code
    assert "it is not the release's file; nothing installed" in code


def test_the_windows_script_checks_python_before_it_changes_anything() -> None:
    code = _powershell_code()
    check = code.index("sys.version_info < (3, 10)")
    assert check < code.index("'-m', 'venv'")
    assert "needs Python 3.10 or newer" in code
    assert "'-3.11'" not in code  # any Python 3.10 or newer the launcher has


def test_the_windows_script_takes_what_another_user_created_before_writing() -> None:
    """A user may create %ProgramData%\\se-bridge (or agent.toml in it) before the install and
    would then own it: Administrators take ownership of the folder and replace its ACL in one
    step (no window in which another user can add a file), then take all that is inside and
    drop its own grants; agent.toml is removed and written anew, open to SYSTEM and
    Administrators only."""
    code = _powershell_code()
    take_folder = code.index("@('/F', $ConfigDir, '/A')")
    close = code.index("Set-Acl -LiteralPath $ConfigDir -AclObject (New-AdminOnlyAcl -Directory)")
    take_inside = code.index("@('/F', $ConfigDir, '/A', '/R', '/D', 'Y')")
    reset_inside = code.index("@((Join-Path $ConfigDir '*'), '/reset', '/T', '/C', '/Q')")
    remove = code.index("Remove-Item -LiteralPath $config -Force")
    write = code.index("[System.IO.File]::WriteAllText($config")
    restrict = code.index("Set-Acl -LiteralPath $config -AclObject (New-AdminOnlyAcl)")
    assert take_folder < close < take_inside < reset_inside < remove < write < restrict
    assert code.count("'takeown.exe'") == 2
    # Protected, and granted to SYSTEM and Administrators by SID alone.
    assert "$acl.SetAccessRuleProtection($true, $false)" in code
    assert "@('S-1-5-18', 'S-1-5-32-544')" in code
    assert "BUILTIN" not in code
    assert "NT AUTHORITY" not in code


def test_the_windows_script_takes_several_verify_keys_and_a_trial() -> None:
    code = _powershell_code()
    assert re.search(r"\[string\[\]\]\$VerifyKey", code)
    assert "$verifyKeys = $VerifyKey -join ','" in code
    assert "[switch]$Trial" in code
    assert "-Trial writes local sinks only: leave out" in code
