"""Failure classification → the termination-message reasons the operator maps to conditions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from colocgrpo_training.config import CONFIG_VERSION
from colocgrpo_training.data import DataError
from colocgrpo_training.failures import (
    EXIT_INVALID_CONFIG,
    EXIT_TERMINATED,
    InvalidConfigError,
    TrainerTerminated,
    classify,
    write_termination_message,
)

pytestmark = pytest.mark.trainer


def _vllm_error() -> Exception:
    # An exception type defined in vLLM's package, as the engine raises them.
    cls = type("EngineDeadError", (RuntimeError,), {"__module__": "vllm.v1.engine.exceptions"})
    return cls("EngineCore encountered an issue")


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "CUDAOutOfMemory"),
        (RuntimeError("CUDA error: out of memory"), "CUDAOutOfMemory"),
        (RuntimeError("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7)"), "NCCLTimeout"),
        (torch.distributed.DistNetworkError("failed to connect to rank0:29500"), "NCCLTimeout"),
        (_vllm_error(), "VLLMError"),
        (InvalidConfigError("grpo.bf16 is set by model.dtype"), "InvalidConfig"),
        (DataError("dataset 'x' split 'train' is empty"), "DataError"),
        (ValueError("something else"), "TrainerError"),
    ],
)
def test_classify(exc, reason):
    assert classify(exc).reason == reason


def _raised_from(filename: str, exc: Exception) -> Exception:
    """`exc` raised by a function whose code lives in `filename`."""
    namespace: dict = {}
    exec(compile("def fail(exc):\n    raise exc\n", filename, "exec"), namespace)
    try:
        namespace["fail"](exc)
    except Exception as raised:
        return raised
    raise AssertionError("not raised")


@pytest.mark.parametrize(
    ("filename", "reason"),
    [
        ("/venv/site-packages/vllm/v1/engine/core.py", "VLLMError"),
        ("/app/training/colocgrpo_training/generation/vllm_engine.py", "VLLMError"),
        # TRL's trainer subclass is on the path of every step: what passes through it is not vLLM's.
        ("/app/training/colocgrpo_training/generation/trainer.py", "TrainerError"),
    ],
)
def test_vllm_errors_are_those_raised_in_vllm_or_its_wrapper(filename, reason):
    assert classify(_raised_from(filename, RuntimeError("something broke"))).reason == reason


def test_a_peer_that_ended_in_a_gloo_collective_is_a_collective_failure():
    lost = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer [::1]:1")
    trainer = "/app/training/colocgrpo_training/generation/trainer.py"
    assert classify(_raised_from(trainer, lost)).reason == "NCCLTimeout"


def test_wrapped_cause_is_classified_by_its_cause():
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except torch.OutOfMemoryError as inner:
            raise RuntimeError("generation failed") from inner
    except RuntimeError as outer:
        assert classify(outer).reason == "CUDAOutOfMemory"


def test_exit_codes():
    assert classify(InvalidConfigError("x")).exit_code == EXIT_INVALID_CONFIG
    assert classify(TrainerTerminated("x")).exit_code == EXIT_TERMINATED
    assert classify(RuntimeError("x")).exit_code == 1


def test_termination_message_is_json_and_bounded(tmp_path, monkeypatch):
    log = tmp_path / "termination-log"
    monkeypatch.setenv("COLOCGRPO_TERMINATION_LOG", str(log))
    failure = classify(RuntimeError("CUDA out of memory " + "x" * 10_000 + " END"))
    write_termination_message(failure)
    data = json.loads(log.read_text())
    assert data["reason"] == "CUDAOutOfMemory"
    assert data["message"].endswith("END")  # the end of an error says the most
    assert len(log.read_bytes()) < 4096  # Kubernetes' termination-message limit


def test_root_cause_is_not_overwritten_by_a_later_ranks_secondary_error(tmp_path, monkeypatch):
    log = tmp_path / "termination-log"
    monkeypatch.setenv("COLOCGRPO_TERMINATION_LOG", str(log))
    write_termination_message(classify(torch.OutOfMemoryError("CUDA out of memory (rank 1)")))
    write_termination_message(classify(RuntimeError("Watchdog caught collective operation timeout (rank 0)")))
    assert json.loads(log.read_text())["reason"] == "CUDAOutOfMemory"
    write_termination_message(classify(RuntimeError("rank 2 crashed")))
    assert json.loads(log.read_text())["reason"] == "CUDAOutOfMemory"


def test_secondary_error_is_replaced_by_a_root_cause(tmp_path, monkeypatch):
    log = tmp_path / "termination-log"
    monkeypatch.setenv("COLOCGRPO_TERMINATION_LOG", str(log))
    write_termination_message(classify(RuntimeError("Watchdog caught collective operation timeout")))
    write_termination_message(classify(ValueError("bad reward output")))
    assert json.loads(log.read_text())["reason"] == "TrainerError"


def test_a_message_from_an_earlier_run_is_replaced(tmp_path, monkeypatch):
    import os

    log = tmp_path / "termination-log"
    log.write_text(json.dumps({"reason": "CUDAOutOfMemory", "message": "yesterday"}))
    os.utime(log, (0, 0))
    monkeypatch.setenv("COLOCGRPO_TERMINATION_LOG", str(log))
    write_termination_message(classify(RuntimeError("Watchdog caught collective operation timeout")))
    assert json.loads(log.read_text())["reason"] == "NCCLTimeout"


def _run_entrypoint(config_text: str, tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    config = tmp_path / "grpo.yaml"
    config.write_text(config_text)
    log = tmp_path / "termination-log"
    env = {"COLOCGRPO_TERMINATION_LOG": str(log), "PATH": "/usr/bin:/bin"}
    import os

    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    result = subprocess.run([*args, "--config", str(config)], capture_output=True, text=True, env=env, timeout=120)
    return result, json.loads(log.read_text())


def test_invalid_config_names_the_field_and_exits_2(tmp_path):
    bad = (
        f"version: {CONFIG_VERSION}\njob: {{name: j, namespace: n}}\nmodel: {{name_or_path: m}}\n"
        "dataset: {name_or_path: d}\nrewards: [{function: format}]\n"
        "vllm: {enabled: false, gpu_memory_utilization: 1.5}\ncheckpoint: {dir: /tmp/x}\n"
    )
    result, message = _run_entrypoint(bad, tmp_path, sys.executable, "-m", "colocgrpo_training")
    assert result.returncode == 2, result.stderr
    assert message["reason"] == "InvalidConfig"
    assert "vllm.gpu_memory_utilization" in message["message"]


def test_wrong_config_version_through_the_console_script(tmp_path):
    script = Path(sys.executable).parent / "colocgrpo-train"  # what the pods run, installed with the package
    result, message = _run_entrypoint("version: 99\n", tmp_path, str(script))
    assert result.returncode == 2, result.stderr
    assert message["reason"] == "InvalidConfig"
    assert "version 99" in message["message"]


def test_a_name_the_hub_does_not_know_is_an_invalid_config():
    import httpx
    from huggingface_hub.errors import RepositoryNotFoundError

    url = "https://huggingface.co/api/models/no-such/model"
    response = httpx.Response(404, request=httpx.Request("GET", url))
    try:
        try:
            raise RepositoryNotFoundError(f"404 Client Error: Repository Not Found for url: {url}", response=response)
        except RepositoryNotFoundError as cause:
            raise OSError("no-such/model is not a local folder and is not a valid model identifier") from cause
    except OSError as err:
        failure = classify(err)
    assert (failure.reason, failure.exit_code) == ("InvalidConfig", EXIT_INVALID_CONFIG)
    assert failure.message.startswith("OSError: no-such/model is not a local folder")


MISSING_PATHS = (
    f"version: {CONFIG_VERSION}\n"
    "job: {{name: j, namespace: n}}\nmodel: {{name_or_path: {model}, dtype: float32}}\n"
    "dataset: {{name_or_path: {dataset}}}\nrewards: [{{function: format}}]\n"
    "vllm: {{enabled: false}}\ncheckpoint: {{dir: {checkpoints}}}\n"
    "progress: {{patch_status: false}}\ngrpo: {{per_device_train_batch_size: 2, num_generations: 2}}\n"
)


@pytest.mark.parametrize("missing", ["model", "dataset"])
def test_a_missing_model_or_dataset_path_is_an_invalid_config_not_retried(tmp_path, tiny_model_dir, missing):
    data = tmp_path / "train.jsonl"
    data.write_text('{"problem": "1 + 1?"}\n' * 4)
    paths = {"model": str(tiny_model_dir), "dataset": str(data), "checkpoints": str(tmp_path / "c")}
    paths[missing] = str(tmp_path / f"no-such-{missing}")
    result, message = _run_entrypoint(
        MISSING_PATHS.format(**paths), tmp_path, sys.executable, "-m", "colocgrpo_training"
    )
    assert result.returncode == EXIT_INVALID_CONFIG, result.stderr[-3000:]
    assert message == {
        "reason": "InvalidConfig",
        "message": f"{missing}.name {paths[missing]!r} does not exist on this node (a local path; every pod must "
        "mount it)",
    }


TP_ON_THREE = (
    f"version: {CONFIG_VERSION}\n"
    "job: {{name: j, namespace: n}}\nmodel: {{name_or_path: {model}}}\n"
    "dataset: {{name_or_path: {model}/train.jsonl}}\nrewards: [{{function: format}}]\n"
    "resources: {{nodes: 3, gpus_per_node: 2}}\n"  # what the config says; the launch below runs 3 per node
    "vllm: {{tensor_parallel_size: 2}}\ncheckpoint: {{dir: {model}/c}}\n"
)


def test_a_tp_size_that_does_not_divide_the_gpus_is_refused_before_any_model_loads(tmp_path):
    import os

    # The model path does not exist: the TP layout is refused before anything looks for the model.
    config = tmp_path / "grpo.yaml"
    config.write_text(TP_ON_THREE.format(model=tmp_path / "no-model"))
    env = {
        "COLOCGRPO_TERMINATION_LOG": str(tmp_path / "termination-log"),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "WORLD_SIZE": "6",
        "LOCAL_WORLD_SIZE": "3",
    }
    result = subprocess.run(
        [sys.executable, "-m", "colocgrpo_training", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == EXIT_INVALID_CONFIG, result.stderr
    assert json.loads((tmp_path / "termination-log").read_text()) == {
        "reason": "InvalidConfig",
        "message": "trainer config: vllm.tensor_parallel_size: must divide $LOCAL_WORLD_SIZE (3): a tensor-parallel "
        "group lives inside one node, got 2 (6 processes; the config's resources.gpus_per_node is 2)",
    }


def test_a_dataset_too_small_for_one_generation_batch_is_refused_before_training(tmp_path, tiny_model_dir):
    data = tmp_path / "train.jsonl"
    data.write_text('{"problem": "1 + 1?"}\n')  # one prompt; a generation batch of 2 rows x 1 step takes 1 prompt x 2
    config = MISSING_PATHS.format(model=tiny_model_dir, dataset=data, checkpoints=tmp_path / "c").replace(
        "per_device_train_batch_size: 2, num_generations: 2", "per_device_train_batch_size: 4, num_generations: 2"
    )
    result, message = _run_entrypoint(config, tmp_path, sys.executable, "-m", "colocgrpo_training")
    assert result.returncode == EXIT_INVALID_CONFIG, result.stderr[-3000:]
    assert message == {
        "reason": "InvalidConfig",
        "message": f"dataset {str(data)!r} split 'train' has 1 prompts, fewer than the 2 one generation batch takes "
        "(generation_batch_size 4 rows = per_device_train_batch_size 4 x steps_per_generation 1 x 1 processes, / "
        "num_generations 2): training would run no step. Add prompts, or lower per_device_train_batch_size, "
        "steps_per_generation or the number of GPUs",
    }
    assert not (tmp_path / "c").exists()  # nothing trained, nothing saved
