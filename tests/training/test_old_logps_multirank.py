"""The deferred old log-probs at world size 2 under DeepSpeed ZeRO-3, through the pod's own command.

A 2-GPU job with vLLM TP 2 (one TP group), rendered by the operator and launched here on CPU over gloo twice from one
seed: as it ships (the old log-probs of the micro-batches trained before the next optimizer step come from their
training forward) and with TRL's own forward over every row (`support.rank_probe`'s COLOCGRPO_PROBE_OLD_LOGPS). The
engine's log-probs are shifted per token (COLOCGRPO_PROBE_LOGPROB_SHIFT) so that vLLM's importance-sampling correction
is far from 1 and differs across tokens. Both runs must train alike — the final weights, every rank's loss and TRL's
five sampling metrics, which TRL gathers across ranks — while the shipped one forwards half the rows without
gradients on every rank. Under ZeRO-3 a forward is a collective: ranks that disagreed on which rows to forward would
hang, which the launch's time limit turns into a failure. The single-process comparison, and the control showing it
can fail, are in test_old_logps.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from colocgrpo_training.generation.old_logps import METRIC_NAMES
from support import rank_probe
from support.local_pod import Launch, cpu_pod_job, launch_pod, render_pod

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

torch = pytest.importorskip("torch")

WORLD, TP = 2, 2
PER_DEVICE, GENERATIONS, ACCUMULATION, STEPS_PER_GENERATION, MAX_STEPS = 2, 4, 2, 4, 4
LAUNCH_LIMIT_S = 300  # a launch takes well under a minute on two loaded cores; past this it hangs


def job(work: Path, model: Path) -> dict:
    return cpu_pod_job(
        work,
        model,
        name="old-logps",
        gpus=WORLD,
        tp=TP,
        sleep_policy="level2",
        checkpoint={"path": str(work / "checkpoints"), "saveFinalModel": True},
        trainer_args={
            "max_steps": MAX_STEPS,
            "per_device_train_batch_size": PER_DEVICE,
            "num_generations": GENERATIONS,
            "max_completion_length": 6,
            # A generation per two optimizer steps: its first two micro-batches train under the policy that
            # generated them (deferred), the last two after an optimizer step (forwarded).
            "gradient_accumulation_steps": ACCUMULATION,
            "steps_per_generation": STEPS_PER_GENERATION,
            "vllm_importance_sampling_mode": "token_truncate",
            "vllm_importance_sampling_clip_max": 3.0,
            "learning_rate": 0.05,
            "seed": 5,
            "logging_steps": 1,
        },
    )


def launch(name: str, root: Path, model: Path, env: dict[str, str], old_logps: str | None) -> Launch:
    work = root / name
    work.mkdir(parents=True)
    command = render_pod(job(work, model), work / "config", reward_modules_dir=work / "rewards")
    ranks = ",".join(map(str, range(WORLD)))
    env = {
        **env,
        rank_probe.DIR_ENV: str(work / "probe"),
        rank_probe.LOGPROB_SHIFT_ENV: f"{ranks}:on",
        "COLOCGRPO_TERMINATION_LOG": str(work / "termination-log"),
        "PYTHONUNBUFFERED": "1",
    }
    if old_logps is not None:
        env[rank_probe.OLD_LOGPS_ENV] = f"{ranks}:{old_logps}"
    run = launch_pod(command, work, env, world=WORLD, limit_s=LAUNCH_LIMIT_S, probe_dir=work / "probe")
    assert run.returncode == 0, run.tail()
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir, pod_env) -> dict[str, Launch]:
    root = tmp_path_factory.mktemp("old-logps-multirank")
    env = pod_env(root)
    return {
        "deferred": launch("deferred", root, tiny_model_dir, env, None),
        "trl": launch("trl", root, tiny_model_dir, env, "forward"),
    }


def final_weights(run: Launch) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    (path,) = (run.work / "checkpoints").glob("*/model.safetensors")
    return load_file(str(path))


def step_logs(run: Launch, rank: int) -> list[dict[str, float]]:
    return [r["logs"] for r in run.events(rank, "log") if "loss" in r["logs"]]


def test_both_ways_train_to_the_same_weights(runs, tiny_model_dir):
    from safetensors.torch import load_file

    deferred, trl = final_weights(runs["deferred"]), final_weights(runs["trl"])
    assert deferred.keys() == trl.keys()
    differ = max(float((deferred[name] - trl[name]).abs().max()) for name in trl)
    assert differ < 1e-5, f"the final weights differ by up to {differ}"
    (initial_file,) = Path(tiny_model_dir).glob("*.safetensors")
    initial = load_file(str(initial_file))
    moved = max(float((trl[name] - initial[name]).abs().max()) for name in trl if name in initial)
    assert moved > 1e-3, "training did not move the weights: the comparison would prove nothing"


@pytest.mark.parametrize("rank", range(WORLD))
def test_every_rank_logs_the_same_losses_and_sampling_metrics(runs, rank):
    deferred, trl = step_logs(runs["deferred"], rank), step_logs(runs["trl"], rank)
    assert len(deferred) == len(trl) == MAX_STEPS, (deferred, trl)
    for ours, theirs in zip(deferred, trl, strict=True):
        assert (METRIC_NAMES[0] in ours) == (METRIC_NAMES[0] in theirs), (ours, theirs)
        for key in ("loss", *(METRIC_NAMES if METRIC_NAMES[0] in theirs else ())):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), (key, ours[key], theirs[key])
    generations = MAX_STEPS * ACCUMULATION // STEPS_PER_GENERATION
    ratio_max = [e["sampling/importance_sampling_ratio/max"] for e in trl if METRIC_NAMES[4] in e]
    assert len(ratio_max) == generations
    assert max(ratio_max) > 1.2, "the correction stayed near 1: the comparison would prove nothing"


def test_the_shipped_way_forwards_only_the_rows_trained_after_an_optimizer_step(runs):
    generations = MAX_STEPS * ACCUMULATION // STEPS_PER_GENERATION
    batch = PER_DEVICE * STEPS_PER_GENERATION  # a generation's rows on one rank
    later = PER_DEVICE * (STEPS_PER_GENERATION - ACCUMULATION)
    for rank in range(WORLD):
        trl = [r["rows"] for r in runs["trl"].events(rank, "no_grad_forward")]
        ours = [r["rows"] for r in runs["deferred"].events(rank, "no_grad_forward")]
        assert sum(trl) == generations * batch, (rank, trl)
        assert sum(ours) == generations * later, (rank, ours)
