"""One build of the project's own source tree at a time, across pytest-xdist workers.

`pip wheel .` builds in the tree's ./build, and two at once collide ("File exists:
build/bdist.../se_bridge-X.dist-info"), whichever workers the modules that build land on.
"""

from __future__ import annotations

import fcntl
import hashlib
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def building() -> Iterator[None]:
    """Hold the tree's build lock (a file beside the temporary files, named for the tree)."""
    name = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"se-bridge-build-{name}.lock"
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
