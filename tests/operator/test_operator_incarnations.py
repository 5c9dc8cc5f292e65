"""Deleting, recreating and tearing down against the real API server: a job's status is its own
incarnation's, a predecessor's leftovers are waited for, not judged, a namespace teardown is not
a gang failure, and what cannot be tracked or run is refused."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from colocgrpo_dev.cluster.cluster import has_component, paused_component
from colocgrpo_dev.cluster.diagnose import health, pod_lines
from colocgrpo_operator.api import parse_job
from colocgrpo_operator.api.naming import RECORD_ANNOTATION
from colocgrpo_operator.kube.client import KubeApiError, ObjectGone
from colocgrpo_operator.render import render_service
from support.operator_harness import (
    OperatorProcess,
    condition,
    gang_state,
    tiny_job,
    trainer_config_text,
    wait_event,
    wait_for,
)

pytestmark = pytest.mark.cluster

CRS = "/apis/colocgrpo.io/v1alpha1/namespaces/{ns}/colocgrpojobs"


def _phase(cluster, ns: str, name: str) -> str | None:
    return ((cluster.get_job(ns, name) or {}).get("status") or {}).get("phase")


def _wait_phase(cluster, operator, ns: str, name: str, wanted: str, timeout: float = 60) -> dict:
    return wait_for(
        lambda: (obj := cluster.get_job(ns, name)) and (obj.get("status") or {}).get("phase") == wanted and obj,
        timeout,
        f"{ns}/{name} {wanted}",
        on_timeout=lambda: (
            f"{pod_lines(cluster.handle.kubeconfig, ns)}\n{health(cluster.handle.kubeconfig)}\n"
            f"{(cluster.get_job(ns, name) or {}).get('status')}\n"
            f"{gang_state(cluster, ns, name)}{operator.log_tail()}"
        ),
    )


def _running_pod(cluster, ns: str, name: str) -> dict:
    def find() -> dict | None:
        for pod in cluster.pods(ns, name):
            if (pod.get("status") or {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp"):
                return pod
        return None

    return wait_for(find, 60, f"a running pod of {name}")


def _fail_pod(cluster, ns: str, pod: dict) -> None:
    cluster.api.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}",
        body={"metadata": {"annotations": {"colocgrpo.dev/fake-exit": "1"}}},
        content_type="application/merge-patch+json",
    )


def _restart_gang(cluster, operator, ns: str, name: str, pod: dict) -> None:
    """Fail `pod`, then wait for the gang's first restart to be counted and the job to run again."""
    _fail_pod(cluster, ns, pod)
    wait_for(
        lambda: (cluster.get_job(ns, name) or {}).get("status", {}).get("restarts") == 1,
        60,
        "the gang restart",
        on_timeout=operator.log_tail,
    )
    _wait_phase(cluster, operator, ns, name, "Running")


def restarts_logged(log: str, ns: str, name: str) -> list[str]:
    """The operator's "gang restart" lines about one job."""
    return [line for line in log.splitlines() if f"{ns}/{name}: gang restart after" in line]


def test_a_gang_restart_is_counted_once(cluster, operator, op_namespace) -> None:
    """One failed gang: one restart in the status, the metric and the log, however many reconciles
    see the failed Job before it is gone (each of them deletes it again)."""
    ns = op_namespace
    cluster.create_job(ns, tiny_job("twice", runPolicy={"maxRestarts": 3}))
    pod = _running_pod(cluster, ns, "twice")
    _wait_phase(cluster, operator, ns, "twice", "Running")
    before, mark = operator.gang_restarts(), operator.log_mark()
    _restart_gang(cluster, operator, ns, "twice", pod)  # until the replacement gang runs
    assert cluster.get_job(ns, "twice")["status"]["restarts"] == 1
    assert operator.gang_restarts() - before == 1
    assert len(restarts_logged(operator.log_since(mark), ns, "twice")) == 1, operator.log_tail()


