"""tests/gpu/drivers/learning_run.py launches the trainer under the files the operator renders for the
machine's own topology, so the GPU learning proof runs what a job of that shape would run."""

from __future__ import annotations

import json

import pytest
import yaml
from gpu.drivers import learning_run

from colocgrpo_operator.api import JobSpecError


@pytest.mark.parametrize(("gpus", "offload", "one_gpu_file"), [(1, False, True), (1, True, False), (2, False, False)])
def test_launch_files_follow_the_machine_and_the_offload(tmp_path, monkeypatch, gpus, offload, one_gpu_file):
    from colocgrpo_training.planner.zero3 import EVERY_PARAMETER

    model = tmp_path / "model"  # the run's model: its ZeRO-3 knobs are sized from its config.json
    model.mkdir()
    shape = {"hidden_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 192}
    (model / "config.json").write_text(json.dumps({**shape, "vocab_size": 1000, "model_type": "llama"}))
    monkeypatch.setattr(learning_run, "MODEL", str(model))
    deepspeed, accelerate, source = learning_run.launch_files(tmp_path, gpus, offload_trainer_state=offload)
    assert source.startswith("operator render of") and f"{gpus} GPUs" in source
    assert accelerate["num_processes"] == gpus and accelerate["num_machines"] == 1
    zero = deepspeed["zero_optimization"]
    if one_gpu_file:
        assert zero["stage3_param_persistence_threshold"] == EVERY_PARAMETER
    else:  # released after use, sized for the model the run trains, not the example job's
        assert zero["stage3_param_persistence_threshold"] == 10 * 96
        assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 96 * 96)


def test_render_gpus_gives_one_gpu_the_multi_gpu_layout(tmp_path):
    deepspeed, accelerate, source = learning_run.launch_files(tmp_path, 1, render_gpus=8)
    assert accelerate["num_processes"] == 1  # one process on this machine
    assert deepspeed["zero_optimization"]["stage3_param_persistence_threshold"] < 2**63 - 1  # released after use
    assert "rendered for 1 node x 8 GPUs" in source


def test_offload_render_names_deepspeeds_adamw_and_the_reference_reuses_the_file(tmp_path):
    main = tmp_path / "main"
    main.mkdir()
    learning_run.write_inputs(main, "auto", 3, {}, offload=True, dtype="bfloat16", render_gpus=8)
    written = json.loads((main / "deepspeed.json").read_text())
    assert written["optimizer"]["type"] == "AdamW"
    reference = tmp_path / "reference"
    reference.mkdir()
    _, source = learning_run.write_inputs(
        reference, "off", 3, {}, offload=False, dtype="bfloat16", deepspeed_from=main / "deepspeed.json"
    )
    assert json.loads((reference / "deepspeed.json").read_text()) == written
    config = yaml.safe_load((reference / "grpo.yaml").read_text())
    assert config["vllm"]["offload_trainer_state"] is False and config["vllm"]["sleep_policy"] == "off"
    assert "copied from main" in source


def test_a_four_gpu_tp2_run_gets_the_four_gpu_job_and_its_tp_size(tmp_path):
    learning_run.write_inputs(
        tmp_path, "auto", 3, {}, offload=False, dtype="bfloat16", num_processes=4, tensor_parallel_size=2
    )
    accelerate = yaml.safe_load((tmp_path / "accelerate.yaml").read_text())
    assert accelerate["num_processes"] == 4 and accelerate["distributed_type"] == "DEEPSPEED"
    deepspeed = json.loads((tmp_path / "deepspeed.json").read_text())
    assert deepspeed["zero_optimization"]["stage3_param_persistence_threshold"] < 2**63 - 1  # a multi-GPU file
    assert yaml.safe_load((tmp_path / "grpo.yaml").read_text())["vllm"]["tensor_parallel_size"] == 2
    with pytest.raises(JobSpecError, match="tensorParallelSize"):
        learning_run.machine_job(gpus=4, tensor_parallel_size=3)
