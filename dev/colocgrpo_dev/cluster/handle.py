"""What tests get from the `kube_cluster` fixture: a kubeconfig, clients, fresh namespaces."""

from __future__ import annotations

import re
import subprocess
import uuid
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from colocgrpo_dev.cluster.binaries import kubectl_path
from colocgrpo_dev.cluster.commands import run

if TYPE_CHECKING:
    from colocgrpo_dev.cluster.node.node import RealNode


@dataclass
class ClusterHandle:
    """A cluster's kubeconfig, clients and namespaces; `node` is its real node, when it has one."""

    kubeconfig: Path
    node: RealNode | None = None
    _namespaces: list[str] = field(default_factory=list)

    @cached_property
    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient bound to this cluster (not the user's context)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    @cached_property
    def core_v1(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api_client)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run([str(kubectl_path()), f"--kubeconfig={self.kubeconfig}", *args], input=input, check=check)

    def set_fake_logs(self, namespace: str, pod: str, lines: list[str], container: str | None = None) -> Path:
        """Make `kubectl logs` of a fake pod print `lines` (see devcluster.fake_logs)."""
        from colocgrpo_dev.cluster.fake_logs import set_fake_logs

        return set_fake_logs(self.api_client, self.kubeconfig, namespace, pod, lines, container)

    def new_namespace(self, hint: str = "t") -> str:
        """Create a uniquely named namespace (its `default` ServiceAccount may lag a moment)."""
        base = re.sub(r"[^a-z0-9-]+", "-", hint.lower()).strip("-")[:40] or "t"
        name = f"{base}-{uuid.uuid4().hex[:6]}"
        self.core_v1.create_namespace({"metadata": {"name": name, "labels": {"colocgrpo.dev/test": "true"}}})
        self._namespaces.append(name)
        return name

    def delete_namespace(self, name: str) -> None:
        """Start deleting; the namespace controller finishes it in the background."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.core_v1.delete_namespace(name)
        except ApiException as error:
            if error.status != 404:
                raise
