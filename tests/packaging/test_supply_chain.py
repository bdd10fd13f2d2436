"""The supply chain: compatible ranges in pyproject.toml, one lock file with hashes and its
exports, the Function App's folder installing in hash-checking mode in a fresh venv. (The
Dockerfile's and install-agent.sh's installs from the lock are tested beside them:
test_dockerfile.py, tests/infra/test_bicep_onboarding.py; each target's SBOM in
test_release.py, on the release's SBOMs, which tools/sbom.py wrote.)"""

from __future__ import annotations

import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from bridge import __version__
from tests.support import lock, sourcetree
from tools import functionapp, lockfile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

PYPROJECT = tomllib.loads((lockfile.ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_uv_lock_matches_pyproject_and_every_export_is_the_locks() -> None:
    assert lockfile.stale() == []


def test_runtime_dependencies_are_ranges_not_pins() -> None:
    project = PYPROJECT["project"]
    runtime = [*project["dependencies"]]
    for extra in ("agent", "kubernetes", "consumer", "functions"):
        runtime += project["optional-dependencies"][extra]
    assert runtime
    assert [d for d in runtime if "==" in d.split(";")[0]] == []


@pytest.mark.parametrize("target", sorted(lockfile.TARGETS))
def test_every_package_of_an_export_is_pinned_with_its_hashes(target: str) -> None:
    text = (lockfile.EXPORTS / f"{target}.txt").read_text(encoding="utf-8")
    requirements = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
    assert len(requirements) > 10
    for requirement in requirements:
        head = requirement.split()[0]
        assert re.fullmatch(r"[A-Za-z0-9._-]+==\S+", head), requirement
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", requirement), requirement


def test_the_agent_export_holds_nothing_of_the_consumer_extra() -> None:
    agent = set(lock.locked("agent"))
    assert "cryptography" in agent
    assert "azure-eventhub" in agent
    for only_consumer in ("azure-data-tables", "fastjsonschema", "azure-keyvault-secrets"):
        assert only_consumer not in agent
        assert only_consumer in lock.locked("consumer")
    assert "azure-functions" in lock.locked("functions")
    assert "azure-functions" not in lock.locked("consumer")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with sourcetree.building():
        return functionapp.build(tmp_path_factory.mktemp("functionapp") / "app")


def test_the_function_app_folder_names_every_file_with_its_hash(app: Path) -> None:
    text = app.read_text(encoding="utf-8")
    [wheel] = (app.parent / "wheels").glob("se_bridge-*.whl")
    own = f"./wheels/{wheel.name} \\\n    --hash=sha256:{functionapp.sha256(wheel)}\n"
    assert text.endswith(own)
    # Every other requirement is the lock's functions export, word for word.
    export = (lockfile.EXPORTS / "functions.txt").read_text(encoding="utf-8")
    assert export.split("\n", 2)[2] in text
    assert "--find-links" not in text
    assert "--index-url" not in text
    for name in functionapp.APP_FILES:
        assert (app.parent / name).read_bytes() == (functionapp.APP / name).read_bytes()


def _venv(path: Path) -> Path:
    venv.create(path, with_pip=True)
    return path / "bin" / "python"


def _pip_install(python: Path, requirements: Path) -> subprocess.CompletedProcess[str]:
    # Run where the Functions build runs it: in the app folder (./wheels/... is relative).
    return subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "-r",
            requirements.name,
        ],
        cwd=requirements.parent,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_function_app_installs_exactly_the_locked_packages(app: Path, tmp_path: Path) -> None:
    python = _venv(tmp_path / "venv")
    done = _pip_install(python, app)
    assert done.returncode == 0, done.stderr
    assert lock.installed(python) == lock.locked("functions") | {"se-bridge": __version__}


def test_a_wheel_that_is_not_the_built_one_is_refused(app: Path, tmp_path: Path) -> None:
    """What the hash is for: a se-bridge wheel with other bytes (a package of the same name
    from an index, say) does not install."""
    [wheel] = (app.parent / "wheels").glob("se_bridge-*.whl")
    original = wheel.read_bytes()
    try:
        with zipfile.ZipFile(wheel, "a") as archive:
            archive.writestr("bridge/injected.py", "print('not ours')\n")
        done = _pip_install(_venv(tmp_path / "venv"), app)
    finally:
        wheel.write_bytes(original)
    assert done.returncode != 0
    assert "DO NOT MATCH THE HASHES" in done.stderr


def test_a_folder_not_made_by_the_tool_is_never_emptied(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"not made by \./dev functionapp"), sourcetree.building():
        functionapp.build(tmp_path)
    assert (tmp_path / "precious.txt").read_text(encoding="utf-8") == "keep me"
