"""A real Kubernetes control plane on 127.0.0.1 for tests and the demo, with fake GPU nodes.

Built from Go modules (cluster/build/build.sh), run by kwokctl's binary runtime; see
docs/dev-cluster.md. Entry points: `colocgrpo-dev cluster up|down|status`, the `kube_cluster`
pytest fixture, and the fake-pod helpers in `fake_pods`.
"""

from colocgrpo_dev.cluster.cluster import DevCluster
from colocgrpo_dev.cluster.fake_pods import (
    drive_pod_failure,
    drive_pod_success,
    evict_pod,
    wait_for_pod_phase,
)

__all__ = ["DevCluster", "drive_pod_failure", "drive_pod_success", "evict_pod", "wait_for_pod_phase"]
