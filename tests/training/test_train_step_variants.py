"""bench/zero3_train_step.py's variant matrix on the CPU (tiny model, DeepSpeed ZeRO-3 over gloo).

Every training-side candidate must compute the step the baseline computes: at learning rate 0 the
weights never move, each variant sees the same rows, so the loss and gradient norm of every step must
agree with the baseline's (fewer, larger micro-batches; no gradient checkpointing), and the old
log-probs must sum to the same value whatever the chunking. The GPU run reports the same columns.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

pytest.importorskip("deepspeed")
REPO = Path(__file__).resolve().parents[2]


def test_every_variant_computes_the_baselines_step(tmp_path, tiny_model_dir, trainer_env):
    from bench.zero3_train_step import VARIANTS

    env = trainer_env(tmp_path)
    env["PYTHONPATH"] = f"{REPO}:{REPO / 'operator'}:{REPO / 'training'}:{REPO / 'dev'}"
    args = ["--model", str(tiny_model_dir), "--out", str(tmp_path), "--variants", "all", "--cpu"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.zero3_train_step", *args, "--measured-steps", "2", "--timeout", "400"],
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "variants.json").read_text())
    by_name = {r["variant"]: r for r in result["variants"]}
    assert list(by_name) == list(VARIANTS) and not result["problems"]
    base = by_name["base"]
    assert len(base["losses"]) == 3 and all(n and n > 0 for n in base["grad_norms"])
    assert len(set(base["losses"])) == 3, "every step has its own rows"
    for name, r in by_name.items():
        # transformers checkpoints a decoder layer only in training mode; from_pretrained leaves eval mode
        assert r["training_mode"], f"{name} ran in eval mode: its checkpointing column would not hold"
        assert len(r["step_times"]) == 3 and r["median_s"] > 0, r
        reference = base if r["kind"] == "train" else by_name["oldlogp-16"]
        assert r["losses"] == pytest.approx(reference["losses"], rel=1e-5), name
        if r["kind"] == "train":
            assert r["grad_norms"] == pytest.approx(base["grad_norms"], rel=1e-4), name
    assert by_name["mb64"]["rows_per_chunk"] == 64 and not by_name["no-ckpt"]["gradient_checkpointing"]
    table = (tmp_path / "variants.md").read_text()
    assert "| no-ckpt | optimizer step | 16 | off |" in table
    assert "| mb64-first17 | optimizer step | 64 | first 17 layers |" in table
