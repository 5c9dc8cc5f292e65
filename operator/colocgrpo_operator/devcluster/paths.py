"""Where the dev cluster's inputs and outputs live.

Inputs (pins, build script, KWOK stages) are in the checkout under tests/cluster/; everything
built or started lives outside it, under the colocgrpo cache, so a clone never holds binaries.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache shared with the Makefile (`CACHE`, exported as COLOCGRPO_CACHE)."""
    return Path(os.environ.get("COLOCGRPO_CACHE") or Path.home() / ".cache" / "colocgrpo")


def cluster_inputs_dir() -> Path:
    """tests/cluster/ of the checkout: build.sh, versions.env, go.mod pins, KWOK stages.

    The dev cluster is a development tool, so it needs a checkout; it is found next to this
    package (editable install or PYTHONPATH) or through COLOCGRPO_REPO.
    """
    candidates = []
    if os.environ.get("COLOCGRPO_REPO"):
        candidates.append(Path(os.environ["COLOCGRPO_REPO"]))
    candidates.append(Path(__file__).resolve().parents[3])
    candidates.append(Path.cwd())
    for root in candidates:
        if (root / "tests" / "cluster" / "build.sh").is_file():
            return root / "tests" / "cluster"
    raise FileNotFoundError("tests/cluster/build.sh not found; run from a colocgrpo checkout or set COLOCGRPO_REPO")


def versions() -> dict[str, str]:
    """The pins in tests/cluster/versions.env (KEY=VALUE lines)."""
    pins: dict[str, str] = {}
    for line in (cluster_inputs_dir() / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            pins[key] = value
    return pins
