"""`./dev`, the developer's command: what each sub-command sets up, seen through a copy of the
script whose Python, npm and venvs only record what they are asked (nothing is installed),
and `./dev lock --check` run on a copy of the lock."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import markers
from tools import lockfile

ROOT = lockfile.ROOT
# What ./dev reads to decide what to set up.
INPUTS = (
    "dev",
    "pyproject.toml",
    "package-lock.json",
    "tools/requirements-scan.txt",
    "tools/requirements-sbom.txt",
    "tools/requirements-image.txt",
    *(f"packaging/requirements/{target}.txt" for target in lockfile.TARGETS),
)
# Answers like a Python 3.13 that makes venvs: `-m venv DIR` copies it to DIR/bin/python,
# and every call is recorded as `WHO ARGS`, WHO its path relative to the tree.
FAKE_PYTHON = """#!/bin/sh
echo "${0#$TREE/} $*" >> "$LOG"
if [ "$1" = "--version" ]; then echo "Python ${VERSION:-3.13.0}"; fi
# What Material for MkDocs 9.7 and later print at every start, unless told not to.
if [ "$2" = "mkdocs" ] && [ -z "$NO_MKDOCS_2_WARNING" ]; then
  echo "Material for MkDocs reaches end of life on May 5, 2027." >&2
fi
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi
exit 0
"""


def python(version: str) -> str:
    """A stand-in Python that says it is `version`, and otherwise acts as FAKE_PYTHON."""
    return FAKE_PYTHON.replace("${VERSION:-3.13.0}", version)


@dataclass
class Run:
    result: subprocess.CompletedProcess[str]
    calls: list[str]
    tree: Path

    def installed(self, venv: str) -> list[str]:
        """The `pip install` arguments given to `venv`'s Python."""
        prefix = f"{venv}/bin/python -m pip install "
        return [c.removeprefix(prefix) for c in self.calls if c.startswith(prefix)]


# A pyenv shim of a version pyenv has not selected: found on PATH, but running it fails.
PYENV_SHIM = """#!/bin/sh
echo "pyenv: ${0##*/}: command not found" >&2
exit 127
"""


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)


def _system_path(tmp_path: Path) -> str:
    """A PATH of the system's commands with no Python on it: every program of PATH's
    directories, linked, except those named python*."""
    linked = tmp_path / "system"
    linked.mkdir()
    for directory in reversed(os.environ["PATH"].split(os.pathsep)):
        if not Path(directory).is_dir() or ".pyenv" in directory:
            continue
        for program in Path(directory).iterdir():
            if not program.name.startswith("python"):
                (linked / program.name).unlink(missing_ok=True)
                (linked / program.name).symlink_to(program)
    return str(linked)


def _env(tmp_path: Path, tree: Path) -> dict[str, str]:
    """The environment `_dev` runs ./dev in: the fakes first, then the system's commands."""
    return os.environ | {
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{tmp_path / 'system'}",
        "TREE": str(tree),
        "LOG": str(tmp_path / "calls.log"),
    }


def _dev(
    tmp_path: Path,
    *args: str,
    tools: tuple[str, ...] = (),
    venv: str = ".venv",
    pythons: dict[str, str] | None = None,
) -> Run:
    """Run ./dev ARGS in a copy; `tools` are `venv`/bin programs that record their calls too.
    `pythons` are the only Pythons on PATH, by name and script (a Python 3.13 by default)."""
    tree = tmp_path / "tree"
    for name in INPUTS:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    for name in tools:
        (tree / "node_modules").mkdir(exist_ok=True)  # what the fake npm would have made
        _executable(tree / venv / "bin" / name, FAKE_PYTHON)
    fake = tmp_path / "bin"
    fake.mkdir()
    for name, script in {"npm": FAKE_PYTHON, **(pythons or {"python3.13": FAKE_PYTHON})}.items():
        _executable(fake / name, script)
    log = tmp_path / "calls.log"
    _system_path(tmp_path)  # the system's commands, linked into tmp_path/system
    result = subprocess.run(
        [str(tree / "dev"), *args],
        capture_output=True,
        text=True,
        env=_env(tmp_path, tree),
        timeout=60,
        check=False,
    )
    calls = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    return Run(result, [re.sub(r"^\S*/bin/(npm|python3[.0-9]*)", r"\1", c) for c in calls], tree)


def test_sbom_sets_up_the_sbom_tool_and_not_the_scanner(tmp_path: Path) -> None:
    """checkov (about 300 MB) scans infra/ in the tests; the SBOM needs only cyclonedx-py."""
    run = _dev(tmp_path, "sbom")
    assert run.result.returncode == 0, run.result.stderr
    assert run.installed(".venv-sbom") == [
        "--quiet --disable-pip-version-check -r tools/requirements-sbom.txt"
    ]
    assert not (run.tree / ".venv-tools").exists()
    assert not any("requirements-scan.txt" in call for call in run.calls)
    assert ".venv/bin/python -m tools.sbom" in run.calls


