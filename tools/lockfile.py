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
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "uv.lock"
EXPORTS = ROOT / "packaging" / "requirements"
# What each target installs (besides the project itself, which each installs from its own
# wheel or checkout with --no-deps).
TARGETS: dict[str, tuple[str, ...]] = {
    # The bare package: what runs on every VM.
    "agent": ("--no-default-groups",),
    # The standalone consumer, and the container image (agent and consumer in one).
    "consumer": ("--no-default-groups", "--extra", "consumer"),
    "functions": ("--no-default-groups", "--extra", "functions"),
    # ./dev: everything above and the tools of the test command.
    "dev": ("--all-extras", "--group", "dev"),
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


def stale() -> list[str]:
    """What is out of date: the lock against pyproject.toml, each export against the lock."""
    problems = []
    done = subprocess.run(
        [uv(), "lock", "--check", "--offline"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        problems.append(f"uv.lock does not match pyproject.toml: {done.stderr.strip()}")
    for target in TARGETS:
        path = EXPORTS / f"{target}.txt"
        if not path.exists() or path.read_text(encoding="utf-8") != export(target):
            problems.append(f"{path.relative_to(ROOT)} is not uv.lock's export")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev lock", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    parser.add_argument("--upgrade", action="store_true", help="take the newest allowed versions")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale()
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("run ./dev lock", file=sys.stderr)
        return 1 if problems else 0
    _run("lock", *(["--upgrade"] if args.upgrade else []))
    EXPORTS.mkdir(parents=True, exist_ok=True)
    for target in TARGETS:
        (EXPORTS / f"{target}.txt").write_text(export(target), encoding="utf-8")
    print(f"uv.lock and {len(TARGETS)} exports in {EXPORTS.relative_to(ROOT)} written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
