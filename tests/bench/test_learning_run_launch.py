"""tests/gpu/drivers/learning_run.py launches the trainer under the files the operator renders for the
machine's own topology, so the GPU learning proof runs what a job of that shape would run."""

from __future__ import annotations

import pytest
from gpu.drivers import learning_run


@pytest.mark.parametrize(("gpus", "offload", "one_gpu_file"), [(1, False, True), (1, True, False), (2, False, False)])
def test_launch_files_follow_the_machine_and_the_offload(tmp_path, gpus, offload, one_gpu_file):
    from colocgrpo_operator.render.launch_config import EVERY_PARAMETER

    deepspeed, accelerate, source = learning_run.launch_files(tmp_path, gpus, offload_trainer_state=offload)
    assert source.startswith("operator render of") and f"{gpus} GPUs" in source
    assert accelerate["num_processes"] == gpus and accelerate["num_machines"] == 1
    threshold = deepspeed["zero_optimization"]["stage3_param_persistence_threshold"]
    assert threshold == (EVERY_PARAMETER if one_gpu_file else "auto")
