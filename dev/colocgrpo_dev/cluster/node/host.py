"""Whether this machine can run the real node, and the Debian packages it runs on.

containerd, runc and the CNI plugins come from Debian's archive; `ensure_packages` installs what is missing
with apt-get (as root, on a Debian-like machine). `unsupported_reason` says in one line why containers cannot
run here, or None when they can.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from colocgrpo_dev.cluster.node.config import CNI_BIN_DIR

# What the node runs, per Debian package: the commands (or CNI plugins) that show the package is there.
PACKAGES: dict[str, tuple[str, ...]] = {
    "containerd": ("containerd", "ctr"),
    "runc": ("runc",),
    "iptables": ("iptables",),
    "iproute2": ("ip",),
    "util-linux": ("nsenter",),
    "openssl": ("openssl",),
}
CNI_PACKAGE = "containernetworking-plugins"
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
# Said after every reason the node cannot run.
WHAT_STILL_WORKS = (
    "the control plane and the fake GPU nodes still run, and every test that needs no container; "
    "`make demo` then runs the trainer on this host instead"
)


def missing_packages(packages: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """The Debian packages whose programs are not on PATH (or, for the node's CNI plugins, not in CNI_BIN_DIR);
    `packages` (default: the node's, PACKAGES and the CNI plugins) maps each package to its programs."""
    missing = [
        package
        for package, tools in (packages or PACKAGES).items()
        if any(shutil.which(tool) is None for tool in tools)
    ]
    if packages is None and not all((CNI_BIN_DIR / plugin).is_file() for plugin in CNI_PLUGINS):
        missing.append(CNI_PACKAGE)
    return missing


def ensure_packages(packages: dict[str, tuple[str, ...]] | None = None) -> None:
    """apt-get install whatever of `packages` (default: the node's) is missing; no-op when all are there. Raises
    RuntimeError when some are missing and apt-get cannot install them."""
    missing = missing_packages(packages)
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(f"missing {', '.join(missing)} (Debian packages) and no apt-get as root to install them")
    print(f"==> installing {' '.join(missing)} with apt-get (once)", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
    ):
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
            raise RuntimeError(f"{' '.join(command[:2])} failed: {tail}")


def unsupported_reason() -> str | None:
    """Why this machine cannot run the node's containers (one line), or None when it can. Installs the packages
    first where it may."""
    if sys.platform != "linux":
        return f"containers need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return f"the real node needs root (containerd, cgroups, network namespaces); running as uid {os.geteuid()}"
    if not Path("/sys/fs/cgroup").is_dir() or not any(Path("/sys/fs/cgroup").iterdir()):
        return "no cgroup file system is mounted at /sys/fs/cgroup"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlay file system (containerd's snapshotter)"
    try:
        ensure_packages()
    except RuntimeError as error:
        return str(error)
    return None
