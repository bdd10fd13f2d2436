"""`./dev release`: the files of a se-bridge release, built from this checkout into dist/.

    ./dev release              # dist/: the sdist, the wheel, and per install target (agent,
                               # consumer, functions) its locked requirements and its SBOM;
                               # SHA256SUMS of them all
    ./dev release --out DIR

The sdist and the wheel come from `uv build` of the commit's files (`git archive HEAD`: what
was committed, never what the working tree adds), the wheel built from the sdist (so a file the
sdist forgot breaks the build here, not on someone's VM), with the build backend pinned and
checked against its hashes (tools/requirements-build.txt). SOURCE_DATE_EPOCH is the commit's
time, so one commit builds the same bytes on any machine: the wheel honours it, and the sdist,
whose tar keeps the build's clock (setuptools), is written again with that time and sorted
entries, its contents unchanged. A target's requirements are the lock's export
(packaging/requirements/TARGET.txt), which pip installs with --require-hashes before the wheel;
its SBOM is tools/sbom.py's. SHA256SUMS lists every file in `sha256sum --check` format, which
is how docs/deploying.md tells people to check what they downloaded. The version is
bridge/__init__.py's.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from bridge import __version__
from tools import sbom
from tools.lockfile import EXPORTS, ROOT

UV = Path(sys.executable).parent / "uv"
BUILD_CONSTRAINTS = ROOT / "tools" / "requirements-build.txt"
SUMS = "SHA256SUMS"
# What an earlier `./dev release` left in the folder, and nothing else, may be replaced.
_OURS = re.compile(
    r"se_bridge-.+\.(whl|tar\.gz)|se-bridge-.+\.(cdx\.json|txt)|SHA256SUMS|\.gitignore"
)


def build(out: Path) -> list[Path]:
    """Build the release into `out` (made empty first) and return its files, SHA256SUMS last."""
    _clear(out)
    _distributions(out)
    for target in sbom.TARGETS:
        sbom.write(target, out)
        requirements = out / f"se-bridge-{__version__}-requirements-{target}.txt"
        shutil.copyfile(EXPORTS / f"{target}.txt", requirements)
    files = sorted(path for path in out.iterdir() if not path.name.startswith("."))
    sums = out / SUMS
    sums.write_text("".join(f"{_sha256(path)}  {path.name}\n" for path in files), "utf-8")
    return [*files, sums]


def _clear(out: Path) -> None:
    if not out.exists():
        out.mkdir(parents=True)
        return
    strangers = sorted(p.name for p in out.iterdir() if not _OURS.fullmatch(p.name))
    if strangers:
        raise SystemExit(
            f"{out} holds files that are not a release's ({', '.join(strangers)}): "
            "give an empty folder with --out"
        )
    for path in out.iterdir():
        path.unlink()


def _distributions(out: Path) -> None:
    epoch = _commit_time()
    with tempfile.TemporaryDirectory(prefix="se-bridge-release-") as scratch:
        source = _commit_files(Path(scratch) / "source")
        # No --sdist/--wheel: uv builds the sdist, then the wheel from the sdist.
        command = [
            str(UV),
            "build",
            "--quiet",
            "--out-dir",
            str(out),
            "--build-constraints",
            str(BUILD_CONSTRAINTS),
            "--require-build-hashes",
            str(source),
        ]
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"uv build failed:\n{done.stderr.strip()}")
    want = {f"se_bridge-{__version__}.tar.gz", f"se_bridge-{__version__}-py3-none-any.whl"}
    got = {path.name for path in out.iterdir() if path.suffix in {".whl", ".gz"}}
    if got != want:
        raise SystemExit(f"uv build made {sorted(got)}, not {sorted(want)}")
    _normalise_sdist(out / f"se_bridge-{__version__}.tar.gz", epoch)
    (out / ".gitignore").unlink(missing_ok=True)  # uv's, for a dist/ inside a checkout


def _commit_files(into: Path) -> Path:
    """The commit's files (`git archive HEAD`), so a release holds what was committed and
    nothing the working tree adds, and the build never writes into the checkout (build/,
    *.egg-info), where another build may be running."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        [_tool("git"), "-C", str(ROOT), "archive", "--format=tar", "HEAD"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise SystemExit(f"git archive failed: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run([_tool("tar"), "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def _tool(name: str) -> str:
    return shutil.which(name) or name


def _normalise_sdist(path: Path, epoch: int) -> None:
    with tarfile.open(path, "r:gz") as tar:
        members = sorted(tar.getmembers(), key=lambda member: member.name)
        contents = {m.name: tar.extractfile(m).read() for m in members if m.isfile()}  # type: ignore[union-attr]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member in members:
            member.mtime, member.uid, member.gid, member.uname, member.gname = epoch, 0, 0, "", ""
            member.mode = 0o755 if member.isdir() else 0o644
            member.pax_headers = {}  # setuptools writes each file's own mtime here too
            data = contents.get(member.name)
            tar.addfile(member, io.BytesIO(data) if data is not None else None)
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=epoch) as gz:
        gz.write(buffer.getvalue())


def _commit_time() -> int:
    done = subprocess.run(
        [_tool("git"), "-C", str(ROOT), "log", "-1", "--format=%ct"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit("./dev release builds from a git checkout: `git log` found no commit")
    return int(done.stdout.strip())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev release", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="default: dist/")
    args = parser.parse_args(argv)
    if shutil.which(str(UV)) is None:
        raise SystemExit(f"{UV} is missing: ./dev release installs it (./dev setup)")
    for path in build(args.out):
        print(path)
    print(f"se-bridge {__version__}: check downloads with `sha256sum --check {SUMS}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
