"""`kubectl colocgrpo` get, describe, suspend, resume, delete and `logs --all -f`, run by the real kubectl
against the real local control plane and the operator, and `kubectl colocgrpo <TAB>` through kubectl's
own completion. kubectl finds the plugin (and its completion program) on PATH, in this interpreter's bin
folder, as tests/cli/test_kubectl_plugin.py explains; fake pods are driven as the operator tests drive
them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from colocgrpo_dev.cluster import drive_pod_failure, drive_pod_success
from colocgrpo_dev.cluster.binaries import kubectl_path
from colocgrpo_dev.cluster.kwokctl_config import FAKE_LOG_LINES
from support.cli_runner import run_colocgrpo
from support.operator_harness import REPO, running_pod, tiny_job, wait_for, wait_phase

pytestmark = pytest.mark.cluster

BIN = Path(sys.executable).parent


def plugin_env(kube_cluster) -> dict[str, str]:
    for program in ("kubectl-colocgrpo", "kubectl_complete-colocgrpo"):
        assert (BIN / program).is_file(), f"{BIN / program} is not installed: reinstall the venv (`make dev-venv`)"
    return dict(
        os.environ,
        PATH=f"{BIN}:/usr/bin:/bin",
        PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'training'}",
        KUBECONFIG=str(kube_cluster.kubeconfig),
    )


def kubectl(kube_cluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(kubectl_path()), *args], capture_output=True, text=True, env=plugin_env(kube_cluster), timeout=timeout
    )


def plugin(kube_cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return kubectl(kube_cluster, "colocgrpo", *args)


def columns(text: str) -> list[list[str]]:
    """A table as kubectl prints it, cut at the header's column starts: an empty cell (a suspended job's STEP) is
    an empty string in its place, not a shift of every later cell."""
    header, *rows = text.strip("\n").splitlines()
    starts = [match.start() for match in re.finditer(r"\S+", header)]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    return [header.split()] + [[row[start:end].strip() for start, end in bounds] for row in rows]


def report_progress(cluster, namespace: str, name: str, step: int, max_steps: int, reward: float) -> None:
    progress = {
        "step": step,
        "maxSteps": max_steps,
        "metrics": {"reward": reward},
        "lastUpdateTime": "2026-01-01T00:00:00Z",
    }
    cluster.patch_job(namespace, name, {"status": {"progress": progress}}, subresource="status")


def test_get_prints_kubectls_columns_with_the_step_of_max_steps(cluster, kube_cluster, operator, op_namespace):
    ns = op_namespace
    cluster.create_job(ns, tiny_job("alpha"))
    cluster.create_job(ns, tiny_job("beta", runPolicy={"suspend": True}))
    wait_phase(cluster, ns, "alpha", "Running", operator=operator)
    wait_phase(cluster, ns, "beta", "Suspended", operator=operator)
    report_progress(cluster, ns, "alpha", 3, 20, 0.25)

    ours = plugin(kube_cluster, "get", "-n", ns)
    theirs = kubectl(kube_cluster, "get", "cgj", "-n", ns)
    assert ours.returncode == 0 and theirs.returncode == 0, ours.stderr + theirs.stderr
    mine, kubectls = columns(ours.stdout), columns(theirs.stdout)
    assert mine[0] == kubectls[0] == ["NAME", "PHASE", "NODES", "GPUS", "TP", "STEP", "REWARD", "RESTARTS", "AGE"]
    rows = {row[0]: row for row in mine[1:]}
    assert rows["alpha"][:8] == ["alpha", "Running", "1", "0", "1", "3/20", "0.25", "0"]
    assert rows["beta"][1] == "Suspended"
    for row in kubectls[1:]:  # every column as kubectl prints it, but the step of maxSteps and the age
        assert rows[row[0]][:5] + rows[row[0]][6:8] == row[:5] + row[6:8]
    assert rows["alpha"][5].split("/")[0] == {r[0]: r for r in kubectls[1:]}["alpha"][5]

    one = plugin(kube_cluster, "get", "alpha", "-n", ns, "-o", "json")
    assert one.returncode == 0 and json.loads(one.stdout)["status"]["progress"]["step"] == 3
    listed = yaml.safe_load(plugin(kube_cluster, "get", "-n", ns, "-o", "yaml").stdout)
    assert listed["kind"] == "List" and [item["metadata"]["name"] for item in listed["items"]] == ["alpha", "beta"]
    wide = columns(plugin(kube_cluster, "get", "alpha", "-n", ns, "-o", "wide").stdout)
    assert wide[0][-1] == "REASON" and all(wide[1]), wide  # every wide column filled for a running job

    other = kube_cluster.new_namespace("opt-verbs-other")
    try:
        cluster.create_job(other, tiny_job("gamma", runPolicy={"suspend": True}))
        everywhere = columns(plugin(kube_cluster, "get", "--all-namespaces").stdout)
        assert everywhere[0][:2] == ["NAMESPACE", "NAME"]
        assert {(ns, "alpha"), (ns, "beta"), (other, "gamma")} <= {(row[0], row[1]) for row in everywhere[1:]}
    finally:
        kube_cluster.delete_namespace(other)

    missing = plugin(kube_cluster, "get", "nothing", "-n", ns)
    assert missing.returncode == 1 and missing.stderr.strip() == f"error: ColocGRPOJob {ns}/nothing not found"
    empty = kube_cluster.new_namespace("opt-verbs-empty")
    try:
        none = plugin(kube_cluster, "get", "-n", empty)
        assert none.returncode == 0 and none.stdout == "" and f"No resources found in {empty} namespace." in none.stderr
    finally:
        kube_cluster.delete_namespace(empty)


def test_describe_shows_conditions_the_last_failure_events_and_the_plan(
    cluster, kube_cluster, operator, op_namespace, tmp_path
):
    ns = op_namespace
    cluster.create_job(ns, tiny_job("flaky", runPolicy={"maxRestarts": 2}))
    first = running_pod(cluster, ns, "flaky")
    drive_pod_failure(kube_cluster.core_v1, ns, first["metadata"]["name"], exit_code=3, message="NCCL timeout: rank 1")
    second = running_pod(cluster, ns, "flaky", exclude_uid=first["metadata"]["uid"], timeout=45)
    wait_phase(cluster, ns, "flaky", "Running", operator=operator)
    report_progress(cluster, ns, "flaky", 4, 10, 0.5)
    wait_for(
        lambda: "Restarting" in plugin(kube_cluster, "describe", "flaky", "-n", ns).stdout, 60, "the Restarting Event"
    )

    text = plugin(kube_cluster, "describe", "flaky", "-n", ns).stdout
    for expected in (
        "Name:", "flaky", f"Namespace:  {ns}", "Phase:", "Running",
        "Progress:", "step 4/10", "reward 0.5",
        "Restarts:", "1 of at most 2",
        "Conditions:", "SpecValid", "Running",
        "Last failure:", "NCCL timeout: rank 1", "Exit code:  3", first["metadata"]["name"],
        "Pods:", second["metadata"]["name"],
        "Plan:", "CPU job (gpusPerNode 0): no vLLM and no GPU memory to plan",
        "Events:", "Restarting",
    ):  # fmt: skip
        assert expected in text, (expected, text)

    # A GPU job's plan is the verdict `colocgrpo plan` gives its file.
    seed = yaml.safe_load((REPO / "examples/seed-qwen14b-tp4.yaml").read_text())
    seed["spec"]["runPolicy"] = {"suspend": True}  # planned, never scheduled
    (tmp_path / "seed.yaml").write_text(yaml.safe_dump(seed))
    cluster.create_job(ns, seed)
    offline = run_colocgrpo("plan", "-f", str(tmp_path / "seed.yaml"), "-o", "json")
    verdict = json.loads(offline.stdout)
    described = plugin(kube_cluster, "describe", "seed-qwen14b-tp4", "-n", ns)
    assert described.returncode == 0, described.stderr
    plan = described.stdout.split("Plan:\n", 1)[1].split("\nEvents:", 1)[0]
    assert plan.splitlines()[0].strip() == verdict["summary"]
    assert f"recommended gpuMemoryUtilization: {verdict['recommendedGpuMemoryUtilization']:.2f}" in plan

    missing = plugin(kube_cluster, "describe", "nothing", "-n", ns)
    assert missing.returncode == 1 and missing.stderr.strip() == f"error: ColocGRPOJob {ns}/nothing not found"


def test_suspend_resume_and_delete(cluster, kube_cluster, operator, op_namespace):
    ns = op_namespace
    cluster.create_job(ns, tiny_job("pausable"))
    first = running_pod(cluster, ns, "pausable")

    done = plugin(kube_cluster, "suspend", "pausable", "-n", ns)
    assert (done.returncode, done.stdout) == (0, "colocgrpojob.colocgrpo.io/pausable suspended\n"), done.stderr
    assert cluster.get_job(ns, "pausable")["spec"]["runPolicy"]["suspend"] is True
    wait_phase(cluster, ns, "pausable", "Suspended", operator=operator)
    again = plugin(kube_cluster, "suspend", "pausable", "-n", ns)
    assert again.returncode == 0 and "already suspended: nothing to do" in again.stdout
    resumed = plugin(kube_cluster, "resume", "pausable", "-n", ns)
    assert (resumed.returncode, resumed.stdout) == (0, "colocgrpojob.colocgrpo.io/pausable resumed\n")
    second = running_pod(cluster, ns, "pausable", exclude_uid=first["metadata"]["uid"])
    drive_pod_success(kube_cluster.core_v1, ns, second["metadata"]["name"])
    wait_phase(cluster, ns, "pausable", "Succeeded", operator=operator)

    late = plugin(kube_cluster, "suspend", "pausable", "-n", ns)
    assert late.returncode == 1
    assert (
        late.stderr.strip() == f"error: ColocGRPOJob {ns}/pausable has already Succeeded: there is nothing to suspend"
    )
    late = plugin(kube_cluster, "resume", "pausable", "-n", ns)
    assert late.returncode == 1 and "a finished job does not resume" in late.stderr

    gone = plugin(kube_cluster, "delete", "pausable", "-n", ns)  # waits, as kubectl delete does
    assert (gone.returncode, gone.stdout) == (0, 'colocgrpojob.colocgrpo.io "pausable" deleted\n'), gone.stderr
    assert cluster.get_job(ns, "pausable") is None
    missing = plugin(kube_cluster, "delete", "pausable", "-n", ns)
    assert missing.returncode == 1 and f"ColocGRPOJob {ns}/pausable not found" in missing.stderr
    assert plugin(kube_cluster, "delete", "pausable", "-n", ns, "--ignore-not-found").returncode == 0
    cluster.create_job(ns, tiny_job("quick"))
    quick = plugin(kube_cluster, "delete", "quick", "-n", ns, "--wait=false")
    assert quick.returncode == 0 and '"quick" deleted' in quick.stdout
    wait_for(lambda: cluster.get_job(ns, "quick") is None, 60, "quick gone")
    assert plugin(kube_cluster, "resume", "quick", "-n", ns).returncode == 1


class Output:
    """A stream of a running process, read line by line in a thread."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        for line in stream:
            self.lines.append(line.rstrip("\n"))


