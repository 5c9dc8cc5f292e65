"""A chart release in the real dev cluster, a kubeconfig that acts as its operator's ServiceAccount, and the
chart's operator command run on this host as that identity (pods on KWOK's fake nodes run no containers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from helm_chart import CHART, run_helm

from colocgrpo_dev.ports import free_port


@dataclass
class InstalledChart:
    helm: Path
    cluster: Any  # colocgrpo_dev.cluster.handle.ClusterHandle
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
    from colocgrpo_dev.cluster.binaries import kubectl_path

    result = subprocess.run(
        [str(kubectl_path()), f"--kubeconfig={kubeconfig}", "auth", "can-i", *args],
        capture_output=True,
        text=True,
    )
    if result.returncode not in (0, 1):
        raise AssertionError(f"kubectl auth can-i {' '.join(args)}: {result.stderr}")
    return result.returncode == 0


def wait_for_rbac(cluster: Any, kubeconfig: Path, namespace: str, timeout: float = 30) -> None:
    """Wait until the apiserver's RBAC cache grants the chart's bindings to `kubeconfig`'s identity. In a real
    install the bindings exist long before the operator pod starts; a test starts it right after `helm install`."""
    deadline = time.monotonic() + timeout
    while not (
        can_i(cluster, kubeconfig, "watch", "colocgrpojobs.colocgrpo.io", "-n", namespace)
        and can_i(cluster, kubeconfig, "create", "jobs.batch", "-n", namespace)
    ):
        assert time.monotonic() < deadline, "the chart's RBAC never took effect"
        time.sleep(0.3)


def http_get(url: str, timeout: float = 30) -> tuple[int, str]:
    """GET `url`, retrying while nothing listens yet, for at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()
        except (urllib.error.URLError, ConnectionError) as error:
            if time.monotonic() > deadline:
                raise AssertionError(f"{url}: {error}") from error
            time.sleep(0.3)


@dataclass
class HostOperator:
    """The release's Deployment command (its own arguments, the ports moved to free ones on this host) run here
    with this checkout's code, as the chart's ServiceAccount (`kubeconfig`). `env` adds to the environment, e.g.
    HOSTNAME, which names a pod's leader-election identity."""

    chart: InstalledChart
    kubeconfig: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    liveness: int = 0
    metrics: int = 0
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> HostOperator:
        self.liveness, self.metrics = free_port(), free_port()
        args = []
        for arg in self.chart.operator_args():
            if arg.startswith("--liveness-port="):
                arg = f"--liveness-port={self.liveness}"
            elif arg.startswith("--metrics-port="):
                arg = f"--metrics-port={self.metrics}"
            args.append(arg)
        assert f"--liveness-port={self.liveness}" in args and f"--metrics-port={self.metrics}" in args, args
        repo = Path(__file__).resolve().parents[2]
        # This checkout's code, whatever checkout the shared venv's editable install points at.
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PYTHONPATH": f"{repo / 'operator'}:{repo / 'training'}",
            **self.env,
        }
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "colocgrpo_operator", *args],  # the chart's colocgrpo-operator
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=repo,
            )
        return self

    def probe(self, path: str = "/readyz") -> tuple[int, str]:
        return http_get(f"http://127.0.0.1:{self.liveness}{path}")

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self) -> str:
        log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return log if len(log) < 9000 else f"{log[:3000]}\n[...]\n{log[-6000:]}"

    def stop(self, grace: float = 30) -> None:
        """SIGTERM, as the kubelet stops a container; SIGKILL after `grace` seconds."""
        from colocgrpo_dev.cluster.commands import stop_process

        stop_process(self.process, grace)