def test_status_writes_carry_the_uid_of_their_incarnation(cluster, operator, op_namespace) -> None:
    """A status patch for a deleted-and-recreated job's old uid is refused by the API server."""
    ns = op_namespace
    old = cluster.create_job(ns, tiny_job("again", runPolicy={"suspend": True}))
    cluster.delete_job(ns, "again")
    wait_for(lambda: cluster.get_job(ns, "again") is None, 30, "the first incarnation to go")
    new = cluster.create_job(ns, tiny_job("again", runPolicy={"suspend": True}))
    _wait_phase(cluster, operator, ns, "again", "Suspended")
    with pytest.raises(ObjectGone):
        cluster.api.patch_status(ns, "again", old["metadata"]["uid"], {"restarts": 7, "message": "stale"})
    status = cluster.get_job(ns, "again")["status"]
    assert status.get("restarts", 0) == 0 and status.get("message") != "stale"
    written = cluster.api.patch_status(ns, "again", new["metadata"]["uid"], {"message": "mine"})
    assert written["status"]["message"] == "mine"


def test_a_recreated_job_never_shows_its_predecessors_failure(cluster, operator, op_namespace) -> None:
    """Delete a job with a pod failure in flight and create it again at once, three times: the new
    job's status is its own (no restart, no lastFailure, started after it was created)."""
    ns = op_namespace
    cluster.create_job(ns, tiny_job("phoenix", runPolicy={"maxRestarts": 3}))
    for _ in range(3):
        _fail_pod(cluster, ns, _running_pod(cluster, ns, "phoenix"))
        cluster.delete_job(ns, "phoenix")
        wait_for(lambda: cluster.get_job(ns, "phoenix") is None, 30, "the deleted job to go", interval=0.05)
        created = cluster.create_job(ns, tiny_job("phoenix", runPolicy={"maxRestarts": 3}))
        running = _wait_phase(cluster, operator, ns, "phoenix", "Running")
        assert running["metadata"]["uid"] == created["metadata"]["uid"]
        status = running["status"]
        assert status.get("restarts", 0) == 0, status
        assert not status.get("lastFailure"), status
        assert status["startTime"] >= created["metadata"]["creationTimestamp"], status
    jobs = [j for j in cluster.batch_jobs(ns, "phoenix") if not j["metadata"].get("deletionTimestamp")]
    assert [o["uid"] for j in jobs for o in j["metadata"]["ownerReferences"]] == [created["metadata"]["uid"]]


def test_a_predecessors_child_is_waited_for_and_every_child_applied(cluster, operator, op_namespace) -> None:
    """The `<job>-trainer` ServiceAccount still belongs to someone else (as a predecessor's does until
    the garbage collector removes it): the job waits, it is not an invalid spec; once it is gone,
    every child is applied and the job runs."""
    ns = op_namespace
    holder = cluster.api.request(
        "POST", f"/api/v1/namespaces/{ns}/configmaps", body={"metadata": {"name": "holder"}, "data": {}}
    )
    owner = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "holder",
        "uid": holder["metadata"]["uid"],
        "controller": True,
    }
    cluster.api.request(
        "POST",
        f"/api/v1/namespaces/{ns}/serviceaccounts",
        body={"metadata": {"name": "heir-trainer", "ownerReferences": [owner]}},
    )
    cluster.create_job(ns, tiny_job("heir"))
    wait_for(lambda: "heir-trainer" in operator.log_tail(200), 30, "the operator to meet the foreign ServiceAccount")
    time.sleep(3)  # a few retries later it still waits: not Failed, no invalid spec
    job = cluster.get_job(ns, "heir")
    assert (job.get("status") or {}).get("phase") != "Failed", job.get("status")
    assert condition(job, "SpecValid").get("status") != "False", job.get("status")
    cluster.api.request("DELETE", f"/api/v1/namespaces/{ns}/configmaps/holder")  # the GC takes the account now
    running = _wait_phase(cluster, operator, ns, "heir", "Running", timeout=90)
    uid = running["metadata"]["uid"]
    assert not cluster.list("/api/v1", "services", ns, "colocgrpo.io/job-name=heir")  # one node: no Service
    for prefix, plural, child in [
        ("/api/v1", "configmaps", "heir-config"),
        ("/api/v1", "serviceaccounts", "heir-trainer"),
        ("/apis/rbac.authorization.k8s.io/v1", "roles", "heir-trainer"),
        ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", "heir-trainer"),
    ]:
        obj = cluster.api.request("GET", f"{prefix}/namespaces/{ns}/{plural}/{child}")
        assert [o["uid"] for o in obj["metadata"].get("ownerReferences") or []] == [uid], (plural, child)