def test_docs_serves_the_site_with_the_docs_tools_only(tmp_path: Path) -> None:
    """Reading the docs needs MkDocs and its theme, from the lock with their hashes: not the
    test environment, Node (Azurite, the Kusto parser) or checkov."""
    run = _dev(tmp_path, "docs", "--dev-addr", "127.0.0.1:8001")
    assert run.result.returncode == 0, run.result.stderr
    assert run.installed(".venv-docs") == [
        "--quiet --disable-pip-version-check --require-hashes --only-binary :all: "
        "-r packaging/requirements/docs.txt"
    ]
    assert run.calls[-1] == ".venv-docs/bin/python -m mkdocs serve --dev-addr 127.0.0.1:8001"
    assert "end of life" not in run.result.stderr  # the theme's banner, at every start
    assert not any(call.startswith("npm") for call in run.calls)
    assert not [c for c in run.calls if c.startswith(".venv/")]
    for other in (".venv", ".venv-tools", ".venv-sbom", "node_modules"):
        assert not (run.tree / other).exists()


def test_generate_rewrites_the_generated_docs_infra_and_workbook(tmp_path: Path) -> None:
    run = _dev(tmp_path, "generate")
    assert run.result.returncode == 0, run.result.stderr
    tools = [c for c in run.calls if c.startswith(".venv/bin/python -m tools.")]
    assert tools == [
        ".venv/bin/python -m tools.sync_docs",
        ".venv/bin/python -m tools.gen_infra",
        ".venv/bin/python -m tools.gen_recordtypes",
        ".venv/bin/python -m tools.kql.workbook",
    ]
    assert not any(call.startswith("npm") for call in run.calls)


def test_the_demo_runs_on_python_3_10_with_the_consumers_packages_only(tmp_path: Path) -> None:
    """The README's first command on Ubuntu 22.04's Python: the product runs on 3.10, and the
    demo needs only it and the consumer's packages (issue 39), not the test tools (3.11)."""
    run = _dev(
        tmp_path,
        "demo",
        "--duration",
        "5",
        tools=("se-bridge",),
        venv=".venv-demo",
        pythons={"python3": python("3.10.12")},
    )
    assert run.result.returncode == 0, run.result.stderr
    assert "python3 -m venv .venv-demo" in run.calls
    quiet = "--quiet --disable-pip-version-check"
    assert run.installed(".venv-demo") == [
        f"{quiet} --upgrade pip",
        f"{quiet} --require-hashes -r packaging/requirements/consumer.txt",
        f"{quiet} --no-deps -e .",
    ]
    assert run.calls[-1] == ".venv-demo/bin/se-bridge demo --duration 5"
    assert not (run.tree / ".venv").exists()


@pytest.mark.parametrize(
    ("command", "found", "needed"),
    [
        ("demo", "3.9.18", "./dev demo needs Python 3.10 or newer on PATH"),
        ("test", "3.10.12", "./dev test needs Python 3.11 or newer on PATH"),
        ("docs", "3.10.12", "./dev docs needs Python 3.11 or newer on PATH"),
    ],
)
def test_a_python_too_old_stops_dev_with_a_sentence_and_exit_2(
    tmp_path: Path, command: str, found: str, needed: str
) -> None:
    run = _dev(tmp_path, command, pythons={"python3": python(found)})
    assert run.result.returncode == 2, run.result.stderr
    assert run.result.stderr.splitlines() == [f"{needed}; python3 is Python {found}"]
    assert not [c for c in run.calls if "-m venv" in c]


def test_the_python_probe_is_quiet_about_pyenv_shims_of_other_versions(tmp_path: Path) -> None:
    """pyenv puts a shim of every version it has on PATH; one not selected fails when run."""
    shims = dict.fromkeys(("python3.13", "python3.12", "python3.10"), PYENV_SHIM)
    run = _dev(tmp_path, "demo", tools=("se-bridge",), venv=".venv-demo",
               pythons={**shims, "python3.11": python("3.11.7")})  # fmt: skip
    assert run.result.returncode == 0, run.result.stderr
    assert "command not found" not in run.result.stderr
    assert "python3.11 -m venv .venv-demo" in run.calls


TEST_TOOLS = ("ruff", "mypy", "lint-imports", "pytest")
LINTS = [".venv/bin/ruff check .", ".venv/bin/ruff format --check ."]
# Two workers per core, each module on one worker.
PYTEST = f".venv/bin/pytest -n {2 * (os.cpu_count() or 1)} --dist loadscope --durations=15"


def _test_checks(tmp_path: Path, *args: str) -> list[str]:
    """What `./dev test ARGS` runs of the test command's tools, in order."""
    run = _dev(tmp_path, "test", *args, tools=TEST_TOOLS)
    assert run.result.returncode == 0, run.result.stderr
    tools = {f".venv/bin/{t}" for t in TEST_TOOLS}
    return [c.strip() for c in run.calls if c.split()[0] in tools]


def test_test_runs_every_check_and_the_whole_suite_on_every_core(tmp_path: Path) -> None:
    """The lints first; the type and layering checks beside the tests, in either order."""
    checks = _test_checks(tmp_path, "-k", "normalise")
    assert checks[:2] == LINTS
    assert sorted(checks[2:]) == sorted(
        [".venv/bin/mypy", ".venv/bin/lint-imports --no-cache", f"{PYTEST} -k normalise"]
    )
    assert checks.index(".venv/bin/mypy") < checks.index(".venv/bin/lint-imports --no-cache")


