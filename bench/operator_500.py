"""Benchmark: apply N (default 500) small ColocGRPOJobs at once; how fast does each get its Job?

Measures, against the local control plane (or any cluster via --kubeconfig):
- time from each job's create call returning to its batch Job appearing in a watch stream
  (p50, p90, p99, max) and the total from the first create to the last Job;
- time until every job's status shows a phase past Pending;
- the operator's RSS (from /proc: idle before the burst, at the end, peak, after a quiet
  period) and how many of the pods are Running at those points;
- API requests per job: the operator's own handler requests (its request counter), and the
  apiserver's `apiserver_request_total` delta (all clients, and for colocgrpojobs only).

Usage: python -m bench.operator_500 [--count 500] [--fresh-cluster] [--kubeconfig FILE] [--suspended] [--keep]
       [--operator-src DIR]
       python -m bench.operator_500 --table RUN.json [RUN.json ...]
Results go to stdout as JSON; `--table` prints the runs' results as the Markdown table of
docs/benchmarks/operator.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from colocgrpo_dev.operator_process import OperatorProcess

REPO = Path(__file__).resolve().parents[1]
# Reconciles by trigger: the histogram's count (create, update, resume, child, status, ...).
RECONCILES = "colocgrpo_reconcile_duration_seconds_count"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of metric `name` in Prometheus text `text`: (labels, value) each."""
    samples = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        elif line.startswith(name + " "):
            labels = {}
        else:
            continue
        samples.append((labels, float(line.rsplit(" ", 1)[1])))
    return samples


def apiserver_metrics(api: Any) -> str:
    """The apiserver's own /metrics text."""
    response = api.pool.request("GET", f"{api.server}/metrics", headers=api.credentials.auth_headers())
    return response.data.decode()


def operator_metrics(port: int) -> str:
    """The operator's /metrics text."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def apiserver_requests(text: str) -> tuple[float, float]:
    """(all requests, requests on colocgrpojobs) from the apiserver's metrics `text`."""
    samples = metric_samples(text, "apiserver_request_total")
    total = sum(value for _, value in samples)
    cgj = sum(value for labels, value in samples if labels.get("resource") == "colocgrpojobs")
    return total, cgj


def apiserver_request_counts(text: str) -> dict[str, float]:
    """`apiserver_request_total` by "VERB resource[/subresource] code", for the operator's writes and
    the few reads that show retries: every request on colocgrpojobs, and the children's creates."""
    counts: dict[str, float] = {}
    for labels, value in metric_samples(text, "apiserver_request_total"):
        if labels.get("resource") != "colocgrpojobs" and labels.get("verb") not in ("APPLY",):
            continue
        resource = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        key = f"{labels.get('verb')} {resource} {labels.get('code')}"
        counts[key] = counts.get(key, 0.0) + value
    return counts


def operator_metric(text: str, name: str) -> float:
    """One of the operator's counters in its metrics `text`, summed over its labels."""
    return sum(value for _, value in metric_samples(text, name))


def operator_metric_by_label(text: str, name: str, label: str) -> dict[str, float]:
    """One of the operator's counters (or a histogram's _count), summed by one label's value."""
    counts: dict[str, float] = {}
    for labels, value in metric_samples(text, name):
        key = labels.get(label, "")
        counts[key] = counts.get(key, 0.0) + value
    return counts


def per_job(after: dict[str, float], before: dict[str, float], count: int) -> dict[str, float]:
    """The deltas of a breakdown, per job, leaving out what did not change."""
    deltas = {key: (value - before.get(key, 0.0)) / count for key, value in sorted(after.items())}
    return {key: round(value, 2) for key, value in deltas.items() if value}


def pod_phases(api: Any, namespace: str) -> dict[str, int]:
    """How many of the benchmark's pods are in each phase now."""
    phases: dict[str, int] = {}
    for pod in (api.request("GET", f"/api/v1/namespaces/{namespace}/pods") or {}).get("items", []):
        phase = (pod.get("status") or {}).get("phase") or "Unknown"
        phases[phase] = phases.get(phase, 0) + 1
    return phases


