"""Install the ColocGRPOJob API into a cluster the way the chart does: the CRDs (the job's and the
runtimes'), the policy that keeps each job's trainer to `status.progress` (api/admission.py) and the
policies of Kueue's labels (api/queueing.py).

Used by `colocgrpo-dev cluster up`, the demo and the test fixtures; the chart ships the same
objects (crds/, templates/trainer-status-policy.yaml).
"""

from __future__ import annotations

import subprocess
import time
from typing import Protocol

import yaml

from colocgrpo_operator.api.admission import trainer_status_policy
from colocgrpo_operator.api.crd import generate_crd
from colocgrpo_operator.api.naming import CRD_NAME
from colocgrpo_operator.api.queueing import queue_policies
from colocgrpo_operator.api.runtime import generate_runtime_crds


class Kubectl(Protocol):
    def __call__(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """kubectl against one cluster (DevCluster.kubectl, ClusterHandle.kubectl)."""
        ...


def install_api(kubectl: Kubectl, timeout_seconds: int = 60) -> None:
    """Server-side apply the CRDs and the admission policies; wait until the CRDs are Established."""
    runtimes = generate_runtime_crds()
    documents = [generate_crd(), *runtimes, *trainer_status_policy(), *queue_policies()]
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(documents))
    # Polled rather than `kubectl wait --for=condition=Established`, which fails at once ("conditions accessor
    # error") when it reads the CRD before the API server has written any condition.
    deadline = time.monotonic() + timeout_seconds
    established = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
    for name in [CRD_NAME, *(crd["metadata"]["name"] for crd in runtimes)]:
        while kubectl("get", f"crd/{name}", "-o", established, check=False).stdout.strip() != "True":
            if time.monotonic() > deadline:
                raise TimeoutError(f"the CRD {name} was not Established within {timeout_seconds} s")
            time.sleep(0.2)
