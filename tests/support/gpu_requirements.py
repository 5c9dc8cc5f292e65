"""How a GPU test module says it cannot run here: skipped on CPU machines (CI), but a
failure where `COLOCGRPO_REQUIRE_GPU=1` (run_on_device.sh sets it), where a skip would read
as a pass."""

from __future__ import annotations

import os

import pytest


def unavailable(why: str) -> None:
    if os.environ.get("COLOCGRPO_REQUIRE_GPU") == "1":
        raise RuntimeError(f"COLOCGRPO_REQUIRE_GPU=1 but {why}")
    pytest.skip(why, allow_module_level=True)
