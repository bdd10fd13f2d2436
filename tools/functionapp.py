"""Build the Function App's deployment folder (`./dev functionapp`).

The folder holds functions/ (the app, host.json, .funcignore), the project's wheel in wheels/,
and a requirements.txt where every line carries its sha256: the lock's `functions` export
(packaging/requirements/functions.txt) and the wheel, named by path. With a hash on every line
pip installs in hash-checking mode, so the Functions build takes exactly the locked packages,
and no package named se-bridge on a public index can take the wheel's place in the app that
holds the signing key.

    ./dev functionapp                      # build/functionapp
    cd build/functionapp && func azure functionapp publish APP
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from tools.lockfile import EXPORTS, ROOT
from tools.lockfile import HEADER as EXPORT_HEADER

APP = ROOT / "functions"
APP_FILES = ("function_app.py", "host.json", ".funcignore")
# Marks a folder this tool made, so a rebuild may empty it and never another folder.
MARKER = ".se-bridge-functionapp"
HEADER = """\
# What the Functions build installs, written by `./dev functionapp`: do not edit.
# Every line has its sha256, so pip installs in hash-checking mode: the locked packages
# (packaging/requirements/functions.txt, from uv.lock) and se-bridge's own wheel by path.
"""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _empty(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).exists():
            raise SystemExit(f"{out} is not empty and was not made by ./dev functionapp")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("made by ./dev functionapp; rebuilt in full each time\n")


def build(out: Path) -> Path:
    """Write the deployment folder into `out` (emptied first); returns its requirements.txt."""
    out = out.resolve()
    _empty(out)
    for name in APP_FILES:
        shutil.copy2(APP / name, out / name)
    wheels = out / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
        check=True,
        cwd=ROOT,
    )
    (wheel,) = wheels.glob("se_bridge-*.whl")
    locked = (EXPORTS / "functions.txt").read_text(encoding="utf-8")
    body = locked.removeprefix(EXPORT_HEADER.format(target="functions"))
    own = f"./wheels/{wheel.name} \\\n    --hash=sha256:{sha256(wheel)}\n"
    requirements = out / "requirements.txt"
    requirements.write_text(HEADER + body + own, encoding="utf-8")
    return requirements


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev functionapp", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "functionapp")
    args = parser.parse_args(argv)
    print(build(args.out).parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