def wait_for_earlier_namespaces(api: Any, timeout: float) -> None:
    """Wait until no namespace of an earlier run (bench-*) is being deleted: deleting one takes the
    control plane tens of seconds (its 500 jobs, their children and pods), and a run that
    starts meanwhile shares the two cores with that teardown."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items = (api.request("GET", "/api/v1/namespaces") or {}).get("items", [])
        if not any(
            ((ns.get("metadata") or {}).get("name") or "").startswith("bench-")
            and (ns.get("status") or {}).get("phase") == "Terminating"
            for ns in items
        ):
            return  # (one left by --keep is no teardown)
        time.sleep(2)
    print("warning: an earlier run's namespace is still being deleted", file=sys.stderr)


def job_body(name: str, suspended: bool) -> dict[str, Any]:
    return {
        "apiVersion": "colocgrpo.io/v1alpha1",
        "kind": "ColocGRPOJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "/models/tiny", "dtype": "float32"},
            "dataset": {"name": "/data/arith.jsonl", "promptColumn": "prompt"},
            "resources": {"nodes": 1, "gpusPerNode": 0, "cpu": "10m", "memory": "16Mi"},
            "rewards": [{"function": "accuracy"}],
            "trainerArgs": {"max_steps": 1},
            "runPolicy": {"suspend": suspended, "maxRestarts": 0},
        },
    }


class JobWatcher(threading.Thread):
    """Records when each batch Job is first seen (a watch stream, not polling)."""

    def __init__(self, api: Any, namespace: str):
        super().__init__(daemon=True)
        self.api, self.namespace = api, namespace
        self.first_seen: dict[str, float] = {}
        self.ready = threading.Event()
        self.stop = False

    def run(self) -> None:
        path = f"/apis/batch/v1/namespaces/{self.namespace}/jobs"
        version = ""
        while not self.stop:
            query = f"?watch=true&timeoutSeconds=600&allowWatchBookmarks=true&resourceVersion={version}"
            response = self.api.pool.request(
                "GET",
                f"{self.api.server}{path}{query}",
                headers=self.api.credentials.auth_headers(),
                preload_content=False,
                timeout=None,
            )
            if response.status != 200:
                # A fresh control plane answers 429 ("storage is (re)initializing") for a moment.
                response.release_conn()
                time.sleep(0.5)
                continue
            self.ready.set()
            buffer = b""
            for chunk in response.stream(65536):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        version = self._seen(json.loads(line)) or version
                if self.stop:
                    return
            # The stream ended (the apiserver may end a watch early): list what came meanwhile,
            # seen now (a late time, never an early one), and watch on from the list.
            listed = self.api.request("GET", path) or {}
            for item in listed.get("items", []):
                self._seen({"object": item})
            version = (listed.get("metadata") or {}).get("resourceVersion") or ""

    def _seen(self, event: dict[str, Any]) -> str | None:
        """Record the event's Job if new; its object's resourceVersion."""
        if event.get("type") == "ERROR":
            return ""  # e.g. an expired version: watch from now on (the list above catches up)
        metadata = (event.get("object") or {}).get("metadata") or {}
        name = metadata.get("name")
        if name and event.get("type") != "BOOKMARK" and name not in self.first_seen:
            self.first_seen[name] = time.monotonic()
        return metadata.get("resourceVersion")


CONTROL_PLANE = ("kube-apiserver", "etcd", "kube-controller", "kube-scheduler", "kwok-controller")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def control_plane_cpu(cluster_dir: Path) -> dict[str, float]:
    """CPU seconds so far of this cluster's control-plane processes (by their folder), by name."""
    totals: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            if name.startswith(CONTROL_PLANE) and str(cluster_dir) in cmdline:
                totals[name] = totals.get(name, 0.0) + cpu_seconds(int(entry.name))
        except OSError:
            continue
    return totals


def rss_kib(pid: int) -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


TABLE_HEADER = (
    "| run | all Jobs | p50 | p99 | statuses past Pending | RSS idle / end / peak / settled | operator CPU "
    "| apiserver CPU | operator req/job | apiserver req/job (all / cgj) | cgj PATCH / status PATCH per job "
    "| create reconciles per job | load average at end |"
)


def table_row(name: str, run: dict[str, Any]) -> str:
    """One run's results as a row under `TABLE_HEADER` (its name in the first cell)."""
    kinds = run.get("apiserver_requests_per_job_by_kind") or {}
    patches = f"{kinds.get('PATCH colocgrpojobs 200', 0):.2f} / {kinds.get('PATCH colocgrpojobs/status 200', 0):.2f}"
    rss = " / ".join(
        f"{run[key]:.1f}"
        for key in ("operator_rss_idle_mib", "operator_rss_mib", "operator_rss_peak_mib", "operator_rss_settled_mib")
    )
    apiserver_cpu = (run.get("control_plane_cpu_seconds") or {}).get("kube-apiserver")
    load = run.get("load_average_at_end") or []
    return (
        f"| {name} | {run['all_jobs_seconds']:.1f} s | {run['job_latency_p50_seconds']:.2f} s "
        f"| {run['job_latency_p99_seconds']:.2f} s | {run['all_status_seconds']:.1f} s | {rss} MiB "
        f"| {run['operator_cpu_seconds']:.1f} s | {'—' if apiserver_cpu is None else f'{apiserver_cpu:.1f} s'} "
        f"| {run['operator_handler_requests_per_job']:.2f} "
        f"| {run['apiserver_requests_per_job_all_clients']:.1f} "
        f"/ {run['apiserver_colocgrpojobs_requests_per_job']:.1f} "
        f"| {patches} | {(run.get('reconciles_per_job_by_trigger') or {}).get('create', 0):.2f} "
        f"| {', '.join(f'{x:.1f}' for x in load) or '—'} |"
    )


