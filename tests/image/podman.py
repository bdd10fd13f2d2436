"""The image, built with podman on a base made from Debian's packages, and its containers.

No container registry can be reached here, so the base is made, not pulled: debootstrap
installs Debian's python3 into a tree, podman imports the tree as an image, and the Dockerfile
is built on it through its PYTHON_IMAGE argument. The tree and the imported base are cached
under .cache/image, keyed by what made them, so only the first run pays for them; the build
reuses podman's layers, so a second build with the same sources takes seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest

from tests.support.processes import Proc, Processes

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "image"
TOOLS = ("podman", "runc", "debootstrap")
# crun refuses a machine whose kernel mounts cgroups v1 and v2 side by side, and podman's
# default open-files limit (above root's hard limit on such machines) is refused too.
PODMAN = ("podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs")
LIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
# Debian's podman takes the image's HEALTHCHECK NONE for a check to schedule through systemd,
# and logs an error where systemd does not run; Docker and Kubernetes ignore it.
RUN_OPTIONS = (*LIMITS, "--no-healthcheck")
DEBOOTSTRAP = ("debootstrap", "--variant=minbase",
               "--include=python3,python3-venv,ca-certificates", "bookworm")  # fmt: skip
# Copied into the base, so the build's downloads trust what this machine trusts (a proxy
# that inspects TLS has a CA of its own).
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
BASE = "localhost/se-bridge-base"
IMAGE_UID = 10001  # the Dockerfile's USER
BUILD_TIMEOUT = 900.0


def unavailable(reason: str) -> None:
    """A missing tool fails the run in CI, which must build the image, and skips elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"the image cannot be built here: {reason}", pytrace=False)
    pytest.skip(reason)


def check_tools() -> None:
    if os.geteuid() != 0:
        unavailable("the image test runs podman as root (rootful): run it as root")
    if not HOST_CA.exists():
        unavailable(f"no CA bundle at {HOST_CA} to give the base (Debian's ca-certificates)")
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        unavailable(f"{', '.join(absent)} not on PATH: `./dev test` installs podman, runc and "
                    "debootstrap with apt-get when run as root")  # fmt: skip


def run(argv: Sequence[str], timeout: float = BUILD_TIMEOUT, stdin: IO[bytes] | None = None) -> str:
    done = subprocess.run(  # noqa: PLW1510 - checked below, with the output in the message
        list(argv), capture_output=True, timeout=timeout, stdin=stdin or subprocess.DEVNULL
    )
    out, err = (stream.decode(errors="replace") for stream in (done.stdout, done.stderr))
    assert done.returncode == 0, f"{argv}\n{out[-4000:]}\n{err[-4000:]}"
    return out


def podman(*args: str, timeout: float = BUILD_TIMEOUT) -> str:
    return run([*PODMAN, *args], timeout=timeout)


@contextmanager
def cache_lock() -> Iterator[None]:
    """One builder at a time (pytest-xdist workers, two worktrees): the next finds the cache."""
    import fcntl  # here: POSIX only, and only Linux runs this module

    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def base_key() -> str:
    version = run(["debootstrap", "--version"], timeout=30).strip()
    made_of = [list(DEBOOTSTRAP), version, hashlib.sha256(HOST_CA.read_bytes()).hexdigest()]
    return hashlib.sha256(json.dumps(made_of).encode()).hexdigest()[:16]


def base() -> str:
    """The base image's name, made (debootstrap, then podman import) when not cached."""
    key = base_key()
    name = f"{BASE}:{key}"
    exists = subprocess.run([*PODMAN, "image", "exists", name], capture_output=True, check=False,
                            timeout=60)  # fmt: skip
    if exists.returncode == 0:
        return name
    tree, done = CACHE / f"base-{key}", CACHE / f"base-{key}.done"
    for stale in CACHE.glob("base-*"):  # made by another debootstrap or for another CA
        if stale.name not in (tree.name, done.name):
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    for image in podman("images", "--format", "{{.Repository}}:{{.Tag}}", BASE).split():
        subprocess.run([*PODMAN, "rmi", image], capture_output=True, check=False, timeout=120)
    if not done.exists():
        shutil.rmtree(tree, ignore_errors=True)  # a run stopped halfway
        run([*DEBOOTSTRAP, str(tree)])
        shutil.copyfile(HOST_CA, tree / HOST_CA.relative_to("/"))
        done.write_text(" ".join(DEBOOTSTRAP) + "\n", encoding="utf-8")
    with subprocess.Popen(["tar", "-C", str(tree), "-c", "."], stdout=subprocess.PIPE) as tar:
        run([*PODMAN, "import", "-", name], stdin=tar.stdout)
    assert tar.returncode == 0, f"tar of {tree} failed"
    return name


def build(base_image: str) -> str:
    """The Dockerfile built on `base_image`; the image's id.

    Tagged for this checkout, so the image that tag named before (about 70 MB of installed
    wheels) can be removed when a change of the sources replaces it, without touching an
    image another checkout on the machine is running.
    """
    tag = f"localhost/se-bridge:test-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]}"
    before = subprocess.run([*PODMAN, "image", "inspect", "--format", "{{.Id}}", tag],
                            capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    iid = CACHE / f"image-{uuid.uuid4().hex}.id"
    try:
        podman("build", "--format", "docker", "--pull=never", "--network", "host", *LIMITS,
               "--build-arg", f"PYTHON_IMAGE={base_image}", "--iidfile", str(iid),
               "--tag", tag, str(ROOT))  # fmt: skip
        built = iid.read_text(encoding="utf-8").strip()
    finally:
        iid.unlink(missing_ok=True)
    if before and before not in built:
        # Still in use only if a container of it runs: then it stays, and no harm done.
        subprocess.run([*PODMAN, "rmi", before], capture_output=True, check=False, timeout=120)
    return built


def give_to_image_user(path: Path) -> None:
    """The container runs as the image's user: what it writes to must be that user's."""
    for folder, _, files in os.walk(path):
        os.chown(folder, IMAGE_UID, IMAGE_UID)
        for name in files:
            os.chown(os.path.join(folder, name), IMAGE_UID, IMAGE_UID)


class Containers(Processes):
    """`se-bridge` in containers of `image` instead of processes: the host's network (the
    simulator listens on 127.0.0.1) and `workdir` mounted at the same path, so the paths
    the end-to-end helpers give mean the same inside as outside."""

    def __init__(self, workdir: Path, image: str) -> None:
        super().__init__(workdir)
        self.image = image
        self._names: list[str] = []

    def bridge(self, name: str, *args: str, env: Mapping[str, str] | None = None) -> Proc:
        container = f"se-bridge-test-{uuid.uuid4().hex[:12]}"
        self._names.append(container)
        settings = [f"--env={key}={value}" for key, value in (env or {}).items()]
        give_to_image_user(self.workdir)
        return self.start(name, [*PODMAN, "run", "--rm", "--name", container, "--network", "host",
                                 *RUN_OPTIONS, "--volume", f"{self.workdir}:{self.workdir}",
                                 *settings, self.image, *args])  # fmt: skip

    def close(self) -> None:
        # Killing `podman run` leaves its container running: remove each one too.
        for container in self._names:
            subprocess.run([*PODMAN, "rm", "--force", "--time", "0", "--ignore", container],
                           capture_output=True, check=False, timeout=60)  # fmt: skip
        super().close()
