"""The lock file and its exports (`./dev lock`, and `--check` in the test suite).

uv.lock is the one lock file: every package each target installs, at one version, with the
sha256 of every file PyPI has of it, resolved once for every platform and Python se-bridge
supports. What each target installs is an export of it (packaging/requirements/TARGET.txt):
pip reads them with `--require-hashes`, so the Dockerfile, the install scripts, the Functions
build and the test environment install the same bytes. An export is never edited by hand:
`./dev lock` re-resolves after pyproject.toml changes and writes them again.

    python -m tools.lockfile            # uv lock, then rewrite the exports
    python -m tools.lockfile --upgrade  # newest versions the ranges allow
    python -m tools.lockfile --check    # exit 1 if the lock or an export is stale (offline)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "uv.lock"
PYPROJECT = ROOT / "pyproject.toml"
EXPORTS = ROOT / "packaging" / "requirements"
# What each target installs (besides the project itself, which each installs from its own
# wheel or checkout with --no-deps).
TARGETS: dict[str, tuple[str, ...]] = {
    # The bare package: what runs on every VM.
    "agent": ("--no-default-groups",),
    # The standalone consumer.
    "consumer": ("--no-default-groups", "--extra", "consumer"),
    "functions": ("--no-default-groups", "--extra", "functions"),
    # The agent on a Kubernetes node, which drains it ([kubernetes]).
    "kubernetes": ("--no-default-groups", "--extra", "kubernetes"),
    # The container image (Dockerfile): the consumer, and the agent that drains its node.
    "image": ("--no-default-groups", "--extra", "consumer", "--extra", "kubernetes"),
    # ./dev: everything above and the tools of the test command.
    "dev": ("--all-extras", "--group", "dev"),
    # ./dev docs: MkDocs and its theme, to read the docs without the test environment.
    "docs": ("--no-default-groups", "--only-group", "docs"),
}
HEADER = (
    "# What `{target}` installs, exported from uv.lock by `./dev lock`: do not edit.\n"
    "# pip install --require-hashes -r packaging/requirements/{target}.txt\n"
)


def uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if found is None:
        raise SystemExit("uv is not installed: ./dev setup installs it into .venv")
    return found


def _run(*args: str) -> str:
    done = subprocess.run(
        [uv(), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env=os.environ | {"UV_NO_PROGRESS": "1"},
    )
    if done.returncode != 0:
        raise SystemExit(f"uv {' '.join(args)} failed:\n{done.stderr.strip()}")
    return done.stdout


def export(target: str) -> str:
    """The requirements file of `target`, as uv.lock says (offline: reads the lock only)."""
    body = _run(
        "export",
        "--frozen",
        "--no-emit-project",
        "--no-header",
        "--format",
        "requirements.txt",
        *TARGETS[target],
    )
    return HEADER.format(target=target) + body


# What a requirement of pyproject.toml is, for comparing it with what uv.lock recorded: its
# section (dependencies, an extra or a dependency group), name and extras, and its versions.
# Markers are left out: uv rewrites them (python_version becomes python_full_version), and a
# change of a marker alone is left to `uv lock --check`.
Key = tuple[str, str, frozenset[str]]


def _requirement_key(section: str, text: str) -> tuple[Key, str]:
    requirement = Requirement(text)
    name = canonicalize_name(requirement.name)
    return (section, name, frozenset(requirement.extras)), str(requirement.specifier)


def declared(pyproject: Mapping[str, Any]) -> dict[Key, str]:
    """What pyproject.toml asks for, by section."""
    project = pyproject["project"]
    found = dict(_requirement_key("dependencies", text) for text in project.get("dependencies", []))
    for extra, texts in project.get("optional-dependencies", {}).items():
        found |= dict(_requirement_key(f"extra {extra}", text) for text in texts)
    groups = pyproject.get("dependency-groups", {})

    def members(group: str) -> list[str]:
        out: list[str] = []
        for entry in groups[group]:
            out += members(entry["include-group"]) if isinstance(entry, dict) else [entry]
        return out

    for group in groups:
        found |= dict(_requirement_key(f"group {group}", text) for text in members(group))
    return found


def recorded(lock: Mapping[str, Any], project: str) -> dict[Key, str]:
    """What uv.lock was resolved for: `project`'s requirements as uv recorded them."""
    (package,) = [p for p in lock["package"] if p["name"] == project]
    metadata = package.get("metadata", {})
    found: dict[Key, str] = {}

    def add(section: str, entry: Mapping[str, Any]) -> None:
        key = (section, canonicalize_name(entry["name"]), frozenset(entry.get("extras", [])))
        found[key] = str(SpecifierSet(entry.get("specifier", "")))

    for entry in metadata.get("requires-dist", []):
        extra = re.search(r"extra == '([^']+)'", entry.get("marker", ""))
        add(f"extra {extra.group(1)}" if extra else "dependencies", entry)
    for group, entries in metadata.get("requires-dev", {}).items():
        for entry in entries:
            add(f"group {group}", entry)
    return found


