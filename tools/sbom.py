"""A CycloneDX SBOM of what each target installs (`./dev sbom`).

Made from the lock's exports (packaging/requirements/TARGET.txt) by cyclonedx-py, so each SBOM
lists exactly the packages, versions and file hashes that target installs, se-bridge itself
as the described component (from pyproject.toml, with the version bridge/__init__.py gives it:
cyclonedx-py reads no dynamic version). Offline: nothing is downloaded.
cyclonedx-py runs from an environment of its own (.venv-sbom, tools/requirements-sbom.txt),
which `./dev sbom` makes (and `./dev setup`).

    ./dev sbom                           # build/sbom/se-bridge-TARGET-VERSION.cdx.json
    ./dev sbom --target agent --out DIR  # targets: agent, kubernetes, consumer, functions
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bridge import __version__
from tools.lockfile import EXPORTS, ROOT

TARGETS = ("agent", "kubernetes", "consumer", "functions")
TOOLS_PYTHON = ROOT / ".venv-sbom" / "bin" / "python"


def write(target: str, out: Path) -> Path:
    """Write `target`'s SBOM (CycloneDX 1.6 JSON, validated) into `out`; returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"se-bridge-{target}-{__version__}.cdx.json"
    if not TOOLS_PYTHON.exists():
        raise SystemExit(f"{TOOLS_PYTHON} is missing: ./dev sbom makes it")
    command = [
        str(TOOLS_PYTHON),
        # cyclonedx-py warns that a requirements file gives no dependency graph: true, and
        # what a lock export is; the SBOM still lists every component with its hashes.
        "-W",
        "ignore:The Component this BOM:UserWarning",
        "-m",
        "cyclonedx_py",
        "requirements",
        str(EXPORTS / f"{target}.txt"),
        "--pyproject",
        "{pyproject}",
        "--mc-type",
        "application",
        "--spec-version",
        "1.6",
        "--output-reproducible",
        "--output-format",
        "JSON",
        "--output-file",
        str(path),
    ]
    with tempfile.TemporaryDirectory() as scratch:
        described = _described(Path(scratch))
        command = [str(described) if part == "{pyproject}" else part for part in command]
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"cyclonedx-py failed for {target}:\n{done.stderr.strip()}")
    return path


def _described(scratch: Path) -> Path:
    """pyproject.toml with its dynamic version written in, for cyclonedx-py to describe."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    dynamic = 'dynamic = ["version"]'
    if dynamic not in text:
        raise SystemExit(f"pyproject.toml no longer says {dynamic}: update tools/sbom.py")
    path = scratch / "pyproject.toml"
    path.write_text(text.replace(dynamic, f'version = "{__version__}"', 1), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev sbom", description=__doc__.split("\n")[0])
    parser.add_argument("--target", choices=TARGETS, action="append", help="default: all")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "sbom")
    args = parser.parse_args(argv)
    for target in args.target or TARGETS:
        print(write(target, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
