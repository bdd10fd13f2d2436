"""Getting started copies the checkout to the VM with rsync: the page's command, run here into
a local directory, copies what the install script needs and none of what `./dev` and the tests
leave in a checkout (issue 39: `.cache` holds a root-owned Debian tree)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started.md"
# What the tests and `./dev` make in a checkout, none of it for the VM.
LOCAL = (".venv", ".venv-demo", ".venv-docs", ".venv-tools", "node_modules", ".cache")


def copy_command() -> list[str]:
    [line] = [line for line in PAGE.read_text(encoding="utf-8").splitlines()
              if line.startswith("rsync ")]  # fmt: skip
    return shlex.split(line)


def test_the_pages_rsync_copies_the_checkout_without_what_dev_made(tmp_path: Path) -> None:
    if shutil.which("rsync") is None:
        reason = "rsync is not on PATH: `./dev test` installs it with apt-get when run as root"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    checkout, vm = tmp_path / "checkout", tmp_path / "vm"
    for name in (*LOCAL, "dist", "infra/onboarding", "packaging/requirements"):
        (checkout / name).mkdir(parents=True)
        (checkout / name / "file").write_text(name, encoding="utf-8")
    argv = copy_command()
    assert argv[-1] == "$USER@$VM:se-bridge/", argv
    done = subprocess.run([*argv[:-1], f"{vm}/"], cwd=checkout, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    copied = sorted(str(p.relative_to(vm)) for p in vm.rglob("file"))
    assert copied == ["dist/file", "infra/onboarding/file", "packaging/requirements/file"]
