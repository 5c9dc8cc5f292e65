"""TORCH_CUDA_ARCH_LIST as DeepSpeed 0.19's op builder can read it.

NVIDIA's CUDA images and PyTorch builds name architecture-specific targets with a letter suffix
(`9.0a` for Hopper's sm_90a). DeepSpeed 0.19.8 sorts the list with `int()` on every dotted part,
so a JIT build of one of its ops (FusedAdam, which an offloading job renders) fails with
`ValueError: invalid literal for int() with base 10: '0a'` — seen on an H200 host whose
environment had `TORCH_CUDA_ARCH_LIST=9.0a`. The plain target (`9.0`) builds the same kernels for
these ops, so the suffix is dropped before DeepSpeed reads the variable.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping

VARIABLE = "TORCH_CUDA_ARCH_LIST"
_ENTRY = re.compile(r"^(\d+)\.(\d+)[a-z]*(\+PTX)?$", re.IGNORECASE)


def deepspeed_readable(arch_list: str) -> str:
    """`arch_list` with letter suffixes dropped from each `major.minor` entry, duplicates removed.

    Args:
        arch_list: a TORCH_CUDA_ARCH_LIST value, entries separated by `;` or spaces
            (e.g. `"8.0;9.0a+PTX"`).

    Returns:
        The same entries, in order, as DeepSpeed 0.19 parses them (e.g. `"8.0;9.0+PTX"`). Entries
        that are not `major.minor[suffix][+PTX]` are kept as they are.
    """
    kept: list[str] = []
    for entry in re.split(r"[;\s]+", arch_list.strip()):
        if not entry:
            continue
        match = _ENTRY.match(entry)
        plain = f"{match.group(1)}.{match.group(2)}{match.group(3) or ''}" if match else entry
        if plain not in kept:
            kept.append(plain)
    return ";".join(kept)


def make_arch_list_deepspeed_readable(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Rewrite TORCH_CUDA_ARCH_LIST in `environ` when DeepSpeed could not parse it.

    Returns:
        The new value when it changed, else None (unset or already readable).
    """
    value = environ.get(VARIABLE)
    if not value:
        return None
    readable = deepspeed_readable(value)
    if readable == value:
        return None
    environ[VARIABLE] = readable
    return readable
