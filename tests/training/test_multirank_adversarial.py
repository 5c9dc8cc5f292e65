"""World size 4 under DeepSpeed ZeRO-3 with inputs that are not friendly: every decision that changes the number or
order of collectives must be equal on every rank, whatever each rank sees.

A 4-GPU job with vLLM TP 2 (two TP groups of two ranks), rendered by the operator, its pod command launched here on
CPU over gloo (`support.local_pod`), each launch under a hard time limit (a hang fails the test and every rank is
killed). The engine is the CPU stand-in; `support.rank_probe` makes the ranks see different things:

- lengths: one TP group's completions end after 2 tokens, the other's run to 24, so TRL pads each rank's batch to a
  different length; the rows per no-grad forward (the reference model's, β > 0, and the old log-probs' of
  `num_iterations` 2) are sized from tokens, so sized per rank they would differ and the ranks would block in
  different collectives. Loss grpo, TRL's default importance-sampling mode (sequence_mask).
- epochs: steps_per_generation 3 with gradient_accumulation_steps 2 over two epochs of 9 micro-steps each, so
  transformers' accumulation windows restart off the trainer's micro-step count; deferred old log-probs predicted
  from that count would take a PPO ratio of 1 for micro-batches trained after an optimizer step. Loss dr_grpo, the
  engine's log-probs shifted so the importance-sampling correction is far from 1.
- merged: every rank plans to merge micro-batches 2 into 1 without gradient checkpointing and runs it (the
  GRPOConfig built again once the process group exists).
- gpu: one rank's GPU is far smaller (`rank_probe.GPU_MEMORY_ENV`, the memory the micro-batch merge reads): the others
  plan to merge micro-batches 2 into 1 without gradient checkpointing, it plans neither; every rank must run the same
  micro-batches and the same recompute. Then one rank's GPU leaves room for one layer's activations less: it plans
  the first layer checkpointed, the others none; every rank checkpoints that layer and trains the same model.
- undecided: one rank cannot plan at all (its GPU's memory cannot be read): every rank stops, with one error.

Where the math is the same as TRL's own path (no deferral, no merge, TRL's no-grad chunks), the final weights equal
those of the same job run that way.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from colocgrpo_training.failures import EXIT_INVALID_CONFIG
from colocgrpo_training.generation.trainer import no_grad_rows
from support import rank_probe
from support.local_pod import SHORT_RUN, Launch, cpu_pod_job, launch_probed, progress_steps

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

torch = pytest.importorskip("torch")

WORLD, TP = 4, 2
ALL = ",".join(map(str, range(WORLD)))
LAUNCH_LIMIT_S = 240  # a launch takes about a minute on two loaded cores; past this it hangs
PER_DEVICE = 2
SHORT, LONG = 2, 24  # completion tokens of TP group (0, 1) and of (2, 3) in the lengths case
PROMPT_TOKENS = 32  # cpu_pod_job's dataset.maxPromptTokens
# Tokens per no-grad forward in the lengths case: 4 rows of the short group fit one forward, the long group's do not.
NO_GRAD_TOKENS = 2 * PER_DEVICE * (PROMPT_TOKENS + SHORT)
EPOCH_PROMPTS, EPOCH_S, EPOCH_G = 9, 3, 2


def job_in(work: Path, name: str, model: Path, trainer_args: dict, *, prompts: int = 16, merge: str = "auto") -> dict:
    """The job every case launches (its files written under `work`)."""
    work.mkdir(parents=True)
    job = cpu_pod_job(
        work,
        model,
        name=name,
        gpus=WORLD,
        tp=TP,
        sleep_policy="auto",
        checkpoint={"path": str(work / "checkpoints"), "saveFinalModel": True},
        trainer_args={"learning_rate": 0.05, "seed": 5, "logging_steps": 1, **trainer_args},
        prompts=prompts,
    )
    job["spec"]["training"] = {"microBatchMerge": merge}
    return job


def launch(
    root: Path,
    name: str,
    model: Path,
    env: dict[str, str],
    trainer_args: dict,
    probe: dict[str, str],
    *,
    prompts: int = 16,
    merge: str = "auto",
) -> Launch:
    job = job_in(root / name, name, model, trainer_args, prompts=prompts, merge=merge)
    return launch_probed(job, root / name, env, probe, world=WORLD, limit_s=LAUNCH_LIMIT_S)


def trl_path(probe: dict[str, str]) -> dict[str, str]:
    """The probe settings of the same job run TRL's own way: no deferral, TRL's no-grad chunks (launched with
    `merge="off"`: no merge either)."""
    return {**probe, rank_probe.OLD_LOGPS_ENV: f"{ALL}:forward", rank_probe.NO_GRAD_TOKENS_ENV: f"{ALL}:0"}


def final_weights(run: Launch) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    (path,) = (run.work / "checkpoints").glob("*/model.safetensors")
    return load_file(str(path))


def assert_same_weights(ours: Launch, trl: Launch, initial_dir: Path) -> None:
    from safetensors.torch import load_file

    mine, theirs = final_weights(ours), final_weights(trl)
    assert mine.keys() == theirs.keys()
    differ = max(float((mine[name] - theirs[name]).abs().max()) for name in theirs)
    assert differ < 1e-4, f"the final weights differ from TRL's path by up to {differ}"
    (initial_file,) = initial_dir.glob("*.safetensors")
    initial = load_file(str(initial_file))
    moved = max(float((theirs[name] - initial[name]).abs().max()) for name in theirs if name in initial)
    assert moved > 1e-3, "training did not move the weights: the comparison would prove nothing"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("adversarial")


@pytest.fixture(scope="module")
def env(root, pod_env) -> dict[str, str]:
    return pod_env(root)


# -- lengths: completions of different lengths per rank, β > 0, two iterations -------------------------------------

LENGTHS_ARGS = {
    "max_steps": 2,
    "per_device_train_batch_size": PER_DEVICE,
    "num_generations": 4,
    "max_completion_length": LONG,
    "gradient_accumulation_steps": 2,
    "num_iterations": 2,  # old log-probs from a no-grad forward
    "beta": 0.04,  # the reference model's no-grad forward
    "loss_type": "grpo",
}
LENGTHS_PROBE = {
    rank_probe.STOP_AFTER_ENV: f"0,1:{SHORT}",
    rank_probe.NO_GRAD_TOKENS_ENV: f"{ALL}:{NO_GRAD_TOKENS}",
}


@pytest.fixture(scope="module")
def lengths(root, tiny_model_dir, env) -> dict[str, Launch]:
    return {
        "ours": launch(root, "lengths", tiny_model_dir, env, LENGTHS_ARGS, LENGTHS_PROBE),
        "trl": launch(root, "lengths-trl", tiny_model_dir, env, LENGTHS_ARGS, trl_path(LENGTHS_PROBE), merge="off"),
    }


def test_ranks_with_completions_of_different_lengths_take_the_same_no_grad_forwards(lengths):
    run = lengths["ours"]
    assert run.returncode == 0, run.tail()
    calls = {rank: run.events(rank, "no_grad_forward") for rank in range(WORLD)}
    assert len({len(c) for c in calls.values()}) == 1 and calls[0], calls
    differed = False
    for i, per_rank in enumerate(zip(*(calls[rank] for rank in range(WORLD)), strict=True)):
        assert len({r["forwards"] for r in per_rank}) == 1, f"call {i}: ranks took different forwards {per_rank}"
        # Sized from each rank's own padded length, the ranks would have taken different numbers of forwards.
        alone = {no_grad_rows(PER_DEVICE, r["tokens"], NO_GRAD_TOKENS) for r in per_rank}
        differed |= len(alone) > 1
    assert differed, "every rank saw lengths that chunk alike: the case proves nothing"
    assert max(run.progress_steps()) == LENGTHS_ARGS["max_steps"]


def test_different_lengths_train_as_trls_own_path(lengths, tiny_model_dir):
    assert lengths["trl"].returncode == 0, lengths["trl"].tail()
    assert_same_weights(lengths["ours"], lengths["trl"], tiny_model_dir)


# -- epochs: windows restart every epoch off the micro-step count ---------------------------------------------------

EPOCH_ARGS = {
    "num_train_epochs": 2,
    "per_device_train_batch_size": 1,
    "num_generations": 4,
    "max_completion_length": 6,
    "gradient_accumulation_steps": EPOCH_G,
    "steps_per_generation": EPOCH_S,
    "loss_type": "dr_grpo",
    "vllm_importance_sampling_mode": "sequence_mask",
    "vllm_importance_sampling_clip_max": 10.0,
}
EPOCH_PROBE = {rank_probe.LOGPROB_SHIFT_ENV: f"{ALL}:on"}


@pytest.fixture(scope="module")
def epochs(root, tiny_model_dir, env) -> dict[str, Launch]:
    def run(name: str, probe: dict[str, str], merge: str = "auto") -> Launch:
        return launch(root, name, tiny_model_dir, env, EPOCH_ARGS, probe, prompts=EPOCH_PROMPTS, merge=merge)

    return {"ours": run("epochs", EPOCH_PROBE), "trl": run("epochs-trl", trl_path(EPOCH_PROBE), merge="off")}


def test_two_epochs_whose_windows_restart_train_as_trls_own_path(epochs, tiny_model_dir):
    ours, trl = epochs["ours"], epochs["trl"]
    assert ours.returncode == 0, ours.tail()
    assert trl.returncode == 0, trl.tail()
    # 9 prompts, 3 per generation batch (1 row x 4 ranks x 3 micro-steps / 4 generations): 9 micro-steps an epoch,
    # optimizer steps after micro-steps 2, 4, 6, 8 and 9 (the epoch's short last window), then again from 10.
    assert max(ours.progress_steps()) == max(trl.progress_steps()) == 10
    assert_same_weights(ours, trl, tiny_model_dir)
    assert "old log-probs: one forward after each generation, as TRL does (steps_per_generation 3" in ours.stderr


# -- gpu: one rank plans for a smaller GPU ----------------------------------------------------------------------------

MERGE_ARGS = {**SHORT_RUN, "max_steps": 2}


def gpu_memory(spec: str) -> dict[str, str]:
    return {rank_probe.GPU_MEMORY_ENV: spec}


def assert_overruled_checkpointing(run: Launch, rank3_plan: str) -> None:
    """Ranks 0-2 planned no gradient checkpointing, rank 3 `rank3_plan`: the three warn that every rank runs rank 3's,
    naming each rank's plan."""
    for rank in (0, 1, 2):
        warning = f"rank{rank} WARNING colocgrpo.micro_batches: this rank planned gradient checkpointing on no layer; "
        assert warning in run.stderr, run.tail()
    plans = ["no layer"] * 3 + [rank3_plan]
    assert f"every rank runs it on {rank3_plan}, the most of any rank (per rank: {plans!r})" in run.stderr, run.tail()


