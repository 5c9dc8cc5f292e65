"""End to end on the real node: the chart's operator runs in the cluster, and jobs run in the trainer image in real
containers, as a user meets them. Nothing runs on this machine but the cluster itself: no operator process, no
trainer process, no annotation that plays a pod's end."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from colocgrpo_dev.cluster.binaries import kubectl_path
from colocgrpo_dev.cluster.node.config import NODE_NAME
from colocgrpo_operator.api.naming import JOB_NAME_LABEL, trainer_account_name
from colocgrpo_operator.render.workload import TERMINATION_GRACE_SECONDS, TRAINER_CONTAINER
from support.node_probe import wait_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny-cpu.yaml"
# A job in the trainer image: startup (imports, the model) takes most of it on 2 cores.
JOB_TIMEOUT = 600


def example_job(name: str, **sections: Any) -> dict[str, Any]:
    """examples/tiny-cpu.yaml as `name`, with whole spec sections replaced, or merged one level when given as
    `merge_<section>`."""
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] = {"name": name}
    for key, value in sections.items():
        if key.startswith("merge_"):
            section = key.removeprefix("merge_")
            body["spec"][section] = {**body["spec"].get(section, {}), **value}
        else:
            body["spec"][key] = value
    return body


def get(cluster: Any, namespace: str, *args: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("-n", namespace, "get", *args, "-o", "json").stdout)


def job_pods(cluster: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    return get(cluster, namespace, "pods", "-l", f"{JOB_NAME_LABEL}={name}")["items"]


def wait_for_phase(cluster: Any, release: Any, namespace: str, name: str, phases: set[str], timeout: float) -> dict:
    """The job once its phase is one of `phases`; on timeout, fail with its status, pods and the operator's log."""
    deadline = time.monotonic() + timeout
    while True:
        job = get(cluster, namespace, "colocgrpojob", name)
        if (job.get("status") or {}).get("phase") in phases:
            return job
        if time.monotonic() > deadline:
            pods = cluster.kubectl("-n", namespace, "get", "pods", "-o", "wide", check=False).stdout
            pytest.fail(
                f"{namespace}/{name} not {sorted(phases)} in {timeout:.0f} s: {json.dumps(job.get('status'))}\n"
                f"{pods}\n{release.logs(60)}"
            )
        time.sleep(1)


def progress(job: dict[str, Any]) -> dict[str, Any]:
    return (job.get("status") or {}).get("progress") or {}