def results_table(paths: list[Path]) -> str:
    """The Markdown table of the runs' result files, in the order given."""
    rows = [table_row(path.name, json.loads(path.read_text())) for path in paths]
    return "\n".join([TABLE_HEADER, "|" + "---|" * TABLE_HEADER.count(" | ") + "---|", *rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--table", nargs="+", type=Path, default=None, metavar="RUN.json", help="print these runs' results as a table"
    )
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--kubeconfig", default=None, help="default: start/reuse the local dev cluster")
    parser.add_argument("--suspended", action="store_true", help="create the jobs suspended (no pods)")
    parser.add_argument("--threads", type=int, default=8, help="client threads creating jobs")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--keep", action="store_true", help="keep the namespace afterwards")
    parser.add_argument(
        "--operator-src",
        default=str(REPO),
        metavar="DIR",
        help="run the operator from this checkout (e.g. a worktree of an older commit, for a "
        "before/after comparison with the same benchmark)",
    )
    # Its own local cluster by default: 500-job bursts would stall the Job controller for anyone else
    # using the demo's cluster (`make demo`, tests reusing it).
    parser.add_argument("--cluster-name", default="colocgrpo-bench", help="local dev cluster to start/reuse")
    parser.add_argument(
        "--fresh-cluster",
        action="store_true",
        help="stop and remove the bench's own cluster first, so the run starts on an empty one (no earlier "
        "run's objects, Events or teardown)",
    )
    args = parser.parse_args(argv)
    if args.table:
        print(results_table(args.table))
        return 0

    from colocgrpo_dev.cluster import DevCluster
    from colocgrpo_operator.kube.client import KubeApi

    cluster = DevCluster(name=args.cluster_name)
    if args.fresh_cluster and not args.kubeconfig:
        cluster.down()
    kubeconfig = Path(args.kubeconfig) if args.kubeconfig else cluster.up()
    if args.kubeconfig:
        cluster = None
    # A connection per creating thread, plus the Job watch and the metrics/status reads.
    api = KubeApi.from_kubeconfig(kubeconfig, field_manager="colocgrpo-bench", pool_size=args.threads + 4)
    kubectl = [
        sys.executable.replace("/python", "/kubectl")
        if Path(sys.executable.replace("/python", "/kubectl")).exists()
        else "kubectl",
        f"--kubeconfig={kubeconfig}",
    ]
    crd = REPO / "charts/colocgrpo-operator/crds/colocgrpojobs.colocgrpo.io.yaml"
    subprocess.run(
        [*kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(crd)], check=True, capture_output=True
    )
    subprocess.run(
        [*kubectl, "wait", "--for=condition=Established", "crd/colocgrpojobs.colocgrpo.io"],
        check=True,
        capture_output=True,
    )
    wait_for_earlier_namespaces(api, args.timeout)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})

    log_path = Path(f"/tmp/{namespace}-operator.log")
    source = Path(args.operator_src).resolve()
    # The operator's own re-check period and trainer image: what a deployed operator runs with.
    operator = OperatorProcess(
        kubeconfig,
        [namespace],
        log_path,
        checkout=source,
        recheck_seconds=None,
        trainer_image=None,
        extra_args=("--log-level=WARNING",),
    )
    result: dict[str, Any] = {
        "count": args.count,
        "suspended": args.suspended,
        "namespace": namespace,
        "operator_src": str(source),
    }
    try:
        operator.start(timeout=60)
        assert operator.process is not None
        pid, metrics_port = operator.process.pid, operator.metrics_port
        time.sleep(1)
        idle_rss = rss_kib(pid)[0]
        watcher = JobWatcher(api, namespace)
        watcher.start()
        watcher.ready.wait(10)
        api_text = apiserver_metrics(api)
        api_before = apiserver_requests(api_text)
        cpu_before = cpu_seconds(pid)
        plane_before = control_plane_cpu(kubeconfig.parent)
        op_text = operator_metrics(metrics_port)
        op_before = operator_metric(op_text, "colocgrpo_api_requests_total")
        kinds_before = apiserver_request_counts(api_text)
        op_verbs_before = operator_metric_by_label(op_text, "colocgrpo_api_requests_total", "verb")
        triggers_before = operator_metric_by_label(op_text, RECONCILES, "trigger")

        names = [f"bench-{i:04d}" for i in range(args.count)]
        created: dict[str, float] = {}
        path = f"/apis/colocgrpo.io/v1alpha1/namespaces/{namespace}/colocgrpojobs"

        def create(name: str) -> None:
            api.request("POST", path, body=job_body(name, args.suspended))
            created[name] = time.monotonic()

        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(create, names))
        creates_done = time.monotonic()
        while len(watcher.first_seen) < args.count and time.monotonic() - start < args.timeout:
            time.sleep(0.2)
        all_jobs = time.monotonic()
        latencies = [watcher.first_seen[n] - created[n] for n in names if n in watcher.first_seen]

        # Every job's status past Pending (the operator has seen its Job and said so).
        def statuses_done() -> int:
            items = api.request("GET", path)["items"]
            return sum(1 for i in items if (i.get("status") or {}).get("phase") not in (None, "Pending"))

        while statuses_done() < args.count and time.monotonic() - start < args.timeout:
            time.sleep(1)
        all_status = time.monotonic()
        time.sleep(3)  # let in-flight status updates land before counting
        api_text, op_text = apiserver_metrics(api), operator_metrics(metrics_port)
        api_after = apiserver_requests(api_text)
        op_after = operator_metric(op_text, "colocgrpo_api_requests_total")
        kinds_after = apiserver_request_counts(api_text)
        op_verbs_after = operator_metric_by_label(op_text, "colocgrpo_api_requests_total", "verb")
        triggers_after = operator_metric_by_label(op_text, RECONCILES, "trigger")
        rss, peak = rss_kib(pid)
        pods_at_end = pod_phases(api, namespace)
        operator_cpu = cpu_seconds(pid) - cpu_before
        plane_after = control_plane_cpu(kubeconfig.parent)
        watcher.stop = True
        time.sleep(15)  # a quiet period: what does the operator keep once the burst is over?
        settled_rss = rss_kib(pid)[0]
        pods_settled = pod_phases(api, namespace)
        result.update(
            jobs_seen=len(latencies),
            create_calls_seconds=round(creates_done - start, 2),
            all_jobs_seconds=round(all_jobs - start, 2),
            all_status_seconds=round(all_status - start, 2),
            job_latency_p50_seconds=round(percentile(latencies, 50), 3),
            job_latency_p90_seconds=round(percentile(latencies, 90), 3),
            job_latency_p99_seconds=round(percentile(latencies, 99), 3),
            job_latency_max_seconds=round(max(latencies) if latencies else float("nan"), 3),
            job_latency_mean_seconds=round(statistics.mean(latencies), 3) if latencies else None,
            operator_rss_idle_mib=round(idle_rss / 1024, 1),
            operator_rss_mib=round(rss / 1024, 1),
            operator_rss_peak_mib=round(peak / 1024, 1),
            operator_rss_settled_mib=round(settled_rss / 1024, 1),
            # Each pod reaching Running is one more status write and Event for its job: runs
            # differ in how many got there before the measurement (docs/benchmarks/operator.md).
            pods_by_phase_at_end=pods_at_end,
            pods_by_phase_settled=pods_settled,
            operator_handler_requests_per_job=round((op_after - op_before) / args.count, 2),
            apiserver_requests_per_job_all_clients=round((api_after[0] - api_before[0]) / args.count, 2),
            apiserver_colocgrpojobs_requests_per_job=round((api_after[1] - api_before[1]) / args.count, 2),
            # By "verb resource code": the operator's and kopf's writes of the job, and the children's
            # server-side applies (a job's children applied again: a reconcile ran as if on create).
            apiserver_requests_per_job_by_kind=per_job(kinds_after, kinds_before, args.count),
            operator_handler_requests_per_job_by_verb=per_job(op_verbs_after, op_verbs_before, args.count),
            reconciles_per_job_by_trigger=per_job(triggers_after, triggers_before, args.count),
            operator_cpu_seconds=round(operator_cpu, 1),
            control_plane_cpu_seconds={k: round(v - plane_before.get(k, 0.0), 1) for k, v in plane_after.items()},
            load_average_at_end=os.getloadavg(),
            cpu_count=os.cpu_count(),
        )
    finally:
        operator.stop()
        if not args.keep:
            try:
                api.request("DELETE", f"/api/v1/namespaces/{namespace}")
            except Exception as error:  # cleanup is best effort
                print(f"warning: could not delete namespace {namespace}: {error}", file=sys.stderr)
    print(json.dumps(result, indent=2))
    ok = result.get("jobs_seen") == args.count
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
