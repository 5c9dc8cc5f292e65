"""Runtimes (api/runtime.py): a job merged with the (Cluster)ColocGRPORuntime it names, offline, and as
`colocgrpo validate` / `render` / `plan` show it."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from colocgrpo_operator.api import JobSpecError, parse_job
from colocgrpo_operator.api.crd import structural_problems
from colocgrpo_operator.api.runtime import (
    LOCKABLE_FIELDS,
    RuntimeSpecError,
    generate_runtime_crds,
    parse_runtime,
    runtime_status,
    with_runtime,
)
from colocgrpo_operator.cli import main
from colocgrpo_operator.render import render_children

RUNTIME = {
    "apiVersion": "colocgrpo.io/v1alpha1",
    "kind": "ClusterColocGRPORuntime",
    "metadata": {"name": "h100", "generation": 4},
    "spec": {
        "template": {
            "image": "registry.example/trainer:1",
            "resources": {"gpusPerNode": 8, "cpu": "32"},
            "vllm": {"gpuMemoryUtilization": 0.5, "tensorParallelSize": 4},
            "cache": {"claimName": "hf-cache", "offline": True},
            "secrets": {"huggingFaceToken": {"name": "hf", "key": "token"}},
            "scheduling": {
                "nodeSelector": {"gpu": "h100"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
            "podTemplate": {"env": [{"name": "NCCL_IB_DISABLE", "value": "0"}, {"name": "LOG", "value": "info"}]},
        },
        "lockedFields": ["image", "scheduling.nodeSelector"],
    },
}
JOB = {
    "apiVersion": "colocgrpo.io/v1alpha1",
    "kind": "ColocGRPOJob",
    "metadata": {"name": "demo", "namespace": "team"},
    "spec": {
        "runtimeRef": {"name": "h100"},
        "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct", "parameterCount": 494032768},
        "dataset": {"name": "d"},
        "rewards": [{"function": "accuracy"}],
    },
}
KEY = ("ClusterColocGRPORuntime", "h100")


def job(**spec) -> dict:
    obj = copy.deepcopy(JOB)
    obj["spec"].update(spec)
    return obj


def merged(obj: dict, runtime: dict = RUNTIME):
    return parse_job(with_runtime(obj, {KEY: runtime}))


def test_the_job_takes_what_the_runtime_sets():
    spec = merged(job()).spec
    assert spec.image == "registry.example/trainer:1"
    assert (spec.resources.gpus_per_node, spec.resources.cpu) == (8, "32")
    assert (spec.vllm.gpu_memory_utilization, spec.vllm.tensor_parallel_size) == (0.5, 4)
    assert spec.cache.claim_name == "hf-cache" and spec.cache.offline
    assert spec.secrets.hugging_face_token.name == "hf"
    assert spec.scheduling.node_selector == {"gpu": "h100"}
    pod = next(c for c in render_children(merged(job())) if c["kind"] == "Job")["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example/trainer:1"
    assert pod["nodeSelector"] == {"gpu": "h100"}


def test_the_jobs_own_fields_override_and_add_up():
    spec = merged(
        job(
            vllm={"gpuMemoryUtilization": 0.4},
            resources={"gpusPerNode": 4},
            scheduling={"tolerations": [{"key": "team", "operator": "Exists"}]},
            podTemplate={"env": [{"name": "LOG", "value": "debug"}]},
        )
    ).spec
    assert spec.vllm.gpu_memory_utilization == 0.4
    assert spec.vllm.tensor_parallel_size == 4  # the runtime's, beside the job's own vllm field
    assert (spec.resources.gpus_per_node, spec.resources.cpu) == (4, "32")
    assert [t.key for t in spec.scheduling.tolerations] == ["nvidia.com/gpu", "team"]
    assert [(e.name, e.value) for e in spec.pod_template.env] == [("NCCL_IB_DISABLE", "0"), ("LOG", "debug")]


def test_a_value_equal_to_the_apis_default_is_a_field_left_out():
    # The API server fills in defaults (gpuMemoryUtilization 0.3): they never hide the runtime's value.
    assert (
        merged(job(vllm={"gpuMemoryUtilization": 0.3, "sleepPolicy": "auto"})).spec.vllm.gpu_memory_utilization == 0.5
    )


def test_the_merged_spec_is_validated_as_a_whole():
    # 6 GPUs (the job's) with tensor parallelism 4 (the runtime's): neither alone is wrong.
    with pytest.raises(JobSpecError) as error:
        merged(job(resources={"gpusPerNode": 6}))
    assert [path for path, _ in error.value.errors] == ["spec.vllm.tensorParallelSize"]


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"image": "mine:latest"}, "spec.image"),
        ({"scheduling": {"nodeSelector": {"gpu": "a100"}}}, "spec.scheduling.nodeSelector"),
    ],
)
def test_a_locked_field_is_refused_naming_it_and_the_runtime(spec, path):
    with pytest.raises(JobSpecError) as error:
        merged(job(**spec))
    ((where, message),) = error.value.errors
    assert where == path
    assert "is locked by ClusterColocGRPORuntime h100" in message
    # The runtime's own value is no override.
    merged(job(image="registry.example/trainer:1"))


def test_a_missing_runtime_and_an_invalid_one_are_clear():
    with pytest.raises(JobSpecError) as error:
        with_runtime(job(), {})
    assert error.value.errors == [("spec.runtimeRef", "ClusterColocGRPORuntime h100 not found")]
    bad = copy.deepcopy(RUNTIME)
    bad["spec"]["lockedFields"] = ["model.name"]
    with pytest.raises(RuntimeSpecError):
        parse_runtime(bad)
    with pytest.raises(JobSpecError) as error:
        with_runtime(job(), {KEY: bad})
    assert error.value.errors[0][0] == "spec.runtimeRef" and "lockedFields" in error.value.errors[0][1]


def test_runtime_status_names_the_generation():
    assert runtime_status(RUNTIME) == {"kind": "ClusterColocGRPORuntime", "name": "h100", "generation": 4}


def test_runtime_crds_are_structural_and_scoped():
    namespaced, cluster = generate_runtime_crds()
    assert (namespaced["spec"]["scope"], cluster["spec"]["scope"]) == ("Namespaced", "Cluster")
    for crd in (namespaced, cluster):
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert structural_problems(schema) == []
        locked = schema["properties"]["spec"]["properties"]["lockedFields"]["items"]["enum"]
        assert locked == list(LOCKABLE_FIELDS) and "scheduling.tolerations" in locked
        # No defaults: a runtime sets only what its author wrote.
        assert not list(_keys_named(schema, "default"))


def _keys_named(node, key):
    if isinstance(node, dict):
        if key in node:
            yield node[key]
        for value in node.values():
            yield from _keys_named(value, key)
    elif isinstance(node, list):
        for value in node:
            yield from _keys_named(value, key)


def test_render_validate_and_plan_show_the_merged_job(tmp_path, capsys):
    runtime_file, job_file = tmp_path / "runtime.yaml", tmp_path / "job.yaml"
    runtime_file.write_text(yaml.safe_dump(RUNTIME))
    job_file.write_text(yaml.safe_dump(job()))
    assert main(["render", "-f", str(job_file), "--runtime", str(runtime_file)]) == 0
    rendered = list(yaml.safe_load_all(capsys.readouterr().out))
    batch = next(o for o in rendered if o["kind"] == "Job")
    assert batch["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/trainer:1"
    assert main(["validate", "-f", str(job_file)]) == 1
    assert "spec.runtimeRef: ClusterColocGRPORuntime h100 not found" in capsys.readouterr().err
    # One file holding the runtime and the job.
    both = tmp_path / "both.yaml"
    both.write_text(yaml.safe_dump_all([RUNTIME, job()]))
    assert main(["validate", "-f", str(both)]) == 0
    capsys.readouterr()
    assert main(["plan", "-f", str(both), "-o", "json"]) in (0, 1)
    plan = json.loads(capsys.readouterr().out)
    # vLLM's share is the runtime's gpuMemoryUtilization (0.5), not the API's default (0.3).
    assert plan["perGpuVllmGiB"] == pytest.approx(0.5 * plan["gpuMemoryGiB"], abs=0.01)
    locked = tmp_path / "locked.yaml"
    locked.write_text(yaml.safe_dump(job(image="mine:1")))
    assert main(["plan", "-f", str(locked), "--runtime", str(runtime_file)]) == 2
    assert "spec.image: is locked by ClusterColocGRPORuntime h100" in capsys.readouterr().err