def test_a_rank_told_its_gpu_is_smaller_runs_the_micro_batches_of_every_rank(root, tiny_model_dir, env):
    run = launch(root, "gpu", tiny_model_dir, env, MERGE_ARGS, gpu_memory("0,1,2:80;3:0.01"))
    assert run.returncode == 0, run.tail()
    assert max(run.progress_steps()) == MERGE_ARGS["max_steps"]
    # Ranks 0-2 planned the merge (the tiny model fits 80 GiB); rank 3 did not; all took rank 3's.
    for rank in (0, 1, 2):
        assert f"rank{rank} WARNING colocgrpo.micro_batches: this rank planned to merge its micro-batches 2 into 1" in (
            run.stderr
        ), run.tail()
    assert "every rank takes 1, the smallest of any rank (per rank: [2, 2, 2, 1])" in run.stderr
    # They also planned the merged micro-batch without gradient checkpointing, which rank 3's memory does not allow:
    # every rank recomputes (a rank that recomputes gathers each layer's partitions again in its backward).
    assert_overruled_checkpointing(run, "every layer, as configured")


@pytest.fixture(scope="module")
def merged_run(root, tiny_model_dir, env) -> Launch:
    """Every rank on an 80 GiB GPU: each plans the merge without gradient checkpointing."""
    return launch(root, "merged", tiny_model_dir, env, MERGE_ARGS, gpu_memory(f"{ALL}:80"))


