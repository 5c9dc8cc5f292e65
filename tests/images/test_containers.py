"""The two built images, run in containerd as a cluster runs them: each container from the pod spec the chart (the
operator's Deployment) or the operator's render (a job's trainer pod) makes, with that spec's command, env, volumes,
user and security context, and a read-only root filesystem (tests/support/pod_to_ctr.py translates the spec to
`ctr run`).

The images are built by `make images` (the session's `image_archives` fixture builds them if their inputs changed)
and imported into a containerd of the tests' own (`containerd`). Needs root, buildah, mmdebstrap, containerd and runc.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from colocgrpo_operator.api import parse_job
from colocgrpo_operator.api.naming import COMPLETION_INDEX_KEY, TRAINER_GID, TRAINER_UID
from colocgrpo_operator.api.trainer_args import REPORT_TO
from colocgrpo_operator.render import render_children
from images import build
from support.pod_to_ctr import CtrPod, PodIdentity

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
TRAINER_DOCKERFILE = build.IMAGES["trainer"].dockerfile


def trainer_pod(
    containerd: Any, workdir: Path, example: str = "tiny-cpu.yaml", **trainer_args: Any
) -> tuple[CtrPod, dict[str, Any]]:
    """The trainer pod the operator renders for an example job (trainerArgs overridden), ready to run; and the
    job's grpo.yaml as rendered."""
    obj = yaml.safe_load((REPO / "examples" / example).read_text())
    obj["spec"].setdefault("trainerArgs", {}).update(trainer_args)
    children = render_children(parse_job(obj), default_image=build.reference("trainer"))
    job = children[-1]
    assert job["kind"] == "Job"
    pod_spec = job["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    assert container["image"] == build.reference("trainer")
    config_maps = {c["metadata"]["name"]: c["data"] for c in children if c["kind"] == "ConfigMap"}
    (config,) = [yaml.safe_load(data["grpo.yaml"]) for data in config_maps.values()]
    identity = PodIdentity(f"{obj['metadata']['name']}-0", "default", {COMPLETION_INDEX_KEY: "0"})
    pod = CtrPod(
        containerd,
        workdir,
        pod_spec,
        container,
        image=build.reference("trainer"),
        pod=identity,
        config_maps=config_maps,
    )
    return pod, config


@pytest.fixture(scope="module")
def operator_pod(containerd, tmp_path_factory) -> CtrPod:
    """The operator's container as the chart renders it (the real helm, the chart's default values)."""
    from colocgrpo_dev.cluster.helm import ensure_helm

    rendered = subprocess.run(
        [str(ensure_helm()), "template", "cgo", str(REPO / "charts" / "colocgrpo-operator"), "-n", "colocgrpo-system"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (deployment,) = [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "Deployment"]
    pod_spec = deployment["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    return CtrPod(
        containerd,
        tmp_path_factory.mktemp("operator-pod"),
        pod_spec,
        container,
        image=build.reference("operator"),
        pod=PodIdentity("cgo-operator-0", "colocgrpo-system"),
    )


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


# --- the operator image ---------------------------------------------------------------------------


def test_operator_image_runs_its_help_as_the_charts_user(operator_pod):
    security = operator_pod.pod_spec["securityContext"]
    assert operator_pod.image_config["config"]["User"] == f"{security['runAsUser']}:{security['runAsGroup']}"
    out = _ok(operator_pod.run(args=["--help"]))
    assert "--liveness-port" in out and "--trainer-image" in out
    assert _ok(operator_pod.run(command=["id", "-u"])).strip() == str(security["runAsUser"])


def test_operator_image_validates_every_example(operator_pod):
    command = ["colocgrpo", "validate"]
    for example in EXAMPLES:
        command += ["-f", f"/examples/{example.name}"]
    out = _ok(operator_pod.run(command=command, extra_mounts=((REPO / "examples", "/examples"),)))
    assert len(EXAMPLES) >= 3
    for example in EXAMPLES:
        assert example.name in out


def test_operator_image_has_no_ml_stack_and_no_official_kubernetes_client(operator_pod):
    probe = (
        "import importlib.util as u; "
        "print([m for m in ('torch','vllm','trl','transformers','deepspeed','kubernetes') if u.find_spec(m)])"
    )
    assert _ok(operator_pod.run(command=["python", "-c", probe])).strip() == "[]"


def test_a_killed_sessions_leftover_container_and_snapshot_are_removed(containerd):
    """A session killed mid-run leaves its container, and the container's snapshot, in the kept root; the next run of
    that id failed with "... already exists". The fixture's `remove_leftovers` clears such leftovers at start."""
    ref = build.reference("operator")
    containerd.ctr("containers", "create", "--snapshotter", "overlayfs", ref, "leftover-probe")  # never deleted
    again = containerd.ctr("containers", "create", "--snapshotter", "overlayfs", ref, "leftover-probe", check=False)
    assert again.returncode != 0 and "already exists" in again.stderr
    containerd.remove_leftovers()
    assert "leftover-probe" not in containerd.containers()
    assert "leftover-probe" not in containerd.ctr("snapshots", "--snapshotter", "overlayfs", "ls").stdout
    containerd.ctr("containers", "create", "--snapshotter", "overlayfs", ref, "leftover-probe")
    containerd.remove_container("leftover-probe")
    assert "leftover-probe" not in containerd.ctr("snapshots", "--snapshotter", "overlayfs", "ls").stdout


def test_an_image_named_but_not_unpacked_is_imported_again(containerd, image_archives):
    """An import killed before its unpack finished leaves the image named with its root file system missing: no
    container runs from it, and a later import must unpack it again rather than take the name for the image. Played
    in a containerd namespace of its own, where no other test's container holds the image's snapshots."""
    import copy

    from images.containerd import chain_id

    ref = build.reference("operator")
    probe = copy.copy(containerd)
    probe.namespace = "colocgrpo-tests-unpack"
    digest = probe.import_archive(image_archives["operator"], ref)
    try:
        assert probe.is_unpacked(digest)
        manifest = json.loads(probe.ctr("content", "get", digest).stdout)
        config = json.loads(probe.ctr("content", "get", manifest["config"]["digest"]).stdout)
        top = chain_id(config["rootfs"]["diff_ids"])
        probe.ctr("snapshots", "--snapshotter", "overlayfs", "rm", top)  # what the interrupted import never made
        assert probe.image_digest(ref) == digest and not probe.is_unpacked(digest)
        assert probe.import_archive(image_archives["operator"], ref) == digest
        assert probe.is_unpacked(digest)
        probe.ctr("containers", "create", "--snapshotter", "overlayfs", ref, "unpacked-probe")  # needs the top
        probe.remove_container("unpacked-probe")
    finally:
        probe.ctr("images", "rm", ref, check=False)
        probe.collect_garbage()


# --- the trainer image ----------------------------------------------------------------------------

STACK_PROBE = """
import importlib, json, os, pathlib
import torch, vllm, trl, deepspeed, transformers, colocgrpo_training
from deepspeed.git_version_info import installed_ops
from transformers.integrations import get_available_reporting_integrations
importlib.import_module("deepspeed.ops.adam.fused_adam_op")  # the prebuilt CUDA op loads (no GPU needed to load it)
try:
    pathlib.Path("/opt/colocgrpo/probe").write_text("x")
    root_writable = True
except OSError:
    root_writable = False
home = pathlib.Path(os.environ["HOME"]) / ".cache" / "probe"
home.mkdir(parents=True)
print(json.dumps({
    "ids": [os.getuid(), os.getgid()],
    "versions": {m.__name__: m.__version__ for m in (torch, vllm, trl, deepspeed, transformers)},
    "fused_adam": installed_ops.get("fused_adam"),
    "arch_flags": torch._C._cuda_getArchFlags(),
    "reporting": get_available_reporting_integrations(),
    "root_writable": root_writable,
    "examples": sorted(str(p) for p in pathlib.Path("/opt/colocgrpo/examples").glob("*/*")),
}))
"""


def test_trainer_image_runs_as_the_pods_user_and_imports_its_stack(containerd, tmp_path):
    pod, _config = trainer_pod(containerd, tmp_path)
    result = _ok(pod.run(command=["python", "-c", STACK_PROBE]))
    found = json.loads(result.strip().splitlines()[-1])
    assert found["ids"] == [TRAINER_UID, TRAINER_GID]
    pins = dict(
        line.split("==") for line in (REPO / "images/trainer/requirements.txt").read_text().split() if "==" in line
    )
    versions = {name: version.split("+")[0] for name, version in found["versions"].items()}  # 2.11.0+cu130
    assert versions == {name: pins[name] for name in ("torch", "vllm", "trl", "deepspeed", "transformers")}
    # FusedAdam is built in, for every architecture torch itself is built for.
    assert found["fused_adam"]
    arch_list = re.search(r'TORCH_CUDA_ARCH_LIST="([^"]+)"', TRAINER_DOCKERFILE.read_text()).group(1)
    built_for = [f"sm_{arch.removesuffix('+PTX').replace('.', '')}" for arch in arch_list.split(";")]
    assert built_for == found["arch_flags"].split()
    # What validate admits, the image can run: transformers finds every report_to integration.
    assert set(REPORT_TO) - {"none"} <= set(found["reporting"])
    # Read-only root; HOME (the JIT caches) is on the pod's writable /tmp volume.
    assert found["root_writable"] is False
    assert (pod.volumes["tmp"] / ".cache" / "probe").is_dir()
    assert {
        "/opt/colocgrpo/examples/data/arith.jsonl",
        "/opt/colocgrpo/examples/data/add-digits.jsonl",
        "/opt/colocgrpo/examples/models/tiny",
        "/opt/colocgrpo/examples/models/smollm2-135m-instruct",
    } <= set(found["examples"])


def test_every_example_names_a_model_and_dataset_the_image_holds():
    """The CPU examples run as written in the image: their model and dataset are the image's own examples (a job's
    own come from a volume). The image's copies are checked in the test above."""
    for example in ("tiny-cpu.yaml", "learn-cpu.yaml"):
        spec = yaml.safe_load((REPO / "examples" / example).read_text())["spec"]
        for path in (spec["model"]["name"], spec["dataset"]["name"]):
            assert path.startswith("/opt/colocgrpo/examples/"), (example, path)
        data = Path(spec["dataset"]["name"]).relative_to("/opt/colocgrpo/examples")
        assert (REPO / "examples" / data).is_file()


CPU_ADAM_PROBE = """
import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam
parameter = torch.nn.Parameter(torch.ones(8))
parameter.grad = torch.ones(8)
DeepSpeedCPUAdam([parameter], lr=0.1).step()
print("cpu_adam step", round(float(parameter[0]), 4))
"""


def test_cpu_adam_builds_on_first_use_under_a_read_only_root(containerd, tmp_path):
    """CPU Adam (offloadOptimizer: cpu) is DeepSpeed's one op the image does not carry built: it is compiled for the
    CPU it runs on. The compiler, headers and ninja are in the image, and the build goes to the pod's /tmp. (Several
    CPU-minutes and 2 GB of memory per file: the probe gets every core and 8 GiB, more than the tiny job asks for.)"""
    pod, _config = trainer_pod(containerd, tmp_path)
    pod.container = {**pod.container, "resources": {"limits": {"memory": "8Gi"}}}
    out = _ok(pod.run(command=["python", "-c", CPU_ADAM_PROBE], timeout=1800))
    assert "cpu_adam step 0.9" in out
    assert list((pod.volumes["tmp"] / ".cache" / "torch_extensions").rglob("cpu_adam*.so"))


def _progress(line: str) -> dict[str, Any] | None:
    start = line.find('{"progress"')
    return json.loads(line[start:])["progress"] if start >= 0 else None


@pytest.mark.parametrize(
    ("example", "trainer_args", "steps"),
    [("tiny-cpu.yaml", {}, 2), ("learn-cpu.yaml", {"max_steps": 1}, 1)],
    ids=["tiny-cpu", "learn-cpu"],
)
def test_cpu_example_runs_in_the_image_as_rendered(containerd, tmp_path, example, trainer_args, steps):
    """The example job as the operator renders it (its command, env and volumes), on the image's own model and
    data: it trains and leaves its final model on the checkpoint volume. (learn-cpu: one of its 60 steps.)"""
    pod, config = trainer_pod(containerd, tmp_path, example, **trainer_args)
    assert config["grpo"]["max_steps"] == steps and pod.container["command"][0] == "colocgrpo-train"
    out = _ok(pod.run(timeout=1200))
    assert max(report["step"] for line in out.splitlines() if (report := _progress(line))) == steps
    mount = next(m["mountPath"] for m in pod.container["volumeMounts"] if m["name"] == "checkpoints")
    final = pod.volumes["checkpoints"] / Path(config["checkpoint"]["dir"]).relative_to(mount) / "final"
    assert (final / "config.json").is_file() and list(final.glob("*.safetensors")), out[-3000:]


def test_sigterm_mid_step_exits_143_with_a_complete_checkpoint(containerd, tmp_path):
    """A pod's SIGTERM (preemption, suspend) while it trains: the trainer saves a checkpoint that a restarted pod
    resumes from, and exits 143. TensorBoard (report_to) writes its events to the checkpoint volume."""
    pod, config = trainer_pod(containerd, tmp_path, max_steps=500, report_to="tensorboard")
    container_id, process = pod.start()
    try:
        assert process.stdout is not None
        seen = []
        for line in process.stdout:
            seen.append(line)
            report = _progress(line)
            if report and report["step"] >= 1:
                break
        else:
            pytest.fail(f"the trainer ended before its first step ({process.wait()}):\n{''.join(seen[-40:])}")
        containerd.ctr("tasks", "kill", "--signal", "SIGTERM", container_id)
        rest, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
        containerd.remove_container(container_id)
    assert process.returncode == 143, "".join(seen[-20:]) + rest[-3000:]

    message = json.loads(pod.termination_log.read_text())
    assert message["reason"] == "Terminated"
    # Which checkpoints are complete, by the trainer's own rule, read in the image.
    complete = _ok(
        pod.run(
            command=[
                "python",
                "-c",
                "import json, sys; from colocgrpo_training.checkpoints import complete_steps; "
                "print(json.dumps(complete_steps(sys.argv[1])))",
                config["checkpoint"]["dir"],
            ]
        )
    )
    (step,) = json.loads(complete.strip().splitlines()[-1])
    assert 1 <= step < 500 and f"checkpoint-{step}" in message["message"]
    assert list(pod.volumes["checkpoints"].rglob("events.out.tfevents.*")), "no TensorBoard events on the volume"
