"""A chart release in the real dev cluster, and a kubeconfig that acts as its operator's ServiceAccount."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from helm_chart import CHART, run_helm


@dataclass
class InstalledChart:
    helm: Path
    cluster: Any  # colocgrpo_operator.devcluster.handle.ClusterHandle
    release: str
    namespace: str
    values: tuple[str, ...] = ()

    @property
    def fullname(self) -> str:
        return f"{self.release}-colocgrpo-operator"

    def install(self) -> InstalledChart:
        run_helm(
            self.helm,
            "install",
            self.release,
            str(CHART),
            "--namespace",
            self.namespace,
            *self.values,
            kubeconfig=self.cluster.kubeconfig,
        )
        return self

    def uninstall(self) -> None:
        # Cluster-scoped objects (ClusterRole/Binding) outlive the test namespace unless uninstalled.
        run_helm(
            self.helm,
            "uninstall",
            self.release,
            "--namespace",
            self.namespace,
            "--wait",
            check=False,
            kubeconfig=self.cluster.kubeconfig,
        )

    def deployment(self) -> dict[str, Any]:
        out = self.cluster.kubectl("-n", self.namespace, "get", "deployment", self.fullname, "-o", "json").stdout
        return json.loads(out)

    def operator_args(self) -> list[str]:
        (container,) = self.deployment()["spec"]["template"]["spec"]["containers"]
        return list(container["args"])

    def service_account_kubeconfig(self, path: Path, duration: str = "1h") -> Path:
        """A kubeconfig for the chart's ServiceAccount (a bound token from `kubectl create token`),
        pointing at the same apiserver as the admin kubeconfig."""
        token = self.cluster.kubectl(
            "-n",
            self.namespace,
            "create",
            "token",
            self.fullname,
            f"--duration={duration}",
        ).stdout.strip()
        admin = yaml.safe_load(Path(self.cluster.kubeconfig).read_text())
        context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
        cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
        user = "colocgrpo-operator-sa"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [cluster],
                    "users": [{"name": user, "user": {"token": token}}],
                    "contexts": [
                        {
                            "name": user,
                            "context": {"cluster": cluster["name"], "user": user, "namespace": self.namespace},
                        }
                    ],
                    "current-context": user,
                }
            )
        )
        path.chmod(0o600)
        return path


def can_i(cluster: Any, kubeconfig: Path, *args: str) -> bool:
    """`kubectl auth can-i ...` as the identity of `kubeconfig` (exit 0: yes, 1: no)."""
    from colocgrpo_operator.devcluster.binaries import kubectl_path

    result = subprocess.run(
        [str(kubectl_path()), f"--kubeconfig={kubeconfig}", "auth", "can-i", *args],
        capture_output=True,
        text=True,
    )
    if result.returncode not in (0, 1):
        raise AssertionError(f"kubectl auth can-i {' '.join(args)}: {result.stderr}")
    return result.returncode == 0
