"""The ColocGRPOJob model: valid specs parse, invalid ones fail naming every bad field."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest

from colocgrpo_operator.api import (
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    ColocGRPOJob,
    JobSpecError,
    parse_job,
    spec_change_problems,
)
from colocgrpo_operator.api.validation import BUILTIN_REWARDS

REPO = Path(__file__).resolve().parents[2]


def minimal_job(**spec_overrides) -> dict:
    spec = {
        "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
        "dataset": {"name": "open-r1/OpenR1-Math-220k"},
        "rewards": [{"function": "accuracy"}],
        "resources": {"nodes": 1, "gpusPerNode": 8},
        "vllm": {"tensorParallelSize": 4},
    }
    spec.update(spec_overrides)
    return {"apiVersion": "colocgrpo.io/v1alpha1", "kind": "ColocGRPOJob", "metadata": {"name": "demo"}, "spec": spec}


def problems_of(obj: dict) -> dict[str, str]:
    with pytest.raises(JobSpecError) as caught:
        parse_job(obj)
    return dict(caught.value.errors)


def test_identity_constants():
    assert (GROUP, VERSION, PLURAL, KIND) == ("colocgrpo.io", "v1alpha1", "colocgrpojobs", "ColocGRPOJob")


def test_minimal_job_gets_documented_defaults():
    job = parse_job(minimal_job())
    assert isinstance(job, ColocGRPOJob)
    assert job.name == "demo" and job.namespace == "default"
    assert job.spec.vllm.tensor_parallel_size == 4
    assert job.spec.vllm.gpu_memory_utilization == 0.3
    assert job.spec.vllm.sleep_policy.value == "auto"
    assert job.spec.deepspeed.zero_stage == 3
    assert job.spec.checkpoint.resume == "auto"
    assert job.spec.run_policy.suspend is False
    assert job.world_size == 8


def test_camel_case_on_the_wire_snake_case_in_python():
    job = parse_job(minimal_job(runPolicy={"ttlSecondsAfterFinished": 60}))
    assert job.spec.run_policy.ttl_seconds_after_finished == 60
    wire = job.to_dict()
    assert wire["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 60
    assert wire["spec"]["vllm"]["tensorParallelSize"] == 4
    assert parse_job(wire).to_dict() == wire  # round trip


def test_tp_must_divide_gpus_per_node():
    found = problems_of(minimal_job(vllm={"tensorParallelSize": 3}))
    assert "spec.vllm.tensorParallelSize" in found
    assert "divide" in found["spec.vllm.tensorParallelSize"]


def test_tp_reported_even_when_other_fields_are_broken():
    found = problems_of(minimal_job(vllm={"tensorParallelSize": 3}, dataset={"name": ""}))
    assert {"spec.vllm.tensorParallelSize", "spec.dataset.name"} <= set(found)


def test_cpu_job_needs_no_tp():
    parse_job(minimal_job(resources={"gpusPerNode": 0}, vllm={}))
    found = problems_of(minimal_job(resources={"gpusPerNode": 0}, vllm={"tensorParallelSize": 2}))
    assert "spec.vllm.tensorParallelSize" in found


@pytest.mark.parametrize("value", [0, 1, 1.5, -0.1])
def test_gpu_memory_utilization_is_an_open_fraction(value):
    found = problems_of(minimal_job(vllm={"tensorParallelSize": 4, "gpuMemoryUtilization": value}))
    assert "spec.vllm.gpuMemoryUtilization" in found


def test_nodes_at_least_one_and_no_maximum():
    assert "spec.resources.nodes" in problems_of(minimal_job(resources={"nodes": 0, "gpusPerNode": 8}))
    parse_job(minimal_job(resources={"nodes": 4096, "gpusPerNode": 64}, checkpoint={"claimName": "shared"}))


def test_multi_node_resume_needs_one_checkpoint_volume_for_every_pod():
    # Each rank picks its resume step from its own listing; pods on their own emptyDirs would
    # resume from different steps (or none) and mismatch DeepSpeed's load collectives.
    two_nodes = {"nodes": 2, "gpusPerNode": 8}
    problems = problems_of(minimal_job(resources=two_nodes))
    assert problems["spec.checkpoint.claimName"].startswith(
        "is required when spec.resources.nodes is more than 1 and spec.checkpoint.resume is auto"
    )
    parse_job(minimal_job(resources=two_nodes, checkpoint={"claimName": "shared"}))
    parse_job(minimal_job(resources=two_nodes, checkpoint={"resume": "never"}))
    parse_job(minimal_job())  # one pod: its ranks share its volume


@pytest.mark.parametrize(
    "name",
    ["Demo", "1job", "job-", "job_x", "a" * 53, ""],
)
def test_metadata_name_must_fit_every_child(name):
    obj = minimal_job()
    obj["metadata"]["name"] = name
    assert "metadata.name" in problems_of(obj)


def test_longest_allowed_name_is_accepted():
    obj = minimal_job()
    obj["metadata"]["name"] = "a" * 52
    parse_job(obj)


def test_every_problem_is_reported_with_its_path():
    obj = minimal_job(
        model={},
        dataset={"name": "d", "bogus": 1},
        rewards=[{"function": "accuracy", "weight": "heavy"}],
        resources={"nodes": 1, "gpusPerNode": 8, "memory": "32Gx"},
        checkpoint={"path": "relative/dir"},
    )
    obj["apiVersion"] = "colocgrpo.io/v2"
    found = problems_of(obj)
    assert set(found) >= {
        "apiVersion",
        "spec.model.name",
        "spec.dataset.bogus",
        "spec.rewards[0].weight",
        "spec.resources.memory",
        "spec.checkpoint.path",
    }
    assert found["spec.dataset.bogus"] == "unknown field"
    assert "quantity" in found["spec.resources.memory"]
    assert "absolute path" in found["spec.checkpoint.path"]


def test_unknown_reward_is_named():
    found = problems_of(minimal_job(rewards=[{"function": "accuracy"}, {"function": "no such reward"}]))
    assert "spec.rewards[1].function" in found
    parse_job(minimal_job(rewards=[{"function": "my_rewards.scoring:exact_match", "weight": 0.5}]))


def test_trainer_args_unknown_key_gets_did_you_mean():
    found = problems_of(minimal_job(trainerArgs={"learning_rat": 1e-5}))
    assert "did you mean 'learning_rate'" in found["spec.trainerArgs.learning_rat"]


@pytest.mark.parametrize(
    "key, owner",
    [
        ("vllm_tensor_parallel_size", "spec.vllm.tensorParallelSize"),
        ("vllm_gpu_memory_utilization", "spec.vllm.gpuMemoryUtilization"),
        ("use_vllm", "spec.resources.gpusPerNode"),
        ("vllm_mode", "spec.vllm"),
        ("output_dir", "spec.checkpoint.path"),
        ("save_steps", "spec.checkpoint.saveSteps"),
        ("bf16", "spec.model.dtype"),
        ("hub_token", "spec.secrets.huggingFaceToken"),
    ],
)
def test_trainer_args_owned_key_names_its_owner(key, owner):
    found = problems_of(minimal_job(trainerArgs={key: 1}))
    assert owner in found[f"spec.trainerArgs.{key}"]


def test_model_init_kwargs_dtype_is_owned():
    found = problems_of(minimal_job(trainerArgs={"model_init_kwargs": {"dtype": "float16", "use_kernels": True}}))
    assert "spec.model.dtype" in found["spec.trainerArgs.model_init_kwargs.dtype"]
    parse_job(minimal_job(trainerArgs={"model_init_kwargs": {"use_kernels": True}}))


def test_use_peft_refused():
    found = problems_of(minimal_job(trainerArgs={"use_peft": True}))
    assert found["spec.trainerArgs.use_peft"].startswith("refused")


@pytest.mark.parametrize(
    "key, hint", [("warmup_ratio", "warmup_steps"), ("max_prompt_length", "spec.dataset.maxPromptTokens")]
)
def test_renamed_keys_point_to_their_new_home(key, hint):
    found = problems_of(minimal_job(trainerArgs={key: 0.1}))
    assert hint in found[f"spec.trainerArgs.{key}"]


@pytest.mark.parametrize("value", ["none", "tensorboard", ["tensorboard", "mlflow"], ["wandb"], []])
def test_report_to_names_an_integration_of_the_image(value):
    parse_job(minimal_job(trainerArgs={"report_to": value}))


@pytest.mark.parametrize(
    ("value", "named"), [("comet_ml", "'comet_ml'"), ("all", "'all'"), (["wandb", "neptune"], "'neptune'")]
)
def test_report_to_outside_the_image_is_refused_by_name(value, named):
    message = problems_of(minimal_job(trainerArgs={"report_to": value}))["spec.trainerArgs.report_to"]
    assert named in message and "the trainer image reports only to none, tensorboard, wandb, mlflow" in message


def test_max_model_len_must_hold_prompt_and_completion():
    found = problems_of(
        minimal_job(
            dataset={"name": "d", "maxPromptTokens": 512},
            vllm={"tensorParallelSize": 4, "maxModelLen": 1024},
            trainerArgs={"max_completion_length": 1024},
        )
    )
    assert "spec.vllm.maxModelLen" in found


@pytest.mark.parametrize(
    "deepspeed, vllm, trainer_args, field, words",
    [
        ({"zeroStage": 2}, {}, {}, "spec.vllm.offloadTrainerState", "needs spec.deepspeed.zeroStage 3, got 2"),
        ({"zeroStage": 0}, {}, {}, "spec.vllm.offloadTrainerState", "stage-0 optimizers cannot move"),
        ({"offloadParams": "cpu", "offloadOptimizer": "cpu"}, {}, {}, "spec.vllm.offloadTrainerState", "offloadParams"),
        ({}, {"sleepPolicy": "off"}, {}, "spec.vllm.offloadTrainerState", "sleeping spec.vllm.sleepPolicy"),
        ({}, {}, {"optim": "adafactor"}, "spec.trainerArgs.optim", "DeepSpeed's own AdamW"),
        ({}, {}, {"optim": ["not", "a", "name"]}, "spec.trainerArgs.optim", "must be unset"),
    ],
)
def test_trainer_state_offload_refuses_what_deepspeed_cannot_move(deepspeed, vllm, trainer_args, field, words):
    found = problems_of(
        minimal_job(
            deepspeed=deepspeed,
            vllm={"tensorParallelSize": 4, "offloadTrainerState": True, **vllm},
            trainerArgs=trainer_args,
        )
    )
    assert field in found and words in found[field], found


@pytest.mark.parametrize(
    "deepspeed, trainer_args",
    [
        ({}, {}),
        ({}, {"optim": "adamw_torch_fused"}),
        # The optimizer already lives on the CPU: only the bf16 partitions move, any optimizer goes.
        ({"offloadOptimizer": "cpu"}, {"optim": "adafactor"}),
    ],
)
def test_trainer_state_offload_accepted_with_zero3(deepspeed, trainer_args):
    job = parse_job(
        minimal_job(
            deepspeed=deepspeed, vllm={"tensorParallelSize": 4, "offloadTrainerState": True}, trainerArgs=trainer_args
        )
    )
    assert job.spec.vllm.offload_trainer_state
    # The same specs without the offload are fine whatever the stage, policy or optimizer.
    parse_job(minimal_job(deepspeed={"zeroStage": 2}, vllm={"tensorParallelSize": 4, "sleepPolicy": "off"}))


@pytest.mark.parametrize("quantity", [-1, "-1", "-500m", "-2Gi"])
def test_a_resource_quantity_is_never_negative(quantity):
    # The API server would refuse the gang's Job, far from the field that caused it.
    assert "spec.resources.cpu" in problems_of(minimal_job(resources={"gpusPerNode": 8, "cpu": quantity}))
    parse_job(minimal_job(resources={"gpusPerNode": 8, "cpu": "+500m", "memory": 0}))


def test_gpu_memory_is_a_positive_number_of_gib():
    job = parse_job(minimal_job(resources={"gpusPerNode": 8, "gpuMemoryGiB": 79.2}))
    assert job.spec.resources.gpu_memory_gib == 79.2
    assert job.to_dict()["spec"]["resources"]["gpuMemoryGiB"] == 79.2
    for bad in (0, -1, "80", True, 10**6):
        assert "spec.resources.gpuMemoryGiB" in problems_of(minimal_job(resources={"gpuMemoryGiB": bad}))


@pytest.mark.parametrize("value", ["auto", "off", 1, 4])
def test_micro_batch_merge_is_auto_off_or_a_factor(value):
    assert parse_job(minimal_job(training={"microBatchMerge": value})).spec.training.micro_batch_merge == value


@pytest.mark.parametrize("value", ["2", "on", 0, -1, True, 1.5, 4096])
def test_micro_batch_merge_refuses_anything_else(value):
    assert "spec.training.microBatchMerge" in problems_of(minimal_job(training={"microBatchMerge": value}))


@pytest.mark.parametrize(
    "image",
    [
        "busybox",
        "colocgrpo/trainer:0.1.0",
        "localhost:5000/team/trainer:v1",
        "[::1]:5000/trainer",
        "nvcr.io/nvidia/pytorch:24.01-py3",
        "registry.example.com/team/trainer@sha256:" + "a" * 64,
        "registry.example.com/team/trainer:v1@sha256:" + "a" * 64,
    ],
)
def test_an_image_reference_is_accepted(image):
    assert parse_job(minimal_job(image=image)).spec.image == image


@pytest.mark.parametrize(
    "image", ["", "Trainer", "trainer:", "trainer:-1", "a:b:c", "/trainer", "trainer ", "tr ainer", "a\x7fb", "ü"]
)
def test_anything_but_an_image_reference_is_refused_naming_spec_image(image):
    # The API server refuses the same (the CRD carries the pattern): no pod ever gets an image no kubelet can pull.
    assert "spec.image" in problems_of(minimal_job(image=image))


@pytest.mark.parametrize("obj", [None, [], "text", 3])
def test_non_mapping_is_a_clear_error(obj):
    with pytest.raises(JobSpecError):
        parse_job(obj)


def test_status_is_closed_and_typed():
    obj = minimal_job()
    obj["status"] = {
        "phase": "Running",
        "conditions": [
            {
                "type": "Running",
                "status": "True",
                "reason": "AllWorkersRunning",
                "message": "1/1 workers running",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "workers": {"active": 1, "ready": 1, "gpus": 8},
        "progress": {"step": 3, "maxSteps": 10, "metrics": {"reward": 0.5, "kl": 0.01}},
    }
    job = parse_job(obj)
    assert job.status.progress.metrics["reward"] == 0.5
    obj["status"]["progress"]["surprise"] = 1
    obj["status"]["phase"] = "Dancing"
    obj["status"]["conditions"][0]["reason"] = "not camel case"
    del obj["status"]["conditions"][0]["message"]
    found = problems_of(obj)
    assert {
        "status.progress.surprise",
        "status.phase",
        "status.conditions[0].reason",
        "status.conditions[0].message",
    } <= set(found)


def test_spec_is_immutable_once_started_except_suspend_and_ttl():
    old = minimal_job()
    new = copy.deepcopy(old)
    new["spec"]["vllm"]["tensorParallelSize"] = 2
    new["spec"]["runPolicy"] = {"suspend": True, "ttlSecondsAfterFinished": 5}
    assert spec_change_problems(old, new) == []  # not started: anything goes
    old["status"] = {"startTime": "2026-01-01T00:00:00Z"}
    assert [path for path, _ in spec_change_problems(old, new)] == ["spec.vllm"]
    new["spec"]["vllm"]["tensorParallelSize"] = 4
    assert spec_change_problems(old, new) == []
    new["spec"]["runPolicy"]["maxRestarts"] = 9
    assert [path for path, _ in spec_change_problems(old, new)] == ["spec.runPolicy.maxRestarts"]


def test_builtin_rewards_match_the_trainer():
    # Read the trainer's registry without importing it (it is not the operator's to import).
    source = (REPO / "training/colocgrpo_training/rewards/builtin.py").read_text()
    registry = next(
        node.value
        for node in ast.walk(ast.parse(source))
        if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "BUILTIN_REWARDS" for t in node.targets))
        or (isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "BUILTIN_REWARDS")
    )
    assert {key.value for key in registry.keys} == set(BUILTIN_REWARDS)


def test_pod_security_defaults_to_restricted_as_the_image_user():
    security = parse_job(minimal_job()).spec.pod_template.pod_security
    assert (security.level, security.run_as_user, security.run_as_group) == ("restricted", 1000, 1000)
    found = problems_of(minimal_job(podTemplate={"podSecurity": {"level": "privileged", "runAsUser": 0}}))
    assert "spec.podTemplate.podSecurity.level" in found
    assert "spec.podTemplate.podSecurity.runAsUser" in found  # root is what the baseline level is for


def test_user_volumes_may_not_collide_with_the_operators():
    found = problems_of(
        minimal_job(
            checkpoint={"path": "/ckpt"},
            podTemplate={
                "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "data", "emptyDir": {}}],
                "volumeMounts": [
                    {"name": "data", "mountPath": "/tmp"},
                    {"name": "data", "mountPath": "/ckpt/"},
                    {"name": "data", "mountPath": "/tmp/data"},  # inside ours is fine
                ],
            },
        )
    )
    assert "is a volume the operator adds" in found["spec.podTemplate.volumes[0].name"]
    assert "spec.podTemplate.volumes[1].name" not in found
    assert "scratch space" in found["spec.podTemplate.volumeMounts[0].mountPath"]
    assert "spec.checkpoint.path" in found["spec.podTemplate.volumeMounts[1].mountPath"]
    assert "spec.podTemplate.volumeMounts[2].mountPath" not in found
