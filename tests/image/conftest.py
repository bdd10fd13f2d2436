"""Fixtures of the image tests: the image, built once per session, and its containers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image import podman


@pytest.fixture(scope="session")
def image() -> str:
    """The Dockerfile built with podman on a base of Debian's packages; the image's id."""
    if sys.platform != "linux":
        pytest.skip("podman builds and runs the image's Linux containers on Linux only")
    podman.check_tools()
    with podman.cache_lock():
        return podman.build(podman.base())


@pytest.fixture
def containers(image: str, tmp_path: Path) -> Iterator[podman.Containers]:
    """`se-bridge` commands run in containers of the image; each is removed at the end."""
    started = podman.Containers(tmp_path, image)
    try:
        yield started
    finally:
        started.close()
