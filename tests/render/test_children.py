"""Structural assertions on every object the renderer produces."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from colocgrpo_operator.api import parse_job
from colocgrpo_operator.render import needs_rendezvous_service, render_children, render_trainer_config
from colocgrpo_training.config import TrainerConfig
from colocgrpo_training.planner.shapes import builtin_shape
from colocgrpo_training.planner.zero3 import EVERY_PARAMETER

REPO = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.36.0"


def load_example(name: str, **spec_overrides) -> dict:
    obj = yaml.safe_load((REPO / "examples" / name).read_text())
    obj["spec"].update(spec_overrides)
    return obj


def on_nodes(example: str, **resources) -> dict:
    """An example with `spec.resources` overridden; a gang across pods shares one checkpoint claim (validation)."""
    obj = load_example(example)
    obj["spec"]["resources"] = {**obj["spec"]["resources"], **resources}
    if obj["spec"]["resources"]["nodes"] > 1:
        obj["spec"]["checkpoint"] = {**obj["spec"].get("checkpoint", {}), "claimName": "ckpt"}
    return obj


def children_by_kind(obj: dict, **kwargs) -> dict[str, dict]:
    children = render_children(parse_job(obj), **kwargs)
    by_kind = {child["kind"]: child for child in children}
    assert len(by_kind) == len(children), "one object per kind"
    return by_kind


@pytest.fixture(scope="module")
def seed() -> dict[str, dict]:
    obj = load_example("seed-qwen14b-tp4.yaml")
    obj["metadata"]["namespace"] = "research"
    return children_by_kind(obj)


@pytest.fixture(scope="module")
def two_nodes() -> dict[str, dict]:
    """The seed job on two nodes of 8 GPUs: a gang that spans pods, so it gets the headless Service."""
    obj = on_nodes("seed-qwen14b-tp4.yaml", nodes=2, gpusPerNode=8)
    obj["metadata"]["namespace"] = "research"
    return children_by_kind(obj)


def pod_spec(children: dict[str, dict]) -> dict:
    return children["Job"]["spec"]["template"]["spec"]


def trainer(children: dict[str, dict]) -> dict:
    (container,) = pod_spec(children)["containers"]
    return container


def env_of(container: dict) -> dict[str, dict]:
    return {item["name"]: item for item in container["env"]}


def test_children_are_named_namespaced_and_labelled(two_nodes):
    names = {kind: obj["metadata"]["name"] for kind, obj in two_nodes.items()}
    assert names == {
        "ServiceAccount": "seed-qwen14b-tp4-trainer",
        "Role": "seed-qwen14b-tp4-trainer",
        "RoleBinding": "seed-qwen14b-tp4-trainer",
        "ConfigMap": "seed-qwen14b-tp4-config",
        "Service": "seed-qwen14b-tp4",
        "Job": "seed-qwen14b-tp4",
    }
    for obj in two_nodes.values():
        assert obj["metadata"]["namespace"] == "research"
        assert obj["metadata"]["labels"]["colocgrpo.io/job-name"] == "seed-qwen14b-tp4"
        assert "ownerReferences" not in obj["metadata"]  # the operator adopts


ONE_NODE_KINDS = ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Job"]
# A gang across pods: the Service comes before the Job whose pods it names.
GANG_KINDS = ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "Job"]


@pytest.mark.parametrize(
    ("obj", "kinds"),
    [
        # Every rank in one pod: no headless Service (nothing resolves rank 0 by DNS).
        (on_nodes("seed-qwen14b-tp4.yaml"), ONE_NODE_KINDS),
        (on_nodes("tiny-cpu.yaml"), ONE_NODE_KINDS),
        (on_nodes("seed-qwen14b-tp4.yaml", nodes=2, gpusPerNode=8), GANG_KINDS),
        (on_nodes("tiny-cpu.yaml", nodes=3), GANG_KINDS),
    ],
    ids=["one-node-gpu", "one-node-cpu", "two-nodes-gpu", "three-nodes-cpu"],
)
def test_only_a_gang_across_pods_gets_the_headless_service(obj, kinds):
    job = parse_job(obj)
    assert [child["kind"] for child in render_children(job)] == kinds
    assert needs_rendezvous_service(job) is ("Service" in kinds)


@pytest.mark.parametrize(
    "obj",
    [on_nodes("seed-qwen14b-tp4.yaml"), on_nodes("tiny-cpu.yaml"), on_nodes("seed-qwen14b-tp4.yaml", nodes=2)],
    ids=["one-node-gpu", "one-node-cpu", "two-nodes-gpu"],
)
def test_children_pass_kubernetes_schema_validation(obj):
    for child in render_children(parse_job(obj)):
        kubernetes_validate.validate(child, K8S_VERSION, strict=True)


def test_config_map_has_exactly_the_three_files_and_no_secrets(seed):
    data = seed["ConfigMap"]["data"]
    assert set(data) == {"grpo.yaml", "accelerate.yaml", "deepspeed.json"}
    config = TrainerConfig.from_yaml(data["grpo.yaml"])  # the trainer's own parser accepts it
    assert config.job.name == "seed-qwen14b-tp4" and config.job.namespace == "research"
    accelerate = yaml.safe_load(data["accelerate.yaml"])
    assert accelerate["distributed_type"] == "DEEPSPEED"
    assert accelerate["num_machines"] == 1 and accelerate["num_processes"] == 8
    assert accelerate["deepspeed_config"]["deepspeed_config_file"] == "/etc/colocgrpo/deepspeed.json"
    assert accelerate["main_process_ip"] == "seed-qwen14b-tp4-0.seed-qwen14b-tp4"
    deepspeed = json.loads(data["deepspeed.json"])
    assert deepspeed["zero_optimization"]["stage"] == 3
    assert deepspeed["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert deepspeed["gradient_accumulation_steps"] == "auto"  # one source of truth: GRPOConfig


def one_gpu_job(offload_trainer_state: bool = False, **deepspeed) -> dict:
    obj = load_example("seed-qwen14b-tp4.yaml", resources={"nodes": 1, "gpusPerNode": 1})
    obj["spec"]["vllm"]["tensorParallelSize"] = 1
    obj["spec"]["vllm"]["offloadTrainerState"] = offload_trainer_state
    if deepspeed:
        obj["spec"]["deepspeed"] = deepspeed
    return obj


@pytest.mark.parametrize(
    ("obj", "one_gpu"),
    [
        # One process, parameters on the GPU: ZeRO-3's release/fetch and bucketing are overhead.
        (one_gpu_job(), True),
        # Several processes share each parameter: releasing is what saves memory.
        (load_example("seed-qwen14b-tp4.yaml"), False),
        (
            load_example(
                "seed-qwen14b-tp4.yaml", resources={"nodes": 2, "gpusPerNode": 4}, checkpoint={"claimName": "ckpt"}
            ),
            False,
        ),
        # Parameters offloaded to the CPU must go back to it after use.
        (one_gpu_job(offloadParams="cpu"), False),
        # offload_states moves partitions, not a resident parameter's view of one.
        (one_gpu_job(offload_trainer_state=True), False),
    ],
    ids=["one-gpu", "eight-gpus", "two-nodes", "one-gpu-param-offload", "one-gpu-trainer-state-offload"],
)
def test_zero3_settings_follow_world_size_and_offload(obj, one_gpu):
    zero = json.loads(children_by_kind(obj)["ConfigMap"]["data"]["deepspeed.json"])["zero_optimization"]
    assert zero["stage"] == 3
    if one_gpu:
        assert zero["stage3_param_persistence_threshold"] == EVERY_PARAMETER
        assert zero["memory_efficient_linear"] is False
        assert zero["reduce_bucket_size"] == 500_000_000
    else:
        assert zero["stage3_param_persistence_threshold"] == 10 * 5120  # Qwen2.5-14B: norms and biases stay whole
        assert "memory_efficient_linear" not in zero  # DeepSpeed's default (True)
        assert zero["reduce_bucket_size"] == builtin_shape("Qwen2.5-14B").layer_parameters()  # a flush per layer


@pytest.mark.parametrize(
    ("obj", "optimizer"),
    [
        # The offload needs DeepSpeed's own AdamW (FusedAdam) to move moments and fp32 master weights.
        (one_gpu_job(offload_trainer_state=True), "AdamW"),
        (load_example("seed-qwen14b-tp4.yaml", vllm={"tensorParallelSize": 4, "offloadTrainerState": True}), "AdamW"),
        # Without the offload transformers builds the optimizer trainerArgs.optim names.
        (one_gpu_job(), None),
        (load_example("seed-qwen14b-tp4.yaml"), None),
        # The optimizer lives on the CPU already (accelerate swaps in DeepSpeed's CPU Adam).
        (one_gpu_job(offload_trainer_state=True, offloadOptimizer="cpu"), None),
    ],
    ids=["one-gpu-offload", "eight-gpus-offload", "one-gpu", "eight-gpus", "optimizer-on-cpu"],
)
def test_deepspeed_adamw_only_where_the_offload_moves_it(obj, optimizer):
    deepspeed = json.loads(children_by_kind(obj)["ConfigMap"]["data"]["deepspeed.json"])
    if optimizer is None:
        assert "optimizer" not in deepspeed
        return
    assert deepspeed["optimizer"]["type"] == optimizer
    # Every hyperparameter "auto": transformers fills them from GRPOConfig, one source for each number.
    assert deepspeed["optimizer"]["params"] == {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}
    assert "scheduler" not in deepspeed  # transformers' scheduler (GRPOConfig.lr_scheduler_type) drives it


def test_secret_is_an_env_reference_never_config():
    obj = load_example("seed-qwen14b-tp4.yaml", secrets={"huggingFaceToken": {"name": "hf", "key": "token"}})
    children = children_by_kind(obj)
    env = env_of(trainer(children))
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert "token" not in json.dumps(children["ConfigMap"]["data"]).lower().replace("max_prompt_tokens", "")


def test_headless_service_for_rank0_dns(two_nodes):
    service = two_nodes["Service"]["spec"]
    assert service["clusterIP"] == "None"
    assert service["publishNotReadyAddresses"] is True
    assert service["selector"] == {"colocgrpo.io/job-name": "seed-qwen14b-tp4"}
    assert service["ports"] == [{"name": "rendezvous", "port": 29500, "targetPort": 29500, "protocol": "TCP"}]
    assert pod_spec(two_nodes)["subdomain"] == two_nodes["Service"]["metadata"]["name"]
    assert two_nodes["Job"]["spec"]["template"]["metadata"]["labels"]["colocgrpo.io/job-name"] == "seed-qwen14b-tp4"
    # Every rank meets rank 0 at its DNS name through the Service: the pods' variable and accelerate's file agree.
    assert env_of(trainer(two_nodes))["MASTER_ADDR"]["value"] == "seed-qwen14b-tp4-0.seed-qwen14b-tp4"
    accelerate = yaml.safe_load(two_nodes["ConfigMap"]["data"]["accelerate.yaml"])
    assert accelerate["num_machines"] == 2
    assert accelerate["main_process_ip"] == "seed-qwen14b-tp4-0.seed-qwen14b-tp4"


@pytest.mark.parametrize("example", ["seed-qwen14b-tp4.yaml", "tiny-cpu.yaml"])
def test_one_node_rendezvous_is_loopback_without_a_service(example):
    children = children_by_kind(load_example(example))
    assert "Service" not in children
    assert "subdomain" not in pod_spec(children)  # no Service to name the pods' DNS records
    env = env_of(trainer(children))
    assert env["MASTER_ADDR"]["value"] == "127.0.0.1"
    assert env["MASTER_PORT"]["value"] == "29500"
    # accelerate.yaml is left as it is (a GPU benchmark series records it): accelerate does not read
    # main_process_ip for one machine (render/workload.py, needs_rendezvous_service).
    name = children["Job"]["metadata"]["name"]
    accelerate = yaml.safe_load(children["ConfigMap"]["data"]["accelerate.yaml"])
    assert accelerate["num_machines"] == 1
    assert accelerate["main_process_ip"] == f"{name}-0.{name}"


def test_indexed_job_one_pod_per_node_never_retried_alone():
    obj = load_example(
        "seed-qwen14b-tp4.yaml", resources={"nodes": 3, "gpusPerNode": 8}, checkpoint={"claimName": "ckpt"}
    )
    job = children_by_kind(obj)["Job"]["spec"]
    assert job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"] == 3
    assert job["backoffLimit"] == 0
    assert job["podReplacementPolicy"] == "Failed"
    assert job["suspend"] is False
    assert job["template"]["spec"]["restartPolicy"] == "Never"


def test_gpu_container_resources_command_and_rendezvous(seed):
    container = trainer(seed)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 8
    assert container["command"][0] == "colocgrpo-launch"  # accelerate launch, exiting with the ranks' code
    command = " ".join(container["command"])
    assert "--config_file /etc/colocgrpo/accelerate.yaml" in command
    assert "--machine_rank $(MACHINE_RANK)" in command
    assert command.endswith("-m colocgrpo_training --config /etc/colocgrpo/grpo.yaml")
    env = env_of(container)
    assert env["MASTER_ADDR"]["value"] == "127.0.0.1"  # one node: every rank is in this pod
    assert env["MASTER_PORT"]["value"] == "29500"
    assert env["MACHINE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    assert env["NUM_MACHINES"]["value"] == "1" and env["NUM_PROCESSES"]["value"] == "8"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"]["value"] == "1"
    assert env["HF_HOME"]["value"] == "/cache/huggingface"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert env["COLOCGRPO_TERMINATION_LOG"]["value"] == container["terminationMessagePath"]


def test_volumes_shm_config_checkpoint_cache(seed):
    spec = pod_spec(seed)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in trainer(seed)["volumeMounts"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory" and mounts["dshm"] == "/dev/shm"
    assert volumes["config"]["configMap"]["name"] == "seed-qwen14b-tp4-config" and mounts["config"] == "/etc/colocgrpo"
    assert mounts["checkpoints"] == "/checkpoints" and mounts["cache"] == "/cache"
    # The trainer image runs as gid 1000; volumes must be writable for it.
    assert spec["securityContext"]["fsGroup"] == 1000


def test_checkpoint_pvc_reward_configmap_and_offline_cache():
    obj = load_example(
        "seed-qwen14b-tp4.yaml",
        checkpoint={"claimName": "ckpt", "path": "/ckpt", "saveSteps": 50},
        cache={"claimName": "hf-cache", "offline": True},
        rewardModules={"configMapName": "my-rewards"},
        rewards=[{"function": "my_rewards:exact"}],
        resources={"nodes": 1, "gpusPerNode": 8, "sharedMemory": "16Gi"},
    )
    children = children_by_kind(obj)
    volumes = {v["name"]: v for v in pod_spec(children)["volumes"]}
    mounts = {m["name"]: m for m in trainer(children)["volumeMounts"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == "ckpt"
    assert mounts["checkpoints"]["mountPath"] == "/ckpt"
    assert volumes["cache"]["persistentVolumeClaim"]["claimName"] == "hf-cache"
    assert volumes["dshm"]["emptyDir"]["sizeLimit"] == "16Gi"
    assert volumes["reward-modules"]["configMap"]["name"] == "my-rewards"
    reward_dir = mounts["reward-modules"]["mountPath"]
    assert not reward_dir.startswith("/etc/colocgrpo/")  # a ConfigMap mount is read-only: no nesting
    env = env_of(trainer(children))
    assert env["PYTHONPATH"]["value"] == reward_dir
    assert env["HF_HUB_OFFLINE"]["value"] == "1"
    config = TrainerConfig.from_yaml(children["ConfigMap"]["data"]["grpo.yaml"])
    assert config.reward_modules_dir == reward_dir
    assert config.checkpoint.dir == "/ckpt" and config.checkpoint.save_steps == 50


def test_trainer_rbac_patches_only_its_own_status(seed):
    rules = seed["Role"]["rules"]
    assert {
        "apiGroups": ["colocgrpo.io"],
        "resources": ["colocgrpojobs/status"],
        "resourceNames": ["seed-qwen14b-tp4"],
        "verbs": ["get", "patch"],
    } in rules
    for rule in rules:
        assert rule["resourceNames"] == ["seed-qwen14b-tp4"]
        assert set(rule["verbs"]) <= {"get", "patch"}
        if rule["resources"] != ["colocgrpojobs/status"]:
            assert rule["verbs"] == ["get"]
    binding = seed["RoleBinding"]
    assert binding["roleRef"]["name"] == seed["Role"]["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "seed-qwen14b-tp4-trainer", "namespace": "research"}
    ]
    assert pod_spec(seed)["serviceAccountName"] == "seed-qwen14b-tp4-trainer"
    assert pod_spec(seed)["automountServiceAccountToken"] is True


def test_suspend_and_kueue_queue_propagate():
    suspended = children_by_kind(load_example("seed-qwen14b-tp4.yaml", runPolicy={"suspend": True}))["Job"]
    assert suspended["spec"]["suspend"] is True
    queued = children_by_kind(load_example("seed-qwen14b-tp4.yaml", scheduling={"queueName": "gpu-queue"}))["Job"]
    assert queued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert queued["spec"]["suspend"] is True  # Kueue admits by unsuspending
    assert "kueue.x-k8s.io/priority-class" not in queued["metadata"]["labels"]
    prioritized = children_by_kind(
        load_example(
            "seed-qwen14b-tp4.yaml", scheduling={"queueName": "gpu-queue", "workloadPriorityClassName": "high"}
        )
    )["Job"]
    assert prioritized["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    # The Workload's priority class is Kueue's, not the pods' PriorityClass.
    assert "priorityClassName" not in prioritized["spec"]["template"]["spec"]


def test_scheduling_pod_template_and_deadline_overrides():
    obj = load_example(
        "seed-qwen14b-tp4.yaml",
        image="registry.example/trainer:dev",
        imagePullPolicy="Always",
        scheduling={
            "nodeSelector": {"gpu": "h200"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                        ]
                    }
                }
            },
            "priorityClassName": "training",
        },
        podTemplate={
            "env": [
                {"name": "EXTRA", "value": "1"},
                {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}],
            "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
            "labels": {"team": "rl", "colocgrpo.io/job-name": "spoofed"},
            "annotations": {"note": "x"},
            "imagePullSecrets": [{"name": "regcred"}],
        },
        runPolicy={"activeDeadlineSeconds": 3600},
    )
    children = children_by_kind(obj, default_image="ignored:latest")
    job = children["Job"]
    spec = pod_spec(children)
    container = trainer(children)
    assert container["image"] == "registry.example/trainer:dev" and container["imagePullPolicy"] == "Always"
    assert spec["nodeSelector"] == {"gpu": "h200"}
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert spec["affinity"]["nodeAffinity"]
    assert spec["priorityClassName"] == "training"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert env_of(container)["FROM_SECRET"]["valueFrom"]["secretKeyRef"] == {"name": "s", "key": "k"}
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in container["volumeMounts"]
    assert any(v["name"] == "data" for v in spec["volumes"])
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "rl" and labels["colocgrpo.io/job-name"] == "seed-qwen14b-tp4"
    assert job["spec"]["template"]["metadata"]["annotations"] == {"note": "x"}
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_image_defaults_operator_flag_then_version():
    obj = load_example("tiny-cpu.yaml")
    assert trainer(children_by_kind(obj, default_image="op/trainer:1"))["image"] == "op/trainer:1"
    assert trainer(children_by_kind(obj))["image"] == "colocgrpo/trainer:0.1.0"


def test_cpu_job_runs_the_trainer_command_without_gpus_or_vllm():
    children = children_by_kind(load_example("tiny-cpu.yaml"))
    container = trainer(children)
    assert container["command"] == ["colocgrpo-train", "--config", "/etc/colocgrpo/grpo.yaml"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "2Gi"}
    config = TrainerConfig.from_yaml(children["ConfigMap"]["data"]["grpo.yaml"])
    assert config.vllm.enabled is False
    assert yaml.safe_load(children["ConfigMap"]["data"]["accelerate.yaml"])["distributed_type"] == "NO"


def test_multi_node_cpu_job_uses_accelerate_multi_cpu():
    children = children_by_kind(
        load_example("tiny-cpu.yaml", resources={"nodes": 2, "gpusPerNode": 0}, checkpoint={"claimName": "ckpt"})
    )
    assert trainer(children)["command"][0] == "colocgrpo-launch"
    accelerate = yaml.safe_load(children["ConfigMap"]["data"]["accelerate.yaml"])
    assert accelerate["distributed_type"] == "MULTI_CPU" and accelerate["num_processes"] == 2


def test_render_trainer_config_maps_every_typed_section():
    job = parse_job(load_example("seed-qwen14b-tp4.yaml"))
    config = render_trainer_config(job)
    assert config.model.name_or_path == "Qwen/Qwen2.5-14B-Instruct"
    assert config.model.attn_implementation == "sdpa"
    assert config.dataset.prompt_column == "problem"
    assert config.vllm.tensor_parallel_size == 4 and config.vllm.enabled
    assert [r.function for r in config.rewards] == ["accuracy", "format"]
    # The user's trainer arguments, and the collectives' timeout from the progress deadline.
    assert config.grpo == {**job.spec.trainer_args, "ddp_timeout": 1800}
    assert config.training.micro_batch_merge == "auto"
    # The gang's shape and the ZeRO stage and offloads of its deepspeed.json, for the trainer's memory plan.
    assert (config.resources.nodes, config.resources.gpus_per_node, config.resources.gpu_memory_gib) == (1, 8, None)
    assert (config.deepspeed.zero_stage, config.deepspeed.offload_optimizer, config.deepspeed.offload_params) == (
        job.spec.deepspeed.zero_stage,
        job.spec.deepspeed.offload_optimizer,
        job.spec.deepspeed.offload_params,
    )
    pinned = parse_job(load_example("seed-qwen14b-tp4.yaml", training={"microBatchMerge": 2}))
    assert render_trainer_config(pinned).training.micro_batch_merge == 2


@pytest.mark.parametrize(
    ("run_policy", "trainer_args", "timeout", "ddp_timeout"),
    [
        ({}, {}, 1800, 1800),  # the default deadline: torch's and DeepSpeed's own default timeout
        ({"progressDeadlineSeconds": 7200}, {}, 7200, 7200),
        ({"progressDeadlineSeconds": 60}, {}, 1800, 1800),  # never below what a first step needs
        ({"progressDeadlineSeconds": 7200}, {"ddp_timeout": 600}, 7200, 600),  # the user's own wins
        ({"progressDeadlineSeconds": 0}, {}, 1800, None),  # off: the libraries' defaults
    ],
)
def test_collective_timeouts_follow_the_progress_deadline(run_policy, trainer_args, timeout, ddp_timeout):
    body = load_example("tiny-cpu.yaml")
    body["spec"]["runPolicy"] = run_policy
    body["spec"]["trainerArgs"] = {**body["spec"].get("trainerArgs", {}), **trainer_args}
    job = parse_job(body)
    assert render_trainer_config(job).grpo.get("ddp_timeout") == ddp_timeout
    (batch_job,) = [c for c in render_children(job) if c["kind"] == "Job"]
    env = {e["name"]: e.get("value") for e in batch_job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == str(timeout)
    assert env["DEEPSPEED_TIMEOUT"] == str(-(-timeout // 60))


def test_trainer_pods_meet_the_restricted_level_by_default(seed):
    spec = pod_spec(seed)
    assert spec["securityContext"] == {
        "fsGroup": 1000,
        "fsGroupChangePolicy": "OnRootMismatch",
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert trainer(seed)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # /tmp is a volume, writable whatever uid the pod runs as and whatever the image's /tmp is.
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in trainer(seed)["volumeMounts"]}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}} and mounts["tmp"] == "/tmp"


def test_pod_security_opt_out_and_own_user():
    baseline = children_by_kind(
        load_example("seed-qwen14b-tp4.yaml", podTemplate={"podSecurity": {"level": "baseline"}})
    )
    assert pod_spec(baseline)["securityContext"] == {"fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch"}
    assert "securityContext" not in trainer(baseline)
    own = children_by_kind(
        load_example("seed-qwen14b-tp4.yaml", podTemplate={"podSecurity": {"runAsUser": 4242, "runAsGroup": 42}})
    )
    security = pod_spec(own)["securityContext"]
    assert (security["runAsUser"], security["runAsGroup"], security["fsGroup"]) == (4242, 42, 42)
    assert trainer(own)["securityContext"]["capabilities"] == {"drop": ["ALL"]}