def changes(pyproject: Mapping[str, Any], lock: Mapping[str, Any]) -> list[str]:
    """What pyproject.toml asks for that uv.lock was not resolved for, one line each."""
    project = pyproject["project"]
    old, new = recorded(lock, project["name"]), declared(pyproject)
    lines = []
    wanted, resolved = (
        str(SpecifierSet(text))
        for text in (project.get("requires-python", ""), lock.get("requires-python", ""))
    )
    if wanted != resolved:
        lines.append(f"requires-python: {wanted} (was {resolved})")
    for key in sorted(old.keys() | new.keys()):
        section, name, extras = key
        shown = name + (f"[{','.join(sorted(extras))}]" if extras else "")
        if key not in old:
            lines.append(f"{section}: {shown}{new[key]} is new")
        elif key not in new:
            lines.append(f"{section}: {shown}{old[key]} is gone")
        elif old[key] != new[key]:
            lines.append(f"{section}: {shown}{new[key]} (was {old[key] or 'any version'})")
    return lines


def stale() -> list[str]:
    """What is out of date, one line each, the last saying what to do; empty when all is
    current. The lock against pyproject.toml, then each export against the lock."""
    try:
        pyproject, lock = (tomllib.loads(f.read_text(encoding="utf-8")) for f in (PYPROJECT, LOCK))
    except (OSError, tomllib.TOMLDecodeError) as err:
        return [f"pyproject.toml or uv.lock cannot be read ({err}): mend it, then run ./dev lock"]
    changed = changes(pyproject, lock)
    # uv's own check sees what the comparison leaves out (markers, sources); its failure
    # output is a resolver's, which says nothing a person needs here.
    if changed or not _uv_check():
        return [*changed, "pyproject.toml changed: run ./dev lock"]
    return [
        f"{path.relative_to(ROOT)} is not uv.lock's export: run ./dev lock"
        for path, target in ((EXPORTS / f"{target}.txt", target) for target in TARGETS)
        if not path.exists() or path.read_text(encoding="utf-8") != export(target)
    ]


def _uv_check() -> bool:
    done = subprocess.run(
        [uv(), "lock", "--check", "--offline"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev lock", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    parser.add_argument("--upgrade", action="store_true", help="take the newest allowed versions")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale()
        for problem in problems:
            print(problem, file=sys.stderr)
        if not problems:
            print(
                f"uv.lock and its {len(TARGETS)} exports in {EXPORTS.relative_to(ROOT)} "
                "match pyproject.toml"
            )
        return 1 if problems else 0
    _run("lock", *(["--upgrade"] if args.upgrade else []))
    EXPORTS.mkdir(parents=True, exist_ok=True)
    for target in TARGETS:
        (EXPORTS / f"{target}.txt").write_text(export(target), encoding="utf-8")
    print(f"uv.lock and {len(TARGETS)} exports in {EXPORTS.relative_to(ROOT)} written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
