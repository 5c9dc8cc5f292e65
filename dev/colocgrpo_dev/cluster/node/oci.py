"""OCI image archives of one static binary each (the real node's pause and CoreDNS), written without a
container engine: one uncompressed layer holding the binary, an image config, a manifest and the index,
the layout `ctr images import` reads.

The archive is a pure function of the binary and the image's settings (every timestamp is zero), so the
same binary always gives the same manifest digest and an import can be skipped when the runtime already
holds it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"


@dataclass(frozen=True)
class BinaryImage:
    """An image that is one static binary at `/<name>`, run as `user` with `args` after it.

    Args:
        reference: the full name the image is imported as, e.g. `registry.k8s.io/pause:3.10`.
        binary: the static executable on this machine.
        user: the image's `User` (`uid:gid`); a pod's securityContext may still override it.
        args: the image's `Cmd`, appended to the binary (its `Entrypoint`).
    """

    reference: str
    binary: Path
    user: str = "65532:65532"
    args: tuple[str, ...] = ()

    @property
    def entrypoint(self) -> str:
        return f"/{self.binary.name}"


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = _digest(data)
    _add(tar, f"blobs/sha256/{digest.split(':', 1)[1]}", data)
    return digest


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def layer_tar(image: BinaryImage) -> bytes:
    """The image's one layer: the binary at /<name>, mode 0755, owned by root, time zero."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, image.entrypoint.lstrip("/"), image.binary.read_bytes(), mode=0o755)
    return out.getvalue()


def image_config(image: BinaryImage, layer: bytes) -> dict[str, Any]:
    """The OCI image config: linux/amd64, the entrypoint, user and args, the layer's diff id."""
    config: dict[str, Any] = {"Entrypoint": [image.entrypoint], "User": image.user}
    if image.args:
        config["Cmd"] = list(image.args)
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
    }


def write_archive(image: BinaryImage, path: Path) -> str:
    """Write the image as an OCI archive at `path` (atomically: a temporary file renamed) and return its manifest
    digest."""
    layer = layer_tar(image)
    config = json.dumps(image_config(image, layer), sort_keys=True).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    with tarfile.open(partial, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": _blob(tar, config), "size": len(config)},
            "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": _blob(tar, layer), "size": len(layer)}],
        }
        manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
        manifest_digest = _blob(tar, manifest_bytes)
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": MANIFEST_MEDIA_TYPE,
                    "digest": manifest_digest,
                    "size": len(manifest_bytes),
                    "annotations": {"org.opencontainers.image.ref.name": image.reference},
                }
            ],
        }
        _add(tar, "index.json", json.dumps(index, sort_keys=True).encode())
    partial.replace(path)
    return manifest_digest
