"""Two operator replicas with leader election (kube/leadership.py) against the real API server:
one reconciles, the other stands by without writing anything, and takes over within 20 s of the
active one being SIGKILLed; no job gets a second gang."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.operator_harness import Cluster, OperatorProcess, tiny_job, wait_for

LEASE = "colocgrpo-operator"


def _lease_holder(cluster: Cluster, namespace: str) -> str | None:
    from colocgrpo_operator.kube.client import KubeApiError

    try:
        lease = cluster.api.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}")
    except KubeApiError as error:
        if error.status == 404:
            return None
        raise
    return ((lease or {}).get("spec") or {}).get("holderIdentity") or None


def _writes(process: OperatorProcess) -> dict[str, float]:
    """The replica's own API requests by verb, all but reads (its metrics)."""
    counts: dict[str, float] = {}
    for match in re.finditer(r'colocgrpo_api_requests_total\{verb="(\w+)"\} ([0-9.e+]+)', process.metrics()):
        if match.group(1) != "GET":
            counts[match.group(1)] = float(match.group(2))
    return counts


def _batch_job_uids(cluster: Cluster, namespace: str, name: str) -> list[str]:
    return [
        j["metadata"]["uid"] for j in cluster.batch_jobs(namespace, name) if not j["metadata"].get("deletionTimestamp")
    ]


@pytest.fixture
def replicas(kube_cluster, crd_installed, tmp_path: Path) -> Iterator[tuple[str, list[OperatorProcess]]]:
    """Two `colocgrpo-operator --leader-election` processes watching one fresh namespace (not an
    `opt-*` one: the session's operator must not serve it), the Lease in that namespace."""
    namespace = kube_cluster.new_namespace("lead")
    args = ("--leader-election", f"--leader-election-namespace={namespace}")
    processes = [
        OperatorProcess(Path(kube_cluster.kubeconfig), [namespace], tmp_path / f"operator-{i}.log", extra_args=args)
        for i in range(2)
    ]
    try:
        for process in processes:
            process.start()
        yield namespace, processes
    finally:
        for process in processes:
            process.stop()
        kube_cluster.delete_namespace(namespace)


def _role(process: OperatorProcess) -> str:
    code, text = process.probe("/readyz")
    return text.split(":", 1)[0] if code == 200 else f"unready ({code} {text})"


def test_one_replica_reconciles_the_standby_takes_over_after_sigkill(cluster, replicas) -> None:
    namespace, processes = replicas

    def roles() -> list[str]:
        return [_role(p) for p in processes]

    wait_for(
        lambda: sorted(roles()) == ["active", "standby"],
        60,
        "one active and one standby replica",
        on_timeout=lambda: str(roles()),
    )
    active, standby = sorted(processes, key=lambda p: _role(p) != "active")
    holder = _lease_holder(cluster, namespace)
    assert holder and holder in active.probe("/readyz")[1] and holder in standby.probe("/readyz")[1]

    before = [f"before-{i}" for i in range(3)]
    for name in before:
        cluster.create_job(namespace, tiny_job(name))
    for name in before:
        wait_for(lambda name=name: _batch_job_uids(cluster, namespace, name), 60, f"the batch Job of {name}",
                 on_timeout=active.log_tail)  # fmt: skip
    uids = {name: _batch_job_uids(cluster, namespace, name) for name in before}
    assert all(len(found) == 1 for found in uids.values()), uids
    assert _writes(active), "the active replica made no writes at all"
    assert _writes(standby) == {}, "the standby wrote to the API server"

    active.kill()
    killed = time.monotonic()
    wait_for(
        lambda: _lease_holder(cluster, namespace) not in (None, holder),
        25,
        "the standby to take the Lease",
        interval=0.2,
        on_timeout=standby.log_tail,
    )
    takeover = time.monotonic() - killed
    print(f"takeover after SIGKILL: {takeover:.1f} s")
    assert takeover <= 20, f"takeover took {takeover:.1f} s"
    wait_for(lambda: _role(standby) == "active", 60, "the new active replica to be ready", on_timeout=standby.log_tail)

    # The new active one serves jobs created after the kill and changes to the earlier ones.
    after = [f"after-{i}" for i in range(3)]
    for name in after:
        cluster.create_job(namespace, tiny_job(name))
    cluster.patch_job(namespace, "before-0", {"spec": {"runPolicy": {"suspend": True}}})
    for name in after:
        wait_for(lambda name=name: _batch_job_uids(cluster, namespace, name), 60, f"the batch Job of {name}",
                 on_timeout=standby.log_tail)  # fmt: skip
    wait_for(
        lambda: (cluster.get_job(namespace, "before-0") or {}).get("status", {}).get("phase") == "Suspended",
        60,
        "before-0 to be suspended by the new active replica",
        on_timeout=standby.log_tail,
    )
    # No job got a second gang: the earlier Jobs are the very same objects, the later ones single.
    for name in before:
        assert _batch_job_uids(cluster, namespace, name) == uids[name], name
    for name in after:
        assert len(_batch_job_uids(cluster, namespace, name)) == 1, name
    for plural, prefix in (("configmaps", "/api/v1"), ("serviceaccounts", "/api/v1")):
        names = [o["metadata"]["name"] for o in cluster.list(prefix, plural, namespace, "colocgrpo.io/job-name")]
        assert len(names) == len(set(names)) == len(before) + len(after), (plural, names)

    # The killed replica comes back as the standby, and a graceful stop of the active one hands
    # the Lease over at once (released), not after the lease duration.
    active.start()
    wait_for(lambda: _role(active) == "standby", 60, "the restarted replica to stand by", on_timeout=active.log_tail)
    assert _writes(active) == {}
    new_holder = _lease_holder(cluster, namespace)
    stopped = time.monotonic()
    standby.stop()
    wait_for(lambda: _lease_holder(cluster, namespace) not in (None, new_holder), 10, "the released Lease taken")
    assert time.monotonic() - stopped < 10
