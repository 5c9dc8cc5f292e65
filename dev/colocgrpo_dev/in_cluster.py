"""The operator as a user runs it, on the dev cluster's real node: the project's two images, built from their own
Dockerfiles (`python -m images.build`, what `make images` runs) and imported into the node's runtime, and the
chart installed with real helm into a namespace that enforces the restricted Pod Security Standard.

    images = load_images(cluster.node)                       # name -> reference, e.g. docker.io/colocgrpo/trainer:0.1.0
    release = OperatorRelease.on(cluster)                    # colocgrpo in colocgrpo-system
    release.install()                                        # 2 replicas, leader election, RBAC, NetworkPolicy
    release.leader()                                         # the pod holding the Lease

The e2e tests (tests/e2e) and `make demo` use it; neither runs an operator process on this machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colocgrpo_dev.cluster.cluster import DevCluster
from colocgrpo_dev.cluster.helm import ensure_helm
from colocgrpo_dev.cluster.node.node import RealNode

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "colocgrpo-operator"
IMAGES = ("operator", "trainer")
RELEASE = "colocgrpo"
NAMESPACE = "colocgrpo-system"
# The label that makes a namespace enforce the restricted Pod Security Standard.
RESTRICTED = "pod-security.kubernetes.io/enforce=restricted"


# What `python -m images.build` runs, per Debian package (as `make images` installs them).
IMAGE_TOOLS: dict[str, tuple[str, ...]] = {"buildah": ("buildah",), "mmdebstrap": ("mmdebstrap",)}


def ensure_image_tools() -> None:
    """apt-get install buildah and mmdebstrap where they are missing (the node's packages are there already)."""
    from colocgrpo_dev.cluster.node.host import ensure_packages

    ensure_packages(IMAGE_TOOLS)


def image_archives(names: tuple[str, ...] = IMAGES) -> dict[str, Path]:
    """Each image's OCI archive for the checkout's current inputs: built when they changed (`python -m images.build`,
    buildah, minutes), kept otherwise; name -> archive."""
    build = [sys.executable, "-m", "images.build"]
    subprocess.run([*build, *names], cwd=REPO, check=True)
    archives = {}
    for name in names:
        out = subprocess.run([*build, "--print-archive", name], cwd=REPO, check=True, capture_output=True, text=True)
        archives[name] = Path(out.stdout.strip().splitlines()[-1])
    return archives


def load_images(node: RealNode, names: tuple[str, ...] = IMAGES) -> dict[str, str]:
    """Build (or keep) the images and import them into the node's runtime (once per image); name -> reference."""
    return {name: node.import_archive(archive) for name, archive in image_archives(names).items()}


def restricted_namespace(cluster: DevCluster | Any, name: str) -> str:
    """Create (or keep) namespace `name`, enforcing the restricted Pod Security Standard."""
    cluster.kubectl("create", "namespace", name, check=False)
    cluster.kubectl("label", "--overwrite", "namespace", name, RESTRICTED)
    return name


@dataclass
class OperatorRelease:
    """The chart released as `release` in `namespace` of a cluster with a real node.

    `cluster` is anything with `kubectl(*args, input=, check=)` and `kubeconfig` (DevCluster, ClusterHandle);
    `node` its real node, whose link address the NetworkPolicy lets the operator reach the API server at."""

    cluster: Any
    node: RealNode
    release: str = RELEASE
    namespace: str = NAMESPACE

    @classmethod
    def on(cls, cluster: Any, **kwargs: Any) -> OperatorRelease:
        """The release on `cluster` (a DevCluster or ClusterHandle with a real node)."""
        if cluster.node is None:
            raise ValueError("the operator runs in-cluster only on a cluster with a real node")
        return cls(cluster=cluster, node=cluster.node, **kwargs)

    @property
    def fullname(self) -> str:
        return f"{self.release}-colocgrpo-operator"

    def values(self) -> list[str]:
        """The chart's values for this cluster: everything default (2 replicas, leader election, the chart's RBAC,
        the hardened security contexts) and the NetworkPolicy on, its API server rule naming the address and ports
        the operator's connections to the `kubernetes` Service reach."""
        network = self.node.network()
        if network is None:
            raise RuntimeError("the real node has no network: is the cluster up?")
        server = self._api_port()
        return [
            *("--set", "networkPolicy.enabled=true"),
            *("--set", f"networkPolicy.apiServer.cidrs={{{network.host_ip}/32}}"),
            *("--set", f"networkPolicy.apiServer.ports={{443,{server}}}"),
        ]

    def install(self, timeout: float = 300) -> None:
        """`helm upgrade --install` the chart into the restricted namespace and wait until both replicas are ready
        and one holds the Lease."""
        restricted_namespace(self.cluster, self.namespace)
        self._helm(
            "upgrade",
            "--install",
            self.release,
            str(CHART),
            "--namespace",
            self.namespace,
            *self.values(),
            "--wait",
            f"--timeout={int(timeout)}s",
        )
        deadline = time.monotonic() + timeout
        while self.leader() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no operator pod of {self.namespace}/{self.fullname} took the Lease")
            time.sleep(0.5)

    def uninstall(self) -> None:
        self._helm("uninstall", self.release, "--namespace", self.namespace, "--wait", check=False)

    def pods(self) -> list[dict[str, Any]]:
        """The release's operator pods, but those on their way out (a previous release's, a replaced one)."""
        selector = f"app.kubernetes.io/instance={self.release},app.kubernetes.io/name=colocgrpo-operator"
        out = self.cluster.kubectl("-n", self.namespace, "get", "pods", "-l", selector, "-o", "json").stdout
        return [pod for pod in json.loads(out)["items"] if not pod["metadata"].get("deletionTimestamp")]

    def leader(self) -> str | None:
        """The operator pod holding the Lease (its identity is the pod's name and a suffix), or None."""
        done = self.cluster.kubectl(
            "-n", self.namespace, "get", "lease", self.fullname, "-o", "jsonpath={.spec.holderIdentity}", check=False
        )
        identity = done.stdout.strip() if done.returncode == 0 else ""
        names = [pod["metadata"]["name"] for pod in self.pods()] if identity else []
        return next((name for name in names if identity == name or identity.startswith(f"{name}-")), None)

    def logs(self, tail: int = 200) -> str:
        """Every operator pod's log tail, for a failing test's message."""
        parts = []
        for pod in self.pods():
            name = pod["metadata"]["name"]
            out = self.cluster.kubectl("-n", self.namespace, "logs", name, f"--tail={tail}", check=False)
            parts.append(f"--- {name}\n{out.stdout}{out.stderr}")
        return "\n".join(parts)

    def _api_port(self) -> int:
        import yaml

        config = yaml.safe_load(Path(self.cluster.kubeconfig).read_text())
        return int(config["clusters"][0]["cluster"]["server"].rsplit(":", 1)[1])

    def _helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(ensure_helm()), f"--kubeconfig={self.cluster.kubeconfig}", *args], capture_output=True, text=True
        )
        if check and done.returncode:
            raise RuntimeError(f"helm {' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()}")
        return done