def test_a_predecessors_leftovers_go_though_the_garbage_collector_missed_them(solo) -> None:
    """A 2-node job deleted and created again as a 1-node job while the garbage collector is not
    looking (kube-controller-manager frozen, as when its watch is down across an API server
    restart and it never sees the owner go): the new job renders no Service, and still the
    predecessor's goes, with every other child of the predecessor; the new job runs once the
    controllers are back. On a control plane and operator of its own (`solo`): a frozen
    controller manager must not leave its traces in the session's cluster."""
    cluster, operator = solo.cluster, solo.operator
    kubeconfig = Path(solo.kube_cluster.kubeconfig)
    assert has_component(kubeconfig, "kube-controller-manager")
    ns, name = solo.namespace, "shrink"
    selector = f"colocgrpo.io/job-name={name}"
    kinds = [
        ("/api/v1", "services"),
        ("/api/v1", "configmaps"),
        ("/api/v1", "serviceaccounts"),
        ("/apis/rbac.authorization.k8s.io/v1", "roles"),
        ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    ]

    def owners(prefix: str, plural: str) -> list[str]:
        """The owner uids of the job's live children of that kind."""
        return [
            o["uid"]
            for obj in cluster.list(prefix, plural, ns, selector)
            if not obj["metadata"].get("deletionTimestamp")
            for o in obj["metadata"].get("ownerReferences") or []
        ]

    first = cluster.create_job(ns, tiny_job(name, resources={"nodes": 2}, checkpoint={"resume": "never"}))
    old = first["metadata"]["uid"]
    wait_for(lambda: all(owners(*kind) == [old] for kind in kinds), 60, "every child of the 2-node job")
    with paused_component(kubeconfig, "kube-controller-manager"):
        cluster.delete_job(ns, name)
        wait_for(lambda: cluster.get_job(ns, name) is None, 30, "the 2-node job gone")
        new = cluster.create_job(ns, tiny_job(name))["metadata"]["uid"]
        wait_for(
            lambda: owners("/api/v1", "services") == [] and all(owners(*kind) == [new] for kind in kinds[1:]),
            60,
            "the predecessor's Service gone and every other child the new job's",
            on_timeout=lambda: f"{[(k[1], owners(*k)) for k in kinds]}\n{operator.log_tail()}",
        )
    assert f"removed Service {name}" in operator.log_tail(400), operator.log_tail()
    running = _wait_phase(cluster, operator, ns, name, "Running", timeout=90)
    assert running["metadata"]["uid"] == new


