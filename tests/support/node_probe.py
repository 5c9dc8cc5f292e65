"""node-probe (tests/support/node-probe) as an image on the real node, and pods that run it.

The program is built from its Go module (build.sh there, cached), packed as a one-binary OCI image
(colocgrpo_dev.cluster.node.oci) and imported into the node's runtime under a name of its build key, so
pods run it with `imagePullPolicy: Never`: nothing is pulled from anywhere.
"""

from __future__ import annotations

import json
import subprocess
import time
from functools import cache
from pathlib import Path
from typing import Any

from colocgrpo_dev.cluster.node.oci import BinaryImage, write_archive

REPO = Path(__file__).resolve().parents[2]
# The uid and gid the trainer and operator images run as.
UID = 10001


@cache
def probe_binary() -> Path:
    result = subprocess.run(
        ["bash", str(REPO / "tests" / "support" / "node-probe" / "build.sh")], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"building node-probe failed:\n{result.stderr}")
    return Path(result.stdout.strip().splitlines()[-1])


def probe_image(node: Any) -> str:
    """Import node-probe into `node` (a RealNode) once; returns the image's reference."""
    binary = probe_binary()
    reference = f"localhost/colocgrpo-tests/node-probe:{binary.parent.name}"
    archive = binary.parent / "node-probe.oci.tar"
    if not archive.is_file():
        write_archive(BinaryImage(reference, binary, user=f"{UID}:{UID}"), archive)
    node.import_image(archive, reference)
    return reference


def restricted_pod(name: str, image: str, args: list[str], **spec: Any) -> dict[str, Any]:
    """A pod that meets the restricted Pod Security Standard as the project's pods do: uid and gid 10001, no
    privilege escalation, every capability dropped, RuntimeDefault seccomp, a read-only root file system."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": UID,
                "runAsGroup": UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "probe",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "args": args,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
                }
            ],
            **spec,
        },
    }


def wait_for(predicate: Any, what: str, timeout: float = 120) -> Any:
    """Poll `predicate` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.3)


def pod(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("-n", namespace, "get", "pod", name, "-o", "json").stdout)


def finished_pod(cluster: Any, namespace: str, name: str, timeout: float = 120) -> dict[str, Any]:
    """The pod once it has Succeeded or Failed."""
    return wait_for(
        lambda: (found := pod(cluster, namespace, name))["status"].get("phase") in ("Succeeded", "Failed") and found,
        f"pod {namespace}/{name} to end",
        timeout,
    )


def run_probe(cluster: Any, namespace: str, image: str, name: str, args: list[str], timeout: float = 120) -> Any:
    """Run node-probe ARGS in a restricted pod to its end; returns (the finished pod, the JSON it printed)."""
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(restricted_pod(name, image, args)))
    finished = finished_pod(cluster, namespace, name, timeout)
    logs = cluster.kubectl("-n", namespace, "logs", name).stdout
    assert finished["status"]["phase"] == "Succeeded", (finished["status"], logs)
    return finished, json.loads(logs.strip().splitlines()[-1])