def test_ranks_that_all_plan_the_merge_run_it(merged_run):
    run = merged_run
    assert run.returncode == 0, run.tail()
    assert max(run.progress_steps()) == MERGE_ARGS["max_steps"]
    # The GRPOConfig built again with the merged micro-batch, after the process group started: 1 x 4 rows per step.
    assert "rank0 INFO colocgrpo.micro_batches: training micro-batches merged 2 into 1: 1 x 4 rows" in run.stderr
    # ... and, the job leaving gradient_checkpointing unset, without the backward's recompute (only rank 0 logs at
    # INFO; a rank whose plan differed would warn).
    merged = next(line for line in run.stderr.splitlines() if "rank0 INFO colocgrpo.micro_batches" in line)
    assert "gradient checkpointing off: every layer's activations fit" in merged, merged
    assert "WARNING colocgrpo.micro_batches" not in run.stderr
    for rank in range(WORLD):  # no layer checkpointed at any push
        assert {tuple(push["checkpointing"]) for push in run.events(rank, "push")} == {(False, False)}


def one_checkpointed_layer_gib(work: Path, model: Path) -> float:
    """A GPU size, in GiB, on which the merged micro-batch's planned training peak fits with the tiny model's first
    layer checkpointed but not with none: the trainer's own planner (`merge_micro_batches`) on the job's rendered
    trainer config, checked to decide so."""
    from colocgrpo_training.config import TrainerConfig
    from colocgrpo_training.grpo_args import grpo_kwargs
    from colocgrpo_training.micro_batching import merge_micro_batches, model_config
    from colocgrpo_training.planner.inputs import resolve_inputs
    from colocgrpo_training.planner.micro_batches import TIGHT_HEADROOM_FRACTION
    from colocgrpo_training.planner.plan import plan_inputs
    from colocgrpo_training.planner.request import from_trainer_config
    from support.local_pod import render_pod

    render_pod(job_in(work, "plan", model, MERGE_ARGS), work / "config", reward_modules_dir=work / "rewards")
    config = TrainerConfig.load(work / "config" / "grpo.yaml")
    request = from_trainer_config(config, grpo_kwargs(config))

    def decided(gib: float):
        resources = request.resources.model_copy(update={"gpu_memory_gib": gib})
        return merge_micro_batches(dataclasses.replace(request, resources=resources))[1]

    merge = decided(80.0)
    assert merge.factor == 2 and merge.recompute_off, merge.message()
    where, _ = model_config(request.model)
    resources = request.resources.model_copy(update={"gpu_memory_gib": 80.0})
    inputs = dataclasses.replace(
        resolve_inputs(dataclasses.replace(request, model=where, resources=resources)),
        per_device_train_batch_size=PER_DEVICE * 2,
        steps_per_generation=1,
    )
    none, first = (plan_inputs(dataclasses.replace(inputs, checkpointed_layers=k)).per_gpu_training_gib for k in (0, 1))
    gib = (none + first) / 2 / (1 - TIGHT_HEADROOM_FRACTION)
    merge = decided(gib)
    assert merge.factor == 2 and merge.recompute is not None, merge.message()
    assert (merge.recompute.checkpointed_layers, merge.recompute.num_layers) == (1, 2), merge.message()
    return gib


