"""How a GPU test module says it cannot run here: skipped on CPU machines (CI), but a
failure where `COLOCGRPO_REQUIRE_GPU=1` (run_on_device.sh sets it), where a skip would read
as a pass."""

from __future__ import annotations

import os
from types import ModuleType
from typing import NoReturn

import pytest


def unavailable(why: str) -> NoReturn:
    if os.environ.get("COLOCGRPO_REQUIRE_GPU") == "1":
        raise RuntimeError(f"COLOCGRPO_REQUIRE_GPU=1 but {why}")
    pytest.skip(why, allow_module_level=True)


def require_cuda_deepspeed() -> tuple[ModuleType, ModuleType]:
    """torch and deepspeed, for a module that needs a CUDA GPU and DeepSpeed (else `unavailable`)."""
    try:
        import torch
    except ImportError:
        unavailable("torch is not installed")
    if not torch.cuda.is_available():
        unavailable("needs a CUDA GPU")
    try:
        import deepspeed
    except ImportError as err:
        unavailable(f"DeepSpeed does not import ({err})")
    return torch, deepspeed