def test_a_new_jobs_failed_create_handler_is_retried_by_kopf(cluster, operator, op_namespace) -> None:
    """A new job's create handler writes kopf's diff-base with the job's first record, before its
    children: when a child is then refused (here by a quota), the handler takes the diff-base
    back, so kopf keeps the failure's retry state and retries the handler like any failed one;
    once the quota is gone the job runs, and kopf's annotations end as after any creation."""
    ns = op_namespace
    quota = {"metadata": {"name": "no-configmaps"}, "spec": {"hard": {"count/configmaps": "0"}}}
    cluster.api.request("POST", f"/api/v1/namespaces/{ns}/resourcequotas", body=quota)
    cluster.create_job(ns, tiny_job("quota"))

    def annotations() -> dict:
        return ((cluster.get_job(ns, "quota") or {}).get("metadata") or {}).get("annotations") or {}

    def retrying() -> dict | None:
        found = annotations()
        return found if any(k.startswith("colocgrpo.io/reconcile_job") for k in found) else None

    failed = wait_for(retrying, 60, "kopf's retry state of the failed handler", on_timeout=operator.log_tail)
    assert RECORD_ANNOTATION in failed, failed  # written before the children, as for every job
    assert "colocgrpo.io/last-handled-configuration" not in failed, failed
    assert not cluster.batch_jobs(ns, "quota")
    cluster.api.request("DELETE", f"/api/v1/namespaces/{ns}/resourcequotas/no-configmaps")
    _wait_phase(cluster, operator, ns, "quota", "Running", timeout=90)
    wait_for(
        lambda: (
            "colocgrpo.io/last-handled-configuration" in (found := annotations())
            and not any(k.startswith("colocgrpo.io/reconcile_job") for k in found)
        ),
        60,
        "kopf's diff-base back and its retry state purged",
        on_timeout=lambda: f"{annotations()}\n{operator.log_tail()}",
    )


def test_a_restarted_gang_gets_its_missing_children_back(cluster, operator, op_namespace) -> None:
    ns = op_namespace
    # Two nodes, so the job has a Service to lose; their pods cannot resume together without a claim.
    cluster.create_job(
        ns, tiny_job("mend", resources={"nodes": 2}, checkpoint={"resume": "never"}, runPolicy={"maxRestarts": 2})
    )
    pod = _running_pod(cluster, ns, "mend")
    cluster.api.request("DELETE", f"/api/v1/namespaces/{ns}/configmaps/mend-config")
    cluster.api.request("DELETE", f"/api/v1/namespaces/{ns}/services/mend")
    _restart_gang(cluster, operator, ns, "mend", pod)
    assert cluster.api.request("GET", f"/api/v1/namespaces/{ns}/configmaps/mend-config")
    assert cluster.api.request("GET", f"/api/v1/namespaces/{ns}/services/mend")