def test_logs_all_interleaves_every_rank_and_follows_a_restarted_gang(cluster, kube_cluster, operator, op_namespace):
    ns = op_namespace
    cluster.create_job(
        ns, tiny_job("gang", resources={"nodes": 2}, checkpoint={"resume": "never"}, runPolicy={"maxRestarts": 1})
    )
    first = {rank: running_pod(cluster, ns, "gang", index=rank) for rank in (0, 1)}
    for rank, pod in first.items():
        kube_cluster.set_fake_logs(ns, pod["metadata"]["name"], [f"rank {rank} step 1"], container="trainer")
    wait_for(
        lambda: (
            sorted(plugin(kube_cluster, "logs", "gang", "--all", "-n", ns).stdout.splitlines())
            == ["[rank 0] rank 0 step 1", "[rank 1] rank 1 step 1"]
        ),
        60,
        "both ranks' fake logs, prefixed",
    )

    follow = subprocess.Popen(
        [str(kubectl_path()), "colocgrpo", "logs", "gang", "--all", "-f", "-n", ns],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=plugin_env(kube_cluster),
    )
    try:
        out, err = Output(follow.stdout), Output(follow.stderr)
        wait_for(lambda: {"[rank 0] rank 0 step 1", "[rank 1] rank 1 step 1"} <= set(out.lines), 60, "both ranks")
        drive_pod_failure(kube_cluster.core_v1, ns, first[0]["metadata"]["name"], exit_code=1, message="boom")
        second = [
            running_pod(cluster, ns, "gang", index=rank, exclude_uid=first[rank]["metadata"]["uid"], timeout=60)
            for rank in (0, 1)
        ]
        wait_for(
            lambda: {f"[rank {r}] {FAKE_LOG_LINES[0]}" for r in (0, 1)} <= set(out.lines), 60, "the new gang's lines"
        )
        for pod in second:
            drive_pod_success(kube_cluster.core_v1, ns, pod["metadata"]["name"])
        assert follow.wait(90) == 0  # ends by itself once the job has Succeeded
    finally:
        follow.kill()
    out.thread.join(10)
    err.thread.join(10)
    notices = "\n".join(err.lines)
    assert f"[rank 0] --- pod {first[0]['metadata']['name']} ended: Failed (Error, exit code 1)" in notices, notices
    for pod in first.values():
        assert f"pod {pod['metadata']['name']} went away (deleted)" in notices, notices
    for rank, pod in enumerate(second):
        assert f"[rank {rank}] --- following pod {pod['metadata']['name']}, a new pod of rank {rank}" in notices
    assert all(line.startswith(("[rank 0] ", "[rank 1] ")) for line in out.lines), out.lines


def test_kubectl_completes_the_plugins_verbs_flags_and_job_names(cluster, kube_cluster, operator, op_namespace):
    ns = op_namespace
    cluster.create_job(ns, tiny_job("completable", runPolicy={"suspend": True}))

    def candidates(*words: str) -> tuple[list[str], str]:
        result = kubectl(kube_cluster, "__complete", "colocgrpo", *words)
        assert result.returncode == 0, result.stderr
        *lines, directive = result.stdout.strip().splitlines()
        return [line.split("\t")[0] for line in lines], directive

    verbs, directive = candidates("")
    assert {"get", "describe", "suspend", "resume", "delete", "logs", "completion"} <= set(verbs)
    assert directive == ":4"
    assert candidates("des")[0] == ["describe"]
    assert candidates("describe", "-n", ns, "")[0] == ["completable"]
    assert candidates("get", "-n", ns, "--output=")[0] == ["--output=json", "--output=yaml", "--output=wide"]
    assert ns in candidates("get", "-n", "opt-")[0]
    assert "--all-namespaces" in candidates("get", "--all")[0]