def trainer_status(pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = [c for c in pod["status"].get("containerStatuses", []) if c["name"] == TRAINER_CONTAINER]
    return status


def test_the_operator_runs_in_the_cluster_from_the_chart(node_cluster, operator_release, images):
    pods = operator_release.pods()
    assert len(pods) == 2  # the chart's default replicas
    for pod in pods:
        assert pod["spec"]["nodeName"] == NODE_NAME
        assert pod["status"]["phase"] == "Running"
        (container,) = pod["status"]["containerStatuses"]
        assert container["ready"] and container["image"] == images["operator"]
        security = pod["spec"]["containers"][0]["securityContext"]
        assert security["readOnlyRootFilesystem"] is True and security["capabilities"] == {"drop": ["ALL"]}
    # One leads (it reached the API server through the `kubernetes` Service), the other stands by.
    assert operator_release.leader() in {pod["metadata"]["name"] for pod in pods}
    namespace = get(node_cluster, "", "namespace", operator_release.namespace)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    policies = get(node_cluster, operator_release.namespace, "networkpolicies")["items"]
    assert [p["metadata"]["name"] for p in policies] == [operator_release.fullname]
    binding = get(node_cluster, "", "clusterrolebinding", operator_release.fullname)
    assert binding["subjects"][0]["name"] == operator_release.fullname  # the chart's RBAC, its ServiceAccount


def test_tiny_cpu_example_runs_in_the_trainer_image(
    node_cluster, operator_release, images, job_namespace, kubectl_plugin_env
):
    node_cluster.kubectl("-n", job_namespace, "apply", "-f", str(EXAMPLE))
    job = wait_for_phase(
        node_cluster, operator_release, job_namespace, "tiny-cpu", {"Succeeded", "Failed"}, JOB_TIMEOUT
    )
    assert job["status"]["phase"] == "Succeeded", job["status"]
    assert progress(job)["step"] == progress(job)["maxSteps"] == 2
    (pod,) = job_pods(node_cluster, job_namespace, "tiny-cpu")
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert pod["spec"]["serviceAccountName"] == trainer_account_name("tiny-cpu")
    trainer = trainer_status(pod)
    assert trainer["image"] == images["trainer"]
    assert trainer["state"]["terminated"]["exitCode"] == 0
    # status.progress was written by the trainer's own client (its ServiceAccount token, in the pod), not the
    # operator's: nothing else that writes this job runs.
    full = json.loads(
        node_cluster.kubectl(
            "-n", job_namespace, "get", "cgj", "tiny-cpu", "-o", "json", "--show-managed-fields"
        ).stdout
    )
    writers = {
        entry["manager"]
        for entry in full["metadata"]["managedFields"]
        if "f:progress" in (entry.get("fieldsV1") or {}).get("f:status", {})
    }
    operator_writers = {
        entry["manager"]
        for entry in full["metadata"]["managedFields"]
        if "f:phase" in (entry.get("fieldsV1") or {}).get("f:status", {})
    }
    assert writers and not writers & operator_writers, full["metadata"]["managedFields"]
    logs = subprocess.run(  # what a user types: kubectl finds the plugin on PATH, the cluster in KUBECONFIG
        [str(kubectl_path()), "colocgrpo", "logs", "tiny-cpu", "-n", job_namespace],
        capture_output=True,
        text=True,
        env={**kubectl_plugin_env, "KUBECONFIG": str(node_cluster.kubeconfig)},
        timeout=120,
    )
    assert logs.returncode == 0, logs.stderr
    assert '{"progress": ' in logs.stdout and "final model saved to /checkpoints/final" in logs.stdout


def test_two_pod_job_rendezvouses_through_the_headless_service(node_cluster, operator_release, job_namespace):
    body = example_job(
        "pair",
        resources={"nodes": 2, "gpusPerNode": 0, "memory": "2Gi"},  # no CPU request: 2 pods on a 2-core node
        checkpoint={"resume": "never"},
        merge_trainerArgs={"max_steps": 3},
    )
    node_cluster.kubectl("-n", job_namespace, "apply", "-f", "-", input=json.dumps(body))
    job = wait_for_phase(node_cluster, operator_release, job_namespace, "pair", {"Succeeded", "Failed"}, JOB_TIMEOUT)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    assert progress(job)["step"] == 3
    pods = job_pods(node_cluster, job_namespace, "pair")
    assert len(pods) == 2 and {p["spec"]["nodeName"] for p in pods} == {NODE_NAME}
    assert {p["spec"]["subdomain"] for p in pods} == {"pair"}
    for pod in pods:
        environment = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert environment["MASTER_ADDR"] == "pair-0.pair"  # resolved by the cluster DNS in each pod
        assert trainer_status(pod)["state"]["terminated"]["exitCode"] == 0


def test_killed_container_restarts_the_gang_from_the_checkpoint(
    node_cluster, operator_release, job_namespace, job_volume
):
    steps = 16
    body = example_job(
        "crash",
        checkpoint={"claimName": job_volume.claim, "saveSteps": 2},
        merge_trainerArgs={"max_steps": steps},
        runPolicy={"maxRestarts": 2},
    )
    node_cluster.kubectl("-n", job_namespace, "apply", "-f", "-", input=json.dumps(body))

    def complete_checkpoint() -> int | None:
        done = [
            int(folder.name.split("-")[1])
            for folder in job_volume.path.glob("checkpoint-*")
            if (folder / "COLOCGRPO_COMPLETE").is_file() and (folder / "trainer_state.json").is_file()
        ]
        return max(done) if done and max(done) >= 4 else None

    saved = wait_for(complete_checkpoint, "a complete checkpoint at step 4 or later", JOB_TIMEOUT)
    (first,) = job_pods(node_cluster, job_namespace, "crash")
    container = trainer_status(first)["containerID"].removeprefix("containerd://")
    seen: list[dict[str, Any]] = []
    _watch_pod(node_cluster, job_namespace, first["metadata"]["name"], seen)  # the operator deletes the failed gang
    node_cluster.node.kill_container(container)  # from the runtime, as a crash or the OOM killer would

    job = wait_for_phase(node_cluster, operator_release, job_namespace, "crash", {"Succeeded", "Failed"}, JOB_TIMEOUT)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    assert job["status"]["restarts"] == 1  # counted once
    assert progress(job)["step"] == steps
    ends = [trainer_status(p)["state"].get("terminated") for p in seen if p["status"].get("containerStatuses")]
    assert [end["exitCode"] for end in ends if end][-1:] == [137]  # SIGKILL
    (second,) = [
        p for p in job_pods(node_cluster, job_namespace, "crash") if p["metadata"]["uid"] != first["metadata"]["uid"]
    ]
    log = node_cluster.kubectl("-n", job_namespace, "logs", second["metadata"]["name"]).stdout
    resumed = [line for line in log.splitlines() if "resuming from /checkpoints/checkpoint-" in line]
    assert resumed, log[-3000:]
    assert int(resumed[0].rsplit("checkpoint-", 1)[1].split()[0]) >= saved
    assert (job_volume.path / "final").is_dir()


def test_deleted_job_stops_its_containers_with_sigterm(node_cluster, operator_release, job_namespace):
    body = example_job("stop", merge_trainerArgs={"max_steps": 500})
    node_cluster.kubectl("-n", job_namespace, "apply", "-f", "-", input=json.dumps(body))
    wait_for(
        lambda: progress(get(node_cluster, job_namespace, "colocgrpojob", "stop")).get("step", 0) >= 1,
        "the trainer to report its first step",
        JOB_TIMEOUT,
    )
    (pod,) = job_pods(node_cluster, job_namespace, "stop")
    seen: list[dict[str, Any]] = []
    watcher = _watch_pod(node_cluster, job_namespace, pod["metadata"]["name"], seen)
    deleted_at = datetime.now(UTC)
    node_cluster.kubectl("-n", job_namespace, "delete", "colocgrpojob", "stop", "--wait=false")
    watcher.join(timeout=TERMINATION_GRACE_SECONDS + 60)
    assert not watcher.is_alive(), "the pod outlived its grace period"
    ends = [trainer_status(p)["state"].get("terminated") for p in seen if p["status"].get("containerStatuses")]
    ends = [end for end in ends if end]
    assert ends, "the pod was deleted without reporting its container's end"
    assert ends[-1]["exitCode"] == 143  # SIGTERM, handled: the trainer's own exit code for a preemption
    finished = datetime.fromisoformat(ends[-1]["finishedAt"].replace("Z", "+00:00"))
    assert (finished - deleted_at).total_seconds() < TERMINATION_GRACE_SECONDS
    # Nothing left: no child object, no container in the runtime.
    selector = f"{JOB_NAME_LABEL}=stop"
    for kind in ("jobs.batch", "pods", "configmaps", "services", "serviceaccounts", "roles", "rolebindings"):
        wait_for(
            lambda kind=kind: not get(node_cluster, job_namespace, kind, "-l", selector)["items"],
            f"the job's {kind} to be collected",
            120,
        )
    # The kubelet's container garbage collection (every minute) removes the dead pod's sandbox too.
    wait_for(lambda: not node_cluster.node.pod_containers(job_namespace), "the runtime to hold no container", 180)


def test_tensorboard_event_files_land_on_the_job_volume(node_cluster, operator_release, job_namespace, job_volume):
    body = example_job(
        "board", checkpoint={"claimName": job_volume.claim}, merge_trainerArgs={"report_to": "tensorboard"}
    )
    node_cluster.kubectl("-n", job_namespace, "apply", "-f", "-", input=json.dumps(body))
    job = wait_for_phase(node_cluster, operator_release, job_namespace, "board", {"Succeeded", "Failed"}, JOB_TIMEOUT)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    events = [p for p in job_volume.path.rglob("events.out.tfevents.*") if p.stat().st_size > 0]
    assert events, sorted(str(p.relative_to(job_volume.path)) for p in job_volume.path.rglob("*"))[:50]


def _watch_pod(cluster: Any, namespace: str, name: str, seen: list[dict[str, Any]]) -> threading.Thread:
    """Record every state of pod `name` until it is deleted (the thread then ends)."""
    process = subprocess.Popen(
        [
            str(kubectl_path()),
            f"--kubeconfig={cluster.kubeconfig}",
            "-n",
            namespace,
            "get",
            "pod",
            name,
            "--watch",
            "--output-watch-events",
            "-o",
            "json",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )

    def follow() -> None:
        decoder = json.JSONDecoder()
        buffer = ""
        assert process.stdout is not None
        for line in process.stdout:
            buffer += line
            try:
                event, end = decoder.raw_decode(buffer.lstrip())
            except ValueError:
                continue
            buffer = buffer.lstrip()[end:]
            seen.append(event["object"])
            if event["type"] == "DELETED":
                process.terminate()
                return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread
