"""What a lock export says a target installs, and what a venv holds: the tests that install
the Dockerfile's, install-agent.sh's and the Functions build's steps compare the two."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from packaging.markers import Marker

ROOT = Path(__file__).resolve().parents[2]
# `name==version ; marker \` at the start of each requirement in a uv export.
_PIN = re.compile(r"^([A-Za-z0-9._-]+)==(\S+)(?: ; (.*?))? \\$", re.MULTILINE)
# The venv's own installer tools; nothing else may be there that the lock does not name.
INSTALLER = ("pip", "setuptools", "wheel")


def name(distribution: str) -> str:
    """PEP 503's normal form: PyYAML, pyyaml and py_yaml are one name."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def locked(target: str) -> dict[str, str]:
    """The packages `target`'s export installs on this machine (its markers evaluated)."""
    text = (ROOT / "packaging" / "requirements" / f"{target}.txt").read_text(encoding="utf-8")
    return {
        name(n): version
        for n, version, marker in _PIN.findall(text)
        if not marker or Marker(marker).evaluate()
    }


def installed(python: Path) -> dict[str, str]:
    """The distributions in `python`'s environment, its installer tools left out."""
    code = "import importlib.metadata as m\nfor d in m.distributions(): print(d.name, d.version)"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    found = {name(line.split()[0]): line.split()[1] for line in done.stdout.splitlines()}
    return {n: v for n, v in found.items() if n not in INSTALLER}
