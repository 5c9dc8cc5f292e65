"""Where the dev cluster's inputs and outputs live.

Inputs (pins, build scripts, KWOK stages) sit beside this module, in `build/` and `kwok/`; everything
built or started lives outside the checkout, under the colocgrpo cache, so a clone never holds binaries.
"""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def cache_dir() -> Path:
    """The cache shared with the Makefile (`CACHE`, exported as COLOCGRPO_CACHE)."""
    return Path(os.environ.get("COLOCGRPO_CACHE") or Path.home() / ".cache" / "colocgrpo")


def build_dir() -> Path:
    """The Go build inputs: build.sh, build-kueue.sh, versions.env and the go.mod pins."""
    return HERE / "build"


def kwok_stages_dir() -> Path:
    """Our KWOK stages (fake pods, node heartbeats)."""
    return HERE / "kwok"


def versions() -> dict[str, str]:
    """The pins in build/versions.env (KEY=VALUE lines)."""
    pins: dict[str, str] = {}
    for line in (build_dir() / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            pins[key] = value
    return pins