def test_an_older_operators_service_of_a_one_node_job_stays_until_the_job_goes(cluster, operator, op_namespace) -> None:
    """A 1-node job made by an operator that gave every job a headless Service keeps it: a gang
    restart (which applies every child again) neither deletes nor changes it, and the garbage
    collector removes it with the job."""
    ns = op_namespace
    body = tiny_job("legacy", runPolicy={"maxRestarts": 2})
    created = cluster.create_job(ns, body)
    pod = _running_pod(cluster, ns, "legacy")
    assert not cluster.list("/api/v1", "services", ns, "colocgrpo.io/job-name=legacy")
    # The Service as the older operator rendered and adopted it.
    service = render_service(parse_job({**body, "metadata": {"name": "legacy", "namespace": ns}}))
    service["metadata"]["ownerReferences"] = [
        {
            "apiVersion": created["apiVersion"],
            "kind": created["kind"],
            "name": "legacy",
            "uid": created["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    kept = cluster.api.request("POST", f"/api/v1/namespaces/{ns}/services", body=service)

    _restart_gang(cluster, operator, ns, "legacy", pod)
    after = cluster.api.request("GET", f"/api/v1/namespaces/{ns}/services/legacy")
    assert after["metadata"]["uid"] == kept["metadata"]["uid"]
    assert after["metadata"]["resourceVersion"] == kept["metadata"]["resourceVersion"]
    # The new gang does without it.
    (new_pod,) = [p for p in cluster.pods(ns, "legacy") if not p["metadata"].get("deletionTimestamp")]
    assert "subdomain" not in new_pod["spec"]

    cluster.delete_job(ns, "legacy")
    wait_for(
        lambda: not cluster.list("/api/v1", "services", ns, "colocgrpo.io/job-name=legacy"),
        60,
        "the garbage collector to remove the Service with its job",
    )


def test_a_large_spec_the_api_admits_is_tracked_runs_and_stays_frozen(cluster, operator, op_namespace) -> None:
    """A spec of some 300 KB (a long trainerArgs value): the API server admits it, so the operator
    runs it; kopf's diff-base keeps its long values as digests, so it fits its annotation, and a
    change of the frozen trainerArgs is still refused, not rolled out."""
    ns = op_namespace
    mark = operator.log_mark()
    cluster.create_job(ns, tiny_job("huge", trainerArgs={"run_name": "x" * 300_000}))
    running = _wait_phase(cluster, operator, ns, "huge", "Running")
    assert condition(running, "SpecValid")["status"] == "True"
    annotations = running["metadata"].get("annotations") or {}
    diffbase = annotations.get("colocgrpo.io/last-handled-configuration", "")
    assert "sha256:" in diffbase and len(diffbase) < 10_000, len(diffbase)
    config = trainer_config_text(cluster, ns, "huge")
    assert "x" * 300_000 in config  # the trainer gets the value itself
    cluster.patch_job(ns, "huge", {"spec": {"trainerArgs": {"run_name": "y" * 300_000}}})
    wait_event(cluster, ns, "ImmutableField", "spec.trainerArgs", 30)
    after = trainer_config_text(cluster, ns, "huge")
    assert after == config
    log = operator.log_since(mark)
    assert "Too long" not in log and "Traceback" not in log, log[-3000:]


@pytest.mark.parametrize("field", ["activeDeadlineSeconds", "stallTimeoutSeconds", "ttlSecondsAfterFinished"])
def test_durations_have_a_maximum_in_the_crd(cluster, crd_installed, namespace, field) -> None:
    with pytest.raises(KubeApiError) as refused:
        cluster.create_job(namespace, tiny_job("forever", runPolicy={field: 9223372037}))
    assert refused.value.status == 422
    assert f"spec.runPolicy.{field}" in refused.value.message
    cluster.create_job(namespace, tiny_job("a-year", runPolicy={field: 365 * 24 * 3600}))


def test_deleting_the_namespace_is_not_a_gang_failure(cluster, kube_cluster, operator) -> None:
    ns = kube_cluster.new_namespace("opt-teardown")
    cluster.create_job(ns, tiny_job("doomed", runPolicy={"maxRestarts": 5}))
    _running_pod(cluster, ns, "doomed")
    _wait_phase(cluster, operator, ns, "doomed", "Running")
    mark = operator.log_mark()
    kube_cluster.delete_namespace(ns)
    wait_for(lambda: cluster.api.namespace_terminating(ns) and cluster.get_job(ns, "doomed") is None, 120,
             "the namespace's job to go")  # fmt: skip
    time.sleep(3)  # what the operator does as the last pods go
    log = operator.log_since(mark)
    mine = [line for line in log.splitlines() if ns in line]
    assert not [line for line in mine if "gang restart" in line or "-> Restarting" in line], mine
    assert not [line for line in mine if " ERROR " in line], mine
    assert "Traceback" not in log, log[-3000:]


HOLD = "colocgrpo.dev/test-hold"


def _hold(cluster, ns: str, pod: str, metadata: dict) -> None:
    """A strategic merge patch of the pod's metadata: adds to or takes from its finalizers, keeping
    the Job controller's own."""
    cluster.api.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{pod}",
        body={"metadata": metadata},
        content_type="application/strategic-merge-patch+json",
    )


def test_a_terminating_namespace_gets_no_event_and_no_line_above_debug(cluster, kube_cluster, tmp_path) -> None:
    """A namespace teardown deletes the pods first and waits for them to go before it deletes the
    Jobs and the jobs: a kubelet stopping a trainer takes its grace period, and a finalizer here
    plays that. Meanwhile a job's pods fail, and a job resumed by its user would start again: the
    operator judges none of it, posts no Event into the namespace (it would refuse it) and logs
    nothing above DEBUG about it."""
    log = tmp_path / "operator.log"
    own = OperatorProcess(Path(kube_cluster.kubeconfig), ["quiet-*"], log, extra_args=("--log-level=DEBUG",))
    ns = kube_cluster.new_namespace("quiet")
    held = None
    try:
        own.start()
        cluster.create_job(ns, tiny_job("running", runPolicy={"maxRestarts": 5}))
        cluster.create_job(ns, tiny_job("paused", runPolicy={"suspend": True}))
        held = _running_pod(cluster, ns, "running")["metadata"]["name"]
        _hold(cluster, ns, held, {"finalizers": [HOLD]})
        _wait_phase(cluster, own, ns, "running", "Running")
        _wait_phase(cluster, own, ns, "paused", "Suspended")
        # The Events of those two transitions are posted after the status that shows them, by kopf's queue: once
        # they are in, nothing judged before the teardown is still on its way to the namespace.
        wait_for(
            lambda: (
                {("running", "Running"), ("paused", "Suspended")}
                <= {((e.get("involvedObject") or {}).get("name"), e.get("reason")) for e in cluster.events(ns)}
            ),
            30,
            "the Events of both jobs' transitions",
        )
        mark = own.log_mark()
        kube_cluster.delete_namespace(ns)
        wait_for(lambda: cluster.api.namespace_terminating(ns), 30, "the namespace to terminate")
        cluster.patch_job(ns, "paused", {"spec": {"runPolicy": {"suspend": False}}})

        def said(name: str) -> bool:
            return any(f"{ns}/{name}" in line for line in own.log_since(mark).splitlines())

        # The held pod failed (the fake kubelet stopped it) and "paused" was resumed: both judged.
        wait_for(lambda: said("running") and said("paused"), 60, "the operator to look at both jobs")
        wait_for(lambda: cluster.pods(ns, "running")[0]["status"].get("phase") == "Failed", 30, "the pod to stop")
        time.sleep(2 * own.recheck_seconds + 1)  # a re-check of every job, twice, for what it would log
        lines = [line for line in own.log_since(mark).splitlines() if ns in line]
        loud = [line for line in lines if not re.match(r"\S+ \S+ DEBUG ", line)]
        assert not loud, "\n".join(loud)
        # kopf logs each request it makes at DEBUG: not one Event was even tried.
        assert not [line for line in lines if f"/namespaces/{ns}/events" in line], lines
        assert cluster.batch_jobs(ns, "paused")[0]["spec"]["suspend"] is True  # not resumed
    finally:
        if held is not None:
            _hold(cluster, ns, held, {"$deleteFromPrimitiveList/finalizers": [HOLD]})
        own.stop()
        kube_cluster.delete_namespace(ns)


def test_jobs_deleted_mid_reconcile_log_no_errors(cluster, operator, op_namespace) -> None:
    """Create and delete at once, again and again: the operator's writes meet 404s and replaced
    objects, which are expected, not ERROR lines with tracebacks."""
    ns = op_namespace
    mark = operator.log_mark()
    for i in range(12):
        cluster.create_job(ns, tiny_job(f"brief-{i % 3}"))
        cluster.delete_job(ns, f"brief-{i % 3}")
        wait_for(lambda i=i: cluster.get_job(ns, f"brief-{i % 3}") is None, 30, "the deletion", interval=0.05)
    cluster.create_job(ns, tiny_job("last"))
    _wait_phase(cluster, operator, ns, "last", "Running")
    time.sleep(6)  # kopf retries a failed handler after 5 s: give it the chance to log one
    log = operator.log_since(mark)
    assert "Traceback" not in log, log[-4000:]
    assert not re.search(rf"ERROR .*{ns}", log), log[-4000:]
