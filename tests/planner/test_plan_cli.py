"""`colocgrpo plan`: exit codes and messages, through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from support.cli_runner import run_colocgrpo as colocgrpo
from support.tiny_llama import write_llama_config

REPO = Path(__file__).resolve().parents[2]
SEED_EXAMPLE = REPO / "examples" / "seed-qwen14b-tp4.yaml"


def write_job(tmp_path: Path, spec: dict, name: str = "job") -> Path:
    job = {"apiVersion": "colocgrpo.io/v1alpha1", "kind": "ColocGRPOJob", "metadata": {"name": name}, "spec": spec}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def base_spec(model: str, gpus: int = 8, tp: int = 4, **model_fields) -> dict:
    return {
        "model": {"name": model, **model_fields},
        "dataset": {"name": "open-r1/OpenR1-Math-220k", "maxPromptTokens": 512},
        "resources": {"nodes": 1, "gpusPerNode": gpus},
        "vllm": {"tensorParallelSize": tp, "gpuMemoryUtilization": 0.35, "maxModelLen": 1536},
        "rewards": [{"function": "accuracy"}],
        "trainerArgs": {
            "per_device_train_batch_size": 16,
            "gradient_accumulation_steps": 4,
            "max_completion_length": 1024,
        },
    }


def test_fits_exit_0(tmp_path):
    result = colocgrpo("plan", "-f", str(write_job(tmp_path, base_spec("Qwen/Qwen2.5-14B-Instruct"))))
    assert result.returncode == 0, result.stderr
    assert "fits" in result.stdout and "recommended gpuMemoryUtilization" in result.stdout


def test_seed_example_fits():
    if not SEED_EXAMPLE.exists():
        pytest.fail(f"{SEED_EXAMPLE} is missing (the foundation issue commits it)")
    result = colocgrpo("plan", "-f", str(SEED_EXAMPLE), "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    plan = json.loads(result.stdout)
    assert plan["fits"] and plan["gpuMemoryUtilization"] == 0.35
    assert "qwen2.5-14b" in plan["shapeSource"]


def test_tiny_cpu_example_fits():
    result = colocgrpo("plan", "-f", str(REPO / "examples" / "tiny-cpu.yaml"))
    assert result.returncode == 0, result.stderr
    assert "CPU job" in result.stdout


def test_72b_on_one_gpu_exit_1_names_the_term(tmp_path):
    spec = base_spec("Qwen/Qwen2.5-72B-Instruct", gpus=1, tp=1)
    result = colocgrpo("plan", "-f", str(write_job(tmp_path, spec)))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "does NOT fit" in result.stdout
    assert "largest term: optimizer states" in result.stdout and "GiB over" in result.stdout


def test_json_output_and_gpu_memory_flag(tmp_path):
    path = write_job(tmp_path, base_spec("Qwen/Qwen2.5-14B-Instruct"))
    result = colocgrpo("plan", "-f", str(path), "-o", "json", "--gpu-memory-gib", "80")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["gpuMemoryGiB"] == 80 and plan["perGpuVllmGiB"] == pytest.approx(28.0)
    tiny = colocgrpo("plan", "-f", str(path), "--gpu-memory-gib", "24")
    assert tiny.returncode == 1


def test_unknown_model_exit_2_with_field(tmp_path):
    result = colocgrpo("plan", "-f", str(write_job(tmp_path, base_spec("acme/mystery-9b"))))
    assert result.returncode == 2
    assert "spec.model.name" in result.stderr and "parameterCount" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_model_with_parameter_count_plans(tmp_path):
    spec = base_spec("acme/mystery-9b", parameterCount=9_000_000_000)
    result = colocgrpo("plan", "-f", str(write_job(tmp_path, spec)))
    assert result.returncode == 0, result.stderr
    assert "approximate" in result.stdout


def test_bad_input_exit_2(tmp_path):
    missing = colocgrpo("plan", "-f", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    not_yaml = colocgrpo("plan", "-f", str(broken))
    assert not_yaml.returncode == 2 and "invalid YAML" in not_yaml.stderr
    no_job = colocgrpo("plan", "-f", "-", stdin="apiVersion: v1\nkind: ConfigMap\n")
    assert no_job.returncode == 2 and "kind: must be ColocGRPOJob, got 'ConfigMap'" in no_job.stderr
    bad_util = base_spec("Qwen/Qwen2.5-14B-Instruct")
    bad_util["vllm"]["gpuMemoryUtilization"] = 1.5
    result = colocgrpo("plan", "-f", str(write_job(tmp_path, bad_util, "badutil")))
    assert result.returncode == 2 and "spec.vllm.gpuMemoryUtilization" in result.stderr
    for each in (missing, not_yaml, no_job, result):
        assert "Traceback" not in each.stderr, each.stderr


def test_local_model_dir_relative_to_job_file(tmp_path):
    model_dir = tmp_path / "models" / "tiny"
    model_dir.mkdir(parents=True)
    write_llama_config(model_dir, tie_word_embeddings=True)
    spec = base_spec("models/tiny", gpus=1, tp=1)
    result = colocgrpo("plan", "-f", str(write_job(tmp_path, spec)), "-o", "json")
    assert result.returncode == 0, result.stderr
    assert "config.json" in json.loads(result.stdout)["shapeSource"]