def test_the_tests_keep_compiled_modules_outside_the_tree_whatever_the_machine_says(
    tmp_path: Path,
) -> None:
    """Where PYTHONDONTWRITEBYTECODE is set, each process the tests start compiled the project
    anew: a third of a subprocess test's CPU, and CI over its 15 minutes."""
    run = _dev(tmp_path, "test", tools=TEST_TOOLS)
    said = 'echo "pytest prefix=$PYTHONPYCACHEPREFIX dont=${PYTHONDONTWRITEBYTECODE:-}" >> "$LOG"'
    _executable(run.tree / ".venv" / "bin" / "pytest", f"#!/bin/sh\n{said}\n")
    (tmp_path / "calls.log").unlink()
    again = subprocess.run(
        [str(run.tree / "dev"), "test"],
        capture_output=True,
        text=True,
        env=_env(tmp_path, run.tree) | {"PYTHONDONTWRITEBYTECODE": "1"},
        timeout=60,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    calls = (tmp_path / "calls.log").read_text(encoding="utf-8").splitlines()
    assert f"pytest prefix={run.tree}/.venv/pycache dont=" in calls


# A stand-in for a tool that finds something: it says so and exits 1.
FAILING_TOOL = FAKE_PYTHON.replace("exit 0", 'echo "$0: 1 error" >&2; exit 1')


@pytest.mark.parametrize("failing", ["mypy", "pytest"])
def test_test_fails_when_the_tests_or_the_checks_beside_them_fail(
    tmp_path: Path, failing: str
) -> None:
    run = _dev(tmp_path, "test", tools=TEST_TOOLS)
    _executable(run.tree / ".venv" / "bin" / failing, FAILING_TOOL)
    (tmp_path / "calls.log").unlink()
    again = subprocess.run(
        [str(run.tree / "dev"), "test"],
        capture_output=True,
        text=True,
        env=_env(tmp_path, run.tree),
        timeout=60,
        check=False,
    )
    assert again.returncode == 1
    assert f"{failing}: 1 error" in again.stdout + again.stderr


def test_test_fast_leaves_out_the_heavy_markers_and_the_slow_checks(tmp_path: Path) -> None:
    assert _test_checks(tmp_path, "--fast", "tests/unit") == [
        *LINTS,
        f"{PYTEST} -m {markers.FAST} tests/unit",
    ]


def test_the_usage_names_every_command(tmp_path: Path) -> None:
    run = _dev(tmp_path, "nonsense")
    assert run.result.returncode == 2
    for command in ("demo", "test", "docs", "generate", "lock", "sbom"):
        assert f"./dev {command}" in run.result.stderr


def test_ci_and_the_readme_run_the_two_commands() -> None:
    assert (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()[-1] == "exec ./dev test"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = readme.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[:2] for line in first_block] == [["./dev", "demo"], ["./dev", "test"]]


def test_the_built_site_is_ignored_by_git() -> None:
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", "site/index.html"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.stdout.strip() == "site/index.html"


def _lock_tree(tmp_path: Path) -> Path:
    """The lock, its exports, pyproject.toml and tools/lockfile.py, copied."""
    tree = tmp_path / "lock"
    for name in (
        "pyproject.toml",
        "uv.lock",
        "README.md",
        "tools/__init__.py",
        "tools/lockfile.py",
    ):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(lockfile.EXPORTS, tree / "packaging" / "requirements")
    return tree


def _check(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.lockfile", "--check"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_lock_check_says_that_all_is_current(tmp_path: Path) -> None:
    done = _check(_lock_tree(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"uv.lock and its {len(lockfile.TARGETS)} exports in packaging/requirements "
        "match pyproject.toml\n"
    )


@pytest.mark.parametrize(
    ("before", "after"),
    [
        # A dependency no index here has: uv's resolver would fail on it, offline or not.
        ('"requests>=2.31,<3",', '"requests>=2.31,<3", "se-bridge-no-such-package>=1",'),
        ('"requests>=2.31,<3",', '"requests>=2.32,<3",'),
        ('"ruff==0.17.6",', ""),
    ],
)
def test_lock_check_says_that_pyproject_changed(tmp_path: Path, before: str, after: str) -> None:
    tree = _lock_tree(tmp_path)
    pyproject = tree / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    assert before in text
    pyproject.write_text(text.replace(before, after, 1), encoding="utf-8")
    done = _check(tree)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == "pyproject.toml changed: run ./dev lock"
    assert "resolv" not in done.stderr.lower()
    assert "hint" not in done.stderr


def test_lock_check_names_an_export_that_is_not_the_locks(tmp_path: Path) -> None:
    tree = _lock_tree(tmp_path)
    agent = tree / "packaging" / "requirements" / "agent.txt"
    agent.write_text(agent.read_text(encoding="utf-8") + "extra==1\n", encoding="utf-8")
    done = _check(tree)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "packaging/requirements/agent.txt is not uv.lock's export: run ./dev lock"
    ]
