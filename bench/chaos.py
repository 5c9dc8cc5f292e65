"""Chaos trials: bursts of jobs, deletes, same-name recreations, pod failures, suspends, the
operator SIGKILLed and the API server restarted at random moments, a trainer whose step stops
moving; then settle and check that nothing went wrong.

Each trial, in a namespace of its own, against the real local control plane:
- a burst of `--jobs` ColocGRPOJobs, CPU- and GPU-shaped, some created suspended, and one more
  with a short progress deadline whose stand-in trainer reports steps 1 and 2, then nothing;
- while the operator is SIGKILLed 2-3 times (and restarted after a random pause) and kube-apiserver
  is crashed and restarted `--apiserver-restarts` times (a local dev cluster only): jobs deleted,
  jobs deleted and created again under the same name with a pod failure in flight, pod failures,
  suspends and resumes;
- settle (every job's status current), then check:
  * exactly one batch Job and one of each child (ConfigMap, Service, ServiceAccount, Role,
    RoleBinding) per job, all owned by the job's current uid;
  * status consistent with its children and its own incarnation: observedGeneration current,
    Suspended exactly when suspended, lastFailure naming a Job of this incarnation, startTime not
    before the job's creation, restarts no more than the pod failures this incarnation had;
  * nothing orphaned (no child of a deleted job left in the trial's namespace once garbage
    collection has run);
  * the stalled trainer's gang restarted for ProgressDeadlineExceeded;
  * no Python traceback and no ERROR line in the trial's operator log.

With `--workers N`, N trials run at once against the same cluster, each in its own namespace with
its own operator process (and log); trial i uses seed*1000+i whatever the worker count. Trials
--first .. --trials-1 run: a run cut short by --time-budget goes on with --first set to the
number of trials done.

Usage: python -m bench.chaos [--trials 100] [--jobs 10] [--seed 1] [--workers 1] [--first 0]
                             [--apiserver-restarts 1] [--time-budget SECONDS] [--kubeconfig FILE]
                             [--cluster-name colocgrpo-chaos] [--out FILE]
Prints one JSON line per trial as it finishes and a summary (JSON) at the end, with --out also into
FILE; exit 1 if any check failed.
docs/benchmarks/chaos.md records runs.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from colocgrpo_dev.operator_process import OperatorProcess

REPO = Path(__file__).resolve().parents[1]
GROUP_PATH = "/apis/colocgrpo.io/v1alpha1"
JOB_LABEL = "colocgrpo.io/job-name"
EXIT_ANNOTATION = "colocgrpo.dev/fake-exit"  # colocgrpo_dev/cluster/fake_pods.py: KWOK ends the pod with this exit code
CHILDREN = (
    ("/api/v1", "configmaps", "{}-config"),
    ("/api/v1", "services", "{}"),
    ("/api/v1", "serviceaccounts", "{}-trainer"),
    ("/apis/rbac.authorization.k8s.io/v1", "roles", "{}-trainer"),
    ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", "{}-trainer"),
    ("/apis/batch/v1", "jobs", "{}"),
)


def job_body(name: str, rng: random.Random, suspended: bool = False) -> dict[str, Any]:
    """examples/tiny-cpu.yaml, made small; CPU- or GPU-shaped at random (the fake nodes have 8 GPUs)."""
    body: dict[str, Any] = yaml.safe_load((REPO / "examples/tiny-cpu.yaml").read_text())
    body["metadata"] = {"name": name}
    gpus = rng.choice([0, 0, 1, 2])
    nodes = rng.choice([1, 1, 2])
    body["spec"]["resources"] = {"nodes": nodes, "gpusPerNode": gpus, "cpu": "50m", "memory": "32Mi"}
    if nodes > 1:  # pods on their own emptyDirs cannot resume together (no claim here)
        body["spec"]["checkpoint"] = {**body["spec"].get("checkpoint", {}), "resume": "never"}
    if gpus:
        body["spec"]["model"]["dtype"] = "bfloat16"
    body["spec"]["runPolicy"] = {"maxRestarts": rng.choice([1, 3]), "suspend": suspended}
    return body


# How long the trials' own calls keep retrying while the API server is away (a restart fault).
API_BACK_SECONDS = 120.0


class Cluster:
    """The few API calls the trials make, through the operator's own client. Each is retried while
    the API server is away (a transient failure, kube/transient.py), so a restart fault
    delays the trial's disturbances instead of failing it."""

    def __init__(self, kubeconfig: Path):
        from colocgrpo_operator.kube.client import KubeApi

        self.api = KubeApi.from_kubeconfig(kubeconfig, field_manager="colocgrpo-chaos", pool_size=8)

    def request(self, method: str, path: str, **options: Any) -> dict[str, Any] | None:
        from colocgrpo_operator.kube.transient import is_transient

        deadline = time.monotonic() + API_BACK_SECONDS
        while True:
            try:
                return self.api.request(method, path, **options)
            except Exception as error:
                if not is_transient(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def get(self, path: str) -> dict[str, Any] | None:
        from colocgrpo_operator.kube.client import KubeApiError

        try:
            return self.request("GET", path)
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise

    def items(self, prefix: str, plural: str, namespace: str, selector: str | None = JOB_LABEL) -> list[dict[str, Any]]:
        query = {"labelSelector": selector} if selector else None
        listing = self.request("GET", f"{prefix}/namespaces/{namespace}/{plural}", query=query) or {}
        items: list[dict[str, Any]] = listing.get("items") or []
        return items

    def jobs(self, namespace: str) -> list[dict[str, Any]]:
        return self.items(GROUP_PATH, "colocgrpojobs", namespace, None)

    def create_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        from colocgrpo_operator.kube.client import KubeApiError

        try:
            created = self.request("POST", f"{GROUP_PATH}/namespaces/{namespace}/colocgrpojobs", body=body)
        except KubeApiError as error:
            if error.status != 409:
                raise
            # A create whose answer a restart cut off, tried again: it is there.
            created = self.get(f"{GROUP_PATH}/namespaces/{namespace}/colocgrpojobs/{body['metadata']['name']}")
        return created or {}

    def delete_job(self, namespace: str, name: str) -> None:
        from colocgrpo_operator.kube.client import KubeApiError

        try:
            self.request("DELETE", f"{GROUP_PATH}/namespaces/{namespace}/colocgrpojobs/{name}")
        except KubeApiError as error:
            if error.status != 404:
                raise

    def patch_job(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        path = f"{GROUP_PATH}/namespaces/{namespace}/colocgrpojobs/{name}"
        self.request("PATCH", path, body=patch, content_type="application/merge-patch+json")

    def report_progress(self, namespace: str, name: str, uid: str, step: int) -> None:
        """Report `step` the way the trainer does (bound to the job's uid, colocgrpo_training.config)."""
        from colocgrpo_training.config import JobRef

        progress = {"step": step, "lastUpdateTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        body, content_type = JobRef(name=name, namespace=namespace, uid=uid).progress_patch(progress)
        path = f"{GROUP_PATH}/namespaces/{namespace}/colocgrpojobs/{name}/status"
        self.request("PATCH", path, body=body, content_type=content_type)

    def fail_a_pod(self, namespace: str, job: str, rng: random.Random) -> bool:
        """Make one running pod of `job` exit 1 (KWOK's fake-exit stage); False if none runs."""
        from colocgrpo_operator.kube.client import KubeApiError

        running = [
            p
            for p in self.items("/api/v1", "pods", namespace, f"{JOB_LABEL}={job}")
            if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        if not running:
            return False
        pod = rng.choice(running)
        try:
            self.request(
                "PATCH",
                f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
                body={"metadata": {"annotations": {EXIT_ANNOTATION: "1"}}},
                content_type="application/merge-patch+json",
            )
        except KubeApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    def new_namespace(self, name: str) -> None:
        self.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})

    def delete_namespace(self, name: str) -> None:
        from colocgrpo_operator.kube.client import KubeApiError

        try:
            self.request("DELETE", f"/api/v1/namespaces/{name}")
        except KubeApiError as error:
            if error.status != 404:
                raise


@dataclass
class Incarnation:
    """What the trial did to one object named `name` with uid `uid`."""

    name: str
    uid: str
    created: str  # creationTimestamp
    pod_failures: int = 0
    deleted: bool = False
    stalled: bool = False  # its trainer stopped reporting after step 2


@dataclass
class Trial:
    number: int
    seed: int
    namespace: str
    worker: int = 0
    incarnations: list[Incarnation] = field(default_factory=list)
    actions: dict[str, int] = field(default_factory=dict)
    kills: int = 0
    apiserver_restarts: int = 0
    problems: list[str] = field(default_factory=list)
    settle_seconds: float = 0.0

    def count(self, action: str) -> None:
        self.actions[action] = self.actions.get(action, 0) + 1

    def current(self, name: str) -> Incarnation | None:
        live = [i for i in self.incarnations if i.name == name and not i.deleted]
        return live[-1] if live else None


# The stalled trainer's job: a progress deadline short enough to be met within a trial.
STALL_DEADLINE_SECONDS = 6


def can_restart_apiserver(kubeconfig: Path) -> bool:
    """Whether the cluster is a local dev cluster, whose kube-apiserver a trial may restart."""
    from colocgrpo_dev.cluster.cluster import has_component

    return has_component(kubeconfig, "kube-apiserver")


# One restart at a time: workers share the one API server.
_RESTART_LOCK = threading.Lock()


def restart_apiserver(cluster: Cluster, kubeconfig: Path, namespace: str) -> None:
    """Crash and restart kube-apiserver, and wait until it serves ColocGRPOJobs again."""
    from colocgrpo_dev.cluster.cluster import restart_component

    with _RESTART_LOCK:
        restart_component(kubeconfig, "kube-apiserver")
        cluster.jobs(namespace)  # retried until the API server answers (Cluster.request)


def stall_after_step_two(cluster: Cluster, namespace: str, incarnation: Incarnation, timeout: float = 60) -> None:
    """The stand-in trainer of the stalled job: steps 1 and 2 once its gang runs, then nothing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = cluster.get(f"{GROUP_PATH}/namespaces/{namespace}/colocgrpojobs/{incarnation.name}") or {}
        if (job.get("status") or {}).get("phase") == "Running":
            cluster.report_progress(namespace, incarnation.name, incarnation.uid, 1)
            time.sleep(1)
            cluster.report_progress(namespace, incarnation.name, incarnation.uid, 2)
            incarnation.stalled = True
            return
        time.sleep(0.3)


def run_trial(
    cluster: Cluster,
    kubeconfig: Path,
    trial: Trial,
    jobs: int,
    work: Path,
    src: Path,
    apiserver_restarts: int = 0,
) -> Trial:
    rng = random.Random(trial.seed)
    namespace = trial.namespace
    cluster.new_namespace(namespace)
    operator = OperatorProcess(kubeconfig, [namespace], work / f"{namespace}.log", checkout=src)
    try:
        operator.start()
        names = [f"c{i:02d}" for i in range(jobs)]

        def create(name: str, suspended: bool = False) -> None:
            body = job_body(name, rng, suspended)
            created = cluster.create_job(namespace, body)
            meta = created.get("metadata") or {}
            trial.incarnations.append(Incarnation(name, meta.get("uid", ""), meta.get("creationTimestamp", "")))

        for name in names:
            create(name, suspended=rng.random() < 0.2)
        stalled = job_body("stalled", rng)
        stalled["spec"]["runPolicy"] = {"progressDeadlineSeconds": STALL_DEADLINE_SECONDS, "maxRestarts": 3}
        created = cluster.create_job(namespace, stalled)
        stalled_one = Incarnation("stalled", created["metadata"]["uid"], created["metadata"]["creationTimestamp"])
        trial.incarnations.append(stalled_one)
        stalling = threading.Thread(target=stall_after_step_two, args=(cluster, namespace, stalled_one), daemon=True)
        stalling.start()

        # The disturbances, in random order, with 2-3 SIGKILLs (and restarts) among them.
        actions: list[tuple[str, str]] = []
        for name in names:
            roll = rng.random()
            if roll < 0.15:
                actions.append(("delete", name))
            elif roll < 0.35:
                actions.append(("recreate", name))
            elif roll < 0.55:
                actions.append(("fail", name))
            elif roll < 0.70:
                actions.append(("toggle-suspend", name))
        actions += [("kill", "")] * rng.choice([2, 3])
        if can_restart_apiserver(kubeconfig):
            actions += [("apiserver-restart", "")] * apiserver_restarts
        rng.shuffle(actions)

        def wait_running(name: str, timeout: float = 20) -> bool:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                pods = cluster.items("/api/v1", "pods", namespace, f"{JOB_LABEL}={name}")
                if any((p.get("status") or {}).get("phase") == "Running" for p in pods):
                    return True
                time.sleep(0.3)
            return False

        for action, name in actions:
            time.sleep(rng.uniform(0, 1.0))
            trial.count(action)
            incarnation = trial.current(name) if name else None
            if action == "kill":
                operator.kill()
                trial.kills += 1
                time.sleep(rng.uniform(0, 2.0))
                operator.start()
            elif action == "apiserver-restart":
                restart_apiserver(cluster, kubeconfig, namespace)
                trial.apiserver_restarts += 1
            elif action == "delete" and incarnation:
                cluster.delete_job(namespace, name)
                incarnation.deleted = True
            elif action == "fail" and incarnation:
                if wait_running(name, 10) and cluster.fail_a_pod(namespace, name, rng):
                    incarnation.pod_failures += 1
            elif action == "recreate" and incarnation:
                # A pod failure in flight, then delete, then the same name again at once.
                if wait_running(name, 10) and cluster.fail_a_pod(namespace, name, rng):
                    incarnation.pod_failures += 1
                cluster.delete_job(namespace, name)
                incarnation.deleted = True
                deadline = time.monotonic() + 30
                while cluster.get(f"{GROUP_PATH}/namespaces/{namespace}/colocgrpojobs/{name}"):
                    if time.monotonic() > deadline:
                        trial.problems.append(f"{name}: the deleted job did not go away")
                        break
                    time.sleep(0.1)
                create(name)
            elif action == "toggle-suspend" and incarnation:
                job = cluster.get(f"{GROUP_PATH}/namespaces/{namespace}/colocgrpojobs/{name}") or {}
                suspended = bool(((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"))
                cluster.patch_job(namespace, name, {"spec": {"runPolicy": {"suspend": not suspended}}})
        if not operator.alive():
            operator.start()
        stalling.join(timeout=60)
        trial.count("stall")
        started = time.monotonic()
        trial.problems += settle_and_check(cluster, trial, operator)
        trial.settle_seconds = round(time.monotonic() - started, 1)
        trial.problems += [f"traceback in the operator log: {t}" for t in operator.tracebacks()]
        trial.problems += [f"ERROR in the operator log: {line}" for line in operator.errors()]
    finally:
        operator.stop()
        cluster.delete_namespace(namespace)
    return trial


def settle_and_check(cluster: Cluster, trial: Trial, operator: OperatorProcess, timeout: float = 120) -> list[str]:
    """Wait until every check passes (the world is level-based: give it time), or report what
    still fails at the timeout."""
    deadline = time.monotonic() + timeout
    problems = check(cluster, trial)
    while problems and time.monotonic() < deadline:
        if not operator.alive():
            return [f"the operator died (exit {operator.process.returncode if operator.process else '?'})"]
        time.sleep(1)
        problems = check(cluster, trial)
    return problems


def _owner_uids(obj: dict[str, Any]) -> list[str]:
    return [o.get("uid", "") for o in (obj.get("metadata") or {}).get("ownerReferences") or []]


def _parse(ts: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(ts).replace("Z", "+00:00")) if ts else None
    except ValueError:
        return None


def check(cluster: Cluster, trial: Trial) -> list[str]:
    namespace = trial.namespace
    problems: list[str] = []
    live = {j["metadata"]["name"]: j for j in cluster.jobs(namespace) if not j["metadata"].get("deletionTimestamp")}
    live_uids = {j["metadata"]["uid"] for j in live.values()}
    batch_jobs = cluster.items("/apis/batch/v1", "jobs", namespace)
    job_uids_by_owner: dict[str, set[str]] = {}
    for batch_job in batch_jobs:
        for owner in _owner_uids(batch_job):
            job_uids_by_owner.setdefault(owner, set()).add(batch_job["metadata"]["uid"])
    for prefix, plural, pattern in CHILDREN:
        children = cluster.items(prefix, plural, namespace)
        for child in children:
            meta = child["metadata"]
            owners = _owner_uids(child)
            if not set(owners) & live_uids:
                problems.append(f"orphan {plural}/{meta['name']} (owners {owners})")
        for name, job in live.items():
            mine = [c for c in children if c["metadata"]["name"] == pattern.format(name)]
            status = job.get("status") or {}
            invalid = any(
                c.get("type") == "SpecValid" and c.get("status") == "False" for c in status.get("conditions") or []
            )
            if invalid:
                problems.append(f"{name}: judged an invalid spec: {status.get('message')}")
                continue
            if plural == "jobs" and status.get("phase") in ("Succeeded", "Failed"):
                continue  # a finished job may keep or lose its Job
            if plural == "services" and ((job.get("spec") or {}).get("resources") or {}).get("nodes", 1) == 1:
                # Every rank in one pod: no headless Service (render/workload.py, needs_rendezvous_service).
                if mine:
                    problems.append(f"{name}: a 1-node job with {len(mine)} {plural}")
                continue
            if len(mine) != 1:
                problems.append(f"{name}: {len(mine)} {plural}")
            elif job["metadata"]["uid"] not in _owner_uids(mine[0]):
                problems.append(f"{name}: {plural}/{mine[0]['metadata']['name']} owned by {_owner_uids(mine[0])}")
    for name, job in live.items():
        meta, spec, status = job["metadata"], job.get("spec") or {}, job.get("status") or {}
        incarnation = trial.current(name)
        if incarnation is None or incarnation.uid != meta["uid"]:
            problems.append(f"{name}: an incarnation the trial did not create ({meta['uid']})")
            continue
        if status.get("observedGeneration") != meta.get("generation"):
            problems.append(
                f"{name}: observedGeneration {status.get('observedGeneration')} != {meta.get('generation')}"
            )
        suspended = bool((spec.get("runPolicy") or {}).get("suspend"))
        phase = status.get("phase")
        if phase in (None, "Pending", "Restarting"):
            problems.append(f"{name}: not settled ({phase})")
        if suspended and phase not in ("Suspended", "Succeeded", "Failed"):
            problems.append(f"{name}: suspended but {phase}")
        if not suspended and phase == "Suspended":
            problems.append(f"{name}: Suspended but not suspended")
        failure = status.get("lastFailure") or {}
        if failure.get("jobUid") and failure["jobUid"] not in job_uids_by_owner.get(meta["uid"], set()):
            # The failed Job may be gone after a restart; it must never be a predecessor's.
            predecessors = {u for i in trial.incarnations if i.name == name and i.uid != meta["uid"] for u in [i.uid]}
            if any(failure["jobUid"] in job_uids_by_owner.get(p, set()) for p in predecessors):
                problems.append(f"{name}: lastFailure names a predecessor's Job {failure['jobUid']}")
        created, started = _parse(meta.get("creationTimestamp")), _parse(status.get("startTime"))
        if created and started and started < created:
            problems.append(f"{name}: startTime {status.get('startTime')} before creation {meta['creationTimestamp']}")
        restarts = int(status.get("restarts") or 0)
        if restarts > incarnation.pod_failures + incarnation.stalled:
            problems.append(f"{name}: {restarts} restarts, {incarnation.pod_failures} pod failures injected")
        if incarnation.stalled and (restarts < 1 or failure.get("reason") != "ProgressDeadlineExceeded"):
            problems.append(f"{name}: its stalled trainer was not restarted (restarts {restarts}, {failure})")
    return problems


def main(argv: list[str] | None = None) -> int:
    from bench.workers import Reporter, host_facts, load_average, run_numbered

    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=10, help="jobs per trial's burst")
    parser.add_argument("--seed", type=int, default=1, help="trial i uses seed*1000+i")
    parser.add_argument("--workers", type=int, default=1, help="trials run at once, each with its own operator")
    parser.add_argument("--first", type=int, default=0, help="the first trial's number (to go on with a run)")
    parser.add_argument(
        "--apiserver-restarts", type=int, default=1, help="kube-apiserver crashes per trial (local dev cluster only)"
    )
    parser.add_argument("--time-budget", type=float, default=None, help="start no trial after this many seconds")
    parser.add_argument("--kubeconfig", default=None, help="default: start/reuse a local dev cluster")
    parser.add_argument("--cluster-name", default="colocgrpo-chaos")
    parser.add_argument("--operator-src", default=str(REPO), help="the checkout whose operator runs")
    parser.add_argument("--log-dir", default=None, help="keep the operator logs here (default: a temp folder)")
    parser.add_argument("--out", default=None, help="also write the JSON lines and the summary into this file")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    load_at_start = load_average()
    kubeconfig = ensure_cluster(args.kubeconfig, args.cluster_name)
    clusters = [Cluster(kubeconfig) for _ in range(args.workers)]  # a connection pool per worker
    work = Path(args.log_dir or tempfile.mkdtemp(prefix="colocgrpo-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    reporter = Reporter(args.out)

    def one_trial(worker: int, number: int) -> Trial:
        seed = args.seed * 1000 + number
        trial = Trial(number, seed, f"chaos-{seed}-{uuid.uuid4().hex[:4]}", worker)
        try:
            run_trial(
                clusters[worker], kubeconfig, trial, args.jobs, work, Path(args.operator_src), args.apiserver_restarts
            )
        except Exception as error:  # e.g. the operator did not come up: a failed trial, not a lost run
            trial.problems.append(f"the trial could not run: {error!r}")
        return trial

    started = time.monotonic()
    try:
        trials = run_numbered(
            args.trials,
            args.workers,
            args.time_budget,
            started,
            one_trial,
            lambda t: reporter.line(trial_summary(t)),
            first=args.first,
        )
        summary = summarize(trials, time.monotonic() - started, work)
        summary.update(seed=args.seed, first=args.first, workers=args.workers)
        summary["host"] = host_facts(load_at_start)
        reporter.summary(summary)
    finally:
        reporter.close()
    return 0 if summary["failed_trials"] == 0 else 1


def ensure_cluster(kubeconfig: str | None, name: str) -> Path:
    if kubeconfig:
        return Path(kubeconfig)
    from colocgrpo_dev.cluster import DevCluster

    return DevCluster(name=name).up()


def trial_summary(trial: Trial) -> dict[str, Any]:
    return {
        "trial": trial.number,
        "seed": trial.seed,
        "worker": trial.worker,
        "jobs": len(trial.incarnations),
        "kills": trial.kills,
        "apiserver_restarts": trial.apiserver_restarts,
        "actions": trial.actions,
        "settle_seconds": trial.settle_seconds,
        "problems": trial.problems,
    }


def summarize(trials: list[Trial], seconds: float, work: Path) -> dict[str, Any]:
    actions: dict[str, int] = {}
    for trial in trials:
        for action, n in trial.actions.items():
            actions[action] = actions.get(action, 0) + n
    return {
        "trials": len(trials),
        "failed_trials": sum(1 for t in trials if t.problems),
        "jobs": sum(len(t.incarnations) for t in trials),
        "sigkills": sum(t.kills for t in trials),
        "apiserver_restarts": sum(t.apiserver_restarts for t in trials),
        "actions": actions,
        "problems": [f"trial {t.number} (seed {t.seed}): {p}" for t in trials for p in t.problems],
        "settle_seconds_max": max((t.settle_seconds for t in trials), default=0.0),
        "seconds": round(seconds, 1),
        "logs": str(work),
    }


if __name__ == "__main__":
    sys.exit(main())