def test_ranks_that_plan_fewer_checkpointed_layers_run_the_most_any_planned(root, tiny_model_dir, env, merged_run):
    # Ranks 0-2 plan the merged micro-batch without checkpointing; rank 3's GPU leaves room for the second layer's
    # activations only: every rank checkpoints the first layer, and trains the model the unchecked run trains.
    gib = one_checkpointed_layer_gib(root / "plan", tiny_model_dir)
    run = launch(root, "partial", tiny_model_dir, env, MERGE_ARGS, gpu_memory(f"0,1,2:80;3:{gib!r}"))
    assert run.returncode == 0, run.tail()
    assert max(run.progress_steps()) == MERGE_ARGS["max_steps"]
    assert_overruled_checkpointing(run, "1 of 2 layers")
    assert "WARNING colocgrpo.micro_batches: this rank planned gradient checkpointing on 1 of 2" not in run.stderr
    for rank in range(WORLD):  # at every push, after the generations' no-grad forwards too
        pushes = run.events(rank, "push")
        assert len(pushes) >= 2 and {tuple(push["checkpointing"]) for push in pushes} == {(True, False)}, rank
    assert_same_weights(run, merged_run, tiny_model_dir)


def test_a_rank_that_cannot_plan_stops_every_rank_with_its_reason(root, tiny_model_dir, env):
    run = launch(root, "undecided", tiny_model_dir, env, MERGE_ARGS, gpu_memory("2:unreadable"))
    assert run.returncode != 0
    codes = run.exit_codes()
    assert codes == dict.fromkeys(range(WORLD), EXIT_INVALID_CONFIG), (codes, run.tail())
    reason = "rank 2: cannot read this GPU's memory: the probe made this GPU's memory unreadable"
    assert run.stdout.count(reason) + run.stderr.count(reason) >= WORLD, run.tail()
    assert progress_steps(run.stdout) == []
