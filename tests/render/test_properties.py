"""Property tests: random valid jobs render to objects Kubernetes 1.36 accepts; random bad
input gives field-named errors, never a traceback."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import kubernetes_validate
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from colocgrpo_operator.api import JobSpecError, generate_crd, parse_job
from colocgrpo_operator.render import render_children

K8S_VERSION = "1.36.0"
REPO = Path(__file__).resolve().parents[2]
CRD_SCHEMA = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
PROFILE = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.from_regex(r"\A[a-z]([-a-z0-9]{0,50}[a-z0-9])?\Z", fullmatch=True)
dns_names = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?\Z", fullmatch=True)
quantities = st.one_of(st.integers(1, 512), st.sampled_from(["500m", "2", "16Gi", "1.5", "64Mi", "1e3"]))
label_keys = st.from_regex(r"\A[a-z]([a-z0-9.-]{0,10}/)?[a-z][a-z0-9]{0,10}\Z", fullmatch=True)
label_values = st.from_regex(r"\A[a-zA-Z0-9]{0,12}\Z", fullmatch=True)
env_names = st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,15}\Z", fullmatch=True)
rewards = st.one_of(
    st.sampled_from(["accuracy", "format", "tag_count"]),
    st.from_regex(r"\A[a-z_][a-z0-9_]{0,8}(\.[a-z_][a-z0-9_]{0,8})?:[a-z_][a-z0-9_]{0,8}\Z", fullmatch=True),
)
trainer_args = st.fixed_dictionaries(
    {},
    optional={
        "learning_rate": st.floats(1e-7, 1e-2),
        "max_steps": st.integers(1, 10_000),
        "seed": st.integers(0, 2**31 - 1),
        "temperature": st.floats(0.1, 2.0),
        "lr_scheduler_type": st.sampled_from(["cosine", "linear", "constant"]),
        "gradient_checkpointing_kwargs": st.fixed_dictionaries({"use_reentrant": st.booleans()}),
        "report_to": st.sampled_from(["none", ["tensorboard"]]),
        "model_init_kwargs": st.fixed_dictionaries({"use_kernels": st.booleans()}),
    },
)


@st.composite
def valid_jobs(draw) -> dict:
    gpus = draw(st.sampled_from([0, 1, 2, 4, 8, 16]))
    tp = draw(st.sampled_from([d for d in (1, 2, 4, 8, 16) if gpus and gpus % d == 0] or [1]))
    spec: dict = {
        "model": {
            "name": draw(st.sampled_from(["Qwen/Qwen2.5-14B-Instruct", "/models/tiny"])),
            "dtype": draw(st.sampled_from(["bfloat16", "float16", "float32", "auto"])),
        },
        "dataset": {"name": "open-r1/OpenR1-Math-220k", "split": draw(st.sampled_from(["train", "train[:10%]"]))},
        "rewards": [
            {"function": f, "weight": draw(st.floats(-10, 10))} for f in draw(st.lists(rewards, min_size=1, max_size=4))
        ],
        "resources": {"nodes": draw(st.integers(1, 64)), "gpusPerNode": gpus},
        "vllm": {
            "tensorParallelSize": tp,
            "gpuMemoryUtilization": draw(st.floats(0.01, 0.99)),
            "sleepPolicy": draw(st.sampled_from(["off", "level1", "level2", "auto"])),
            "enablePrefixCaching": draw(st.booleans()),
        },
        "deepspeed": {"zeroStage": draw(st.integers(0, 3)), "offloadOptimizer": draw(st.sampled_from(["none", "cpu"]))},
        "trainerArgs": draw(trainer_args),
        "runPolicy": {"suspend": draw(st.booleans()), "maxRestarts": draw(st.integers(0, 10))},
    }
    if draw(st.booleans()):
        spec["resources"].update(cpu=draw(quantities), memory=draw(quantities), sharedMemory=draw(quantities))
    if draw(st.booleans()):
        spec["runPolicy"]["activeDeadlineSeconds"] = draw(st.integers(1, 10**7))
    if draw(st.booleans()):
        spec["checkpoint"] = {"claimName": draw(dns_names), "path": "/ckpt", "saveSteps": draw(st.integers(1, 1000))}
    elif spec["resources"]["nodes"] > 1:  # several pods resume from one volume, or never
        spec["checkpoint"] = {"resume": "never"}
    if draw(st.booleans()):
        spec["cache"] = {"claimName": draw(dns_names), "offline": draw(st.booleans())}
    if draw(st.booleans()):
        spec["rewardModules"] = {"configMapName": draw(dns_names)}
    if draw(st.booleans()):
        spec["secrets"] = {"huggingFaceToken": {"name": draw(dns_names), "key": "token"}}
    if draw(st.booleans()):
        spec["scheduling"] = {
            "nodeSelector": draw(st.dictionaries(label_keys, label_values, max_size=3)),
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": draw(dns_names),
            "queueName": draw(st.one_of(st.none(), dns_names)),
        }
        if spec["scheduling"]["queueName"] is None:
            del spec["scheduling"]["queueName"]
    if draw(st.booleans()):
        volume = draw(dns_names)
        spec["podTemplate"] = {
            "env": [{"name": n, "value": "v"} for n in draw(st.lists(env_names, max_size=3, unique=True))],
            "volumes": [{"name": volume, "emptyDir": {}}],
            "volumeMounts": [{"name": volume, "mountPath": "/extra"}],
            "labels": draw(st.dictionaries(label_keys, label_values, max_size=3)),
            "annotations": draw(st.dictionaries(label_keys, st.text(max_size=20), max_size=3)),
            "imagePullSecrets": [{"name": draw(dns_names)}],
        }
    return {
        "apiVersion": "colocgrpo.io/v1alpha1",
        "kind": "ColocGRPOJob",
        "metadata": {"name": draw(names), "namespace": draw(dns_names)},
        "spec": spec,
    }


@PROFILE
@given(valid_jobs())
def test_valid_jobs_render_objects_kubernetes_accepts(obj):
    assert list(jsonschema.Draft4Validator(CRD_SCHEMA).iter_errors(obj)) == []
    job = parse_job(obj)
    children = render_children(job)
    # The headless Service only for a gang across pods (render/workload.py, needs_rendezvous_service).
    assert len(children) == (6 if job.spec.resources.nodes > 1 else 5)
    for child in children:
        kubernetes_validate.validate(child, K8S_VERSION, strict=True)
        assert child["metadata"]["namespace"] == obj["metadata"]["namespace"]
        assert child["metadata"]["labels"]["colocgrpo.io/job-name"] == obj["metadata"]["name"]


# (path that must be named, mutation)
MUTATIONS = [
    (
        "spec.vllm.tensorParallelSize",
        lambda s: s["resources"].update(gpusPerNode=8) or s["vllm"].update(tensorParallelSize=3),
    ),
    ("spec.vllm.gpuMemoryUtilization", lambda s: s["vllm"].update(gpuMemoryUtilization=1.0)),
    ("spec.resources.nodes", lambda s: s["resources"].update(nodes=0)),
    ("spec.resources.gpusPerNode", lambda s: s["resources"].update(gpusPerNode="eight")),
    ("spec.resources.memory", lambda s: s["resources"].update(memory="lots")),
    ("spec.deepspeed.zeroStage", lambda s: s["deepspeed"].update(zeroStage=5)),
    ("spec.model.name", lambda s: s["model"].pop("name")),
    ("spec.rewards", lambda s: s.update(rewards=[])),
    ("spec.rewards[0].function", lambda s: s["rewards"][0].update(function="not a function")),
    ("spec.trainerArgs.use_peft", lambda s: s["trainerArgs"].update(use_peft=True)),
    ("spec.trainerArgs.vllm_tensor_parallel_size", lambda s: s["trainerArgs"].update(vllm_tensor_parallel_size=2)),
    ("spec.trainerArgs.learning_rat", lambda s: s["trainerArgs"].update(learning_rat=1.0)),
    ("spec.vllm.sleepPolicy", lambda s: s["vllm"].update(sleepPolicy="nap")),
    ("spec.runPolicy.maxRestarts", lambda s: s["runPolicy"].update(maxRestarts=-1)),
    ("spec.typo", lambda s: s.update(typo=1)),
]


@PROFILE
@given(valid_jobs(), st.sampled_from(MUTATIONS))
def test_invalid_jobs_name_the_field(obj, mutation):
    path, mutate = mutation
    bad = copy.deepcopy(obj)
    mutate(bad["spec"])
    try:
        parse_job(bad)
    except JobSpecError as error:
        assert path in dict(error.errors), error.errors
    else:
        raise AssertionError(f"accepted a job with a bad {path}")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
spec_keys = st.sampled_from(
    [
        "model",
        "dataset",
        "rewards",
        "resources",
        "vllm",
        "deepspeed",
        "trainerArgs",
        "checkpoint",
        "scheduling",
        "podTemplate",
        "runPolicy",
        "secrets",
        "image",
        "command",
    ]
)


@PROFILE
@example({"metadata": {"name": 5}, "spec": {}})
@example({"metadata": {"name": ["x"]}, "spec": {"resources": {"gpusPerNode": True}, "vllm": {"tensorParallelSize": 0}}})
@example({"apiVersion": 1, "kind": None, "metadata": None, "spec": None})
@given(
    st.one_of(
        json_values, st.fixed_dictionaries({"metadata": json_values, "spec": st.dictionaries(spec_keys, json_values)})
    )
)
def test_garbage_never_raises_anything_but_a_field_error(obj):
    try:
        job = parse_job(obj)
    except JobSpecError as error:
        assert error.errors
        for path, message in error.errors:
            assert isinstance(path, str) and isinstance(message, str) and message
    else:
        render_children(job)
