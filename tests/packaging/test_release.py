"""`./dev release` (tools/release.py): the files of a release, installed the way the docs say."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

from bridge import __version__
from tests.support import lock
from tools import lockfile, release, sbom

pytestmark = pytest.mark.release

ROOT = Path(__file__).resolve().parents[2]
WHEEL = f"se_bridge-{__version__}-py3-none-any.whl"
SDIST = f"se_bridge-{__version__}.tar.gz"
TARGETS = ("agent", "kubernetes", "consumer", "functions")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    release.build(out)
    return out


def run(argv: list[str], cwd: Path | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, cwd=cwd)
    assert done.returncode == 0, f"{argv}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_a_release_is_the_sdist_the_wheel_and_each_targets_requirements_and_sbom(
    dist: Path,
) -> None:
    names = {path.name for path in dist.iterdir()}
    assert names == {
        SDIST,
        WHEEL,
        "SHA256SUMS",
        *(f"se-bridge-{__version__}-requirements-{target}.txt" for target in TARGETS),
        *(f"se-bridge-{target}-{__version__}.cdx.json" for target in TARGETS),
    }
    for target in TARGETS:
        requirements = dist / f"se-bridge-{__version__}-requirements-{target}.txt"
        assert (
            requirements.read_bytes()
            == (ROOT / "packaging" / "requirements" / f"{target}.txt").read_bytes()
        )


@pytest.mark.parametrize("target", sbom.TARGETS)
def test_the_sbom_lists_every_locked_package_with_its_hashes(dist: Path, target: str) -> None:
    # The release's SBOM, written by tools/sbom.py as `./dev sbom` writes it: writing it again
    # here would cost about 4 s of CPU a target, on the two cores that limit CI's test run.
    document = json.loads((dist / f"se-bridge-{target}-{__version__}.cdx.json").read_text("utf-8"))
    assert document["bomFormat"] == "CycloneDX"
    assert document["specVersion"] == "1.6"
    described = document["metadata"]["component"]
    assert (described["name"], described["version"]) == ("se-bridge", __version__)
    text = (lockfile.EXPORTS / f"{target}.txt").read_text(encoding="utf-8")
    pins = set(re.findall(r"^([A-Za-z0-9._-]+==\S+)", text, re.MULTILINE))
    listed = {f"{c['name']}=={c['version']}" for c in document["components"]}
    assert listed == pins
    for component in document["components"]:
        hashes = [h for ref in component["externalReferences"] for h in ref.get("hashes", [])]
        assert hashes, component["name"]


def test_sha256sums_checks_every_file_and_catches_a_changed_one(dist: Path, tmp_path: Path) -> None:
    listed = run(["sha256sum", "--check", "SHA256SUMS"], cwd=dist)
    assert listed.count(": OK") == len(list(dist.iterdir())) - 1
    copy = tmp_path / "copy"
    shutil.copytree(dist, copy)
    with (copy / WHEEL).open("ab") as wheel:
        wheel.write(b"\0")
    done = subprocess.run(
        ["sha256sum", "--check", "SHA256SUMS"],
        cwd=copy,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert f"{WHEEL}: FAILED" in done.stdout


def test_the_wheel_and_sdist_carry_the_version_the_license_and_the_package_data(dist: Path) -> None:
    with zipfile.ZipFile(dist / WHEEL) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(f"se_bridge-{__version__}.dist-info/METADATA").decode()
    assert f"\nVersion: {__version__}\n" in metadata
    assert "License-Expression: MIT" in metadata
    assert f"se_bridge-{__version__}.dist-info/licenses/LICENSE" in names
    assert {"bridge/record.schema.json", "bridge/py.typed"} <= set(names)
    assert not [name for name in names if name.startswith("tests/")]
    with tarfile.open(dist / SDIST) as sdist:
        inside = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"pyproject.toml", "LICENSE", "README.md", "bridge/record.schema.json"} <= inside
    assert {name for name in names if name.startswith("bridge/")} <= inside


def test_one_commit_builds_the_same_bytes(dist: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    release.build(again)
    assert (again / "SHA256SUMS").read_text() == (dist / "SHA256SUMS").read_text()


def test_the_agent_installs_from_the_release_files_as_the_docs_say(
    dist: Path, tmp_path: Path
) -> None:
    target = tmp_path / "venv"
    venv.create(target, with_pip=True, symlinks=sys.platform != "win32")
    bin_dir = target / ("Scripts" if sys.platform == "win32" else "bin")
    pip = [str(bin_dir / "python"), "-m", "pip", "--disable-pip-version-check", "-q", "install"]
    requirements = dist / f"se-bridge-{__version__}-requirements-agent.txt"
    run([*pip, "--require-hashes", "--only-binary", ":all:", "-r", str(requirements)])
    run([*pip, "--no-deps", str(dist / WHEEL)])
    assert run([str(bin_dir / "se-bridge"), "--version"]).strip() == f"se-bridge {__version__}"
    assert lock.installed(bin_dir / "python") == lock.locked("agent") | {"se-bridge": __version__}


def test_release_replaces_an_earlier_release_but_never_other_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match=r"not a release's \(notes\.txt\)"):
        release.build(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_version_lives_in_one_place() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'dynamic = ["version"]' in pyproject
    assert 'version = { attr = "bridge.__version__" }' in pyproject
    project = pyproject.split("[project]", 1)[1].split("\n[", 1)[0]
    assert "\nversion =" not in project


def test_nothing_tells_anyone_to_install_se_bridge_from_an_index() -> None:
    # Until se-bridge is published, the name on PyPI is anyone's: the docs, the messages and the
    # install scripts install from a release's files or a checkout, never by name.
    by_name = re.compile(r"pip3? install (?:-\S+ )*['\"`]?se-bridge(?:\[|==|['\"`\s]|$)")
    places = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "bridge").rglob("*.py")]
    places += [*(ROOT / "infra" / "onboarding").iterdir()]
    found = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path in places
        for line in path.read_text(encoding="utf-8").splitlines()
        if by_name.search(line) and "never" not in line
    ]
    assert found == []
