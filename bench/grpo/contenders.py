"""The contenders: which trainer, sleep policy and DeepSpeed file each runs, and the GRPOConfig arguments
they share (`grpo_kwargs`), and the run order of a pair."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.grpo.sizes import CONFIG
from bench.machine_job import folder_shape, machine_job

# Most important first: a run cut by the time budget keeps the headline comparison.
DEFAULT_CONTENDERS = "trl-sleep,ours-auto,trl-nosleep,ours-auto-offload,ours-off,ours-level2"
# At the large size sleeping is what lets both fit: the target is the sleep-on pair.
DEFAULT_LARGE_CONTENDERS = "trl-sleep,ours-auto,ours-level1,trl-nosleep"
# At the seed size a contender takes minutes: the pair against TRL's best recipe.
DEFAULT_SEED_CONTENDERS = "ours-auto,trl-best"
CONTENDERS = ("trl-sleep", "trl-nosleep", "trl-best", "ours-off", "ours-level1", "ours-level2", "ours-auto")


# The DeepSpeed file a contender trains under (`contender@plain` / `contender@product` picks
# one). `plain` is ZeRO-3 with DeepSpeed's defaults: what TRL's docs and accelerate's
# `zero_stage: 3` give a TRL user. `product` is what our operator renders for the same
# one-GPU job (colocgrpo_operator.render), which is how our trainer runs in a pod. `none` is no
# DeepSpeed at all: plain `accelerate launch`, the bf16 model, the trainer's default torch AdamW
# (`trl-sleep@none`: TRL as its quickstart runs it, the reference beside TRL under ZeRO-3).
#
# `trl-best` is TRL's best configuration of the same recipe: TRL's own GRPOTrainer with sleep on, fp32 master
# weights under ZeRO-3, the micro-batch merged as ours-auto merges it in the same run (what a TRL user gets by
# setting per_device_train_batch_size and gradient_accumulation_steps so), at the highest vLLM utilization that
# fits beside its training state. Its DeepSpeed file is the operator's (`product`), the faster of the two for TRL
# by median over the 7.18B series; `trl-best@plain` runs it under TRL's documented file, and a run of both lets
# bench.pair_table take the faster. Without DeepSpeed it would be another numeric recipe (bf16 weights and
# optimizer state): `trl-best@none` does not exist, `trl-sleep@none` is the reference.
DEEPSPEED_FILES = ("plain", "product", "none")


def check_contender(name: str) -> str:
    trainer, _, deepspeed = name.partition("@")
    base = trainer.removesuffix("-offload")
    if base not in CONTENDERS or (trainer.endswith("-offload") and not base.startswith("ours-")):
        raise argparse.ArgumentTypeError(
            f"unknown contender {name!r}: trl-sleep, trl-nosleep, trl-best, ours-<off|level1|level2|auto>[-offload], "
            f"each optionally @plain, @product or @none (trl-best: @plain or @product)"
        )
    if deepspeed and deepspeed not in DEEPSPEED_FILES:
        raise argparse.ArgumentTypeError(f"unknown DeepSpeed file {deepspeed!r} in {name!r}: @plain, @product or @none")
    if trainer == "trl-best" and deepspeed == "none":
        raise argparse.ArgumentTypeError("trl-best trains with fp32 master weights under ZeRO-3: @plain or @product")
    return name


def deepspeed_choice(contender: str) -> str:
    """`plain` for TRL, `product` for ours and trl-best, unless the name says otherwise."""
    trainer, _, deepspeed = contender.partition("@")
    return deepspeed or ("product" if trainer.startswith("ours-") or trainer == "trl-best" else "plain")


def fp32_master_weights(contender: str) -> bool:
    """Whether a contender trains with fp32 master weights and optimizer state: every one under DeepSpeed (bf16
    mixed precision under ZeRO-3); without it (`@none`) the model and torch AdamW's state are bf16."""
    return deepspeed_choice(contender) != "none"


def merges_micro_batches(contender: str) -> bool:
    """Whether a contender runs the micro-batch merge: ours (the trainer's own) and trl-best (the same one,
    applied to TRL's configuration as its user would)."""
    trainer = contender.partition("@")[0]
    return trainer.startswith("ours-") or trainer == "trl-best"


PLAIN_DEEPSPEED = {
    "zero_optimization": {"stage": 3},
    "bf16": {"enabled": "auto"},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
}


def product_deepspeed(
    offload_trainer_state: bool = False, gpus: int = 1, tensor_parallel_size: int = 1, model_dir: str | None = None
) -> dict:
    """deepspeed.json as the operator renders it for a job of one node with `gpus` GPUs (one by
    default), with or without `vllm.offloadTrainerState` (the `-offload` contenders), its ZeRO-3 knobs
    sized for the model in `model_dir` (its config.json; without one, the example job's model)."""
    from colocgrpo_operator.render import deepspeed_config

    job = machine_job(gpus=gpus, offload_trainer_state=offload_trainer_state, tensor_parallel_size=tensor_parallel_size)
    return deepspeed_config(job, shape=folder_shape(model_dir))


def deepspeed_file_key(contender: str) -> str:
    """Which written file a contender's launcher gets: its choice, and for our `-offload`
    contenders the product render of a job that offloads trainer state."""
    choice = deepspeed_choice(contender)
    offload = contender.partition("@")[0].endswith("-offload")
    return f"{choice}-offload" if choice == "product" and offload else choice


def builds_sleep_mode(contender: str) -> bool:
    """GRPOConfig's vllm_enable_sleep_mode: TRL's sleep switch for TRL's contenders; for ours, whether vLLM is built
    with sleep mode, as the trainer config's policy says (every policy but off; the policy decides when it sleeps)."""
    trainer = contender.partition("@")[0]
    if trainer.startswith("ours-"):
        return trainer.removeprefix("ours-").removesuffix("-offload") != "off"
    return trainer in ("trl-sleep", "trl-best")


def grpo_kwargs(
    contender: str,
    out: Path,
    steps: int,
    cpu: bool = False,
    config: dict = CONFIG,
    util: float | None = None,
    num_processes: int = 1,
    tensor_parallel_size: int = 1,
):
    """The GRPOConfig arguments of one contender (identical for all but the sleep switch), before any
    micro-batch merge. The size's per-device batch is the step's micro-batch on one GPU: `num_processes` share
    it. A size with `full_length` has vLLM ignore the end-of-sequence token (every completion is full length)."""
    util = util if util is not None else config["gpu_memory_utilization"]
    return dict(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=config["per_device_train_batch_size"] // num_processes,
        num_generations=config["num_generations"],
        max_completion_length=config["max_completion_length"],
        gradient_accumulation_steps=config["gradient_accumulation_steps"],
        steps_per_generation=config["steps_per_generation"],
        learning_rate=config["learning_rate"],
        temperature=config.get("temperature", 1.0),  # 1.0: TRL's default
        generation_kwargs=generation_kwargs(contender, config),
        max_steps=steps,
        beta=0.0,
        bf16=not cpu,
        seed=config["seed"],
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=util,
        vllm_max_model_length=config["max_model_len"],
        vllm_enable_sleep_mode=builds_sleep_mode(contender),
        vllm_tensor_parallel_size=tensor_parallel_size,
        model_init_kwargs={"dtype": "float32" if cpu else "bfloat16"},
        # accelerate hands DeepSpeed no backend on a machine without CUDA (and then counts one process);
        # without DeepSpeed one process needs no process group.
        ddp_backend="gloo" if cpu and deepspeed_choice(contender) != "none" else None,
    )


def generation_kwargs(contender: str, config: dict) -> dict | None:
    """GRPOConfig's generation_kwargs (vLLM's SamplingParams beyond TRL's own). A random model could still sample the
    end-of-sequence token: a size's `full_length` rules it out. trl-best turns vLLM's detokenization off, as our
    trainer does: TRL decodes the completions from their token ids itself, so its output is the same."""
    kwargs: dict = {}
    if config.get("full_length"):
        kwargs["ignore_eos"] = True
    if contender.partition("@")[0] == "trl-best":
        kwargs["detokenize"] = False
    return kwargs or None


def pair_order(pair: list[str], index: int) -> list[str]:
    """The run's contenders in run order: the list rotated left by `index`, so that consecutive runs
    (index 0, 1, 2, ...) change which contender meets the machine first. For a pair A,B that is A
    first for an even index and B first for an odd one; for three, each takes every position once
    in three runs."""
    shift = index % len(pair)
    return list(pair[shift:]) + list(pair[:shift])


def ours_utilization(
    contender: str,
    config: dict,
    model_path: str,
    device_bytes: int,
    num_processes: int = 1,
    tensor_parallel_size: int = 1,
) -> float | None:
    """The vLLM utilization the memory plan recommends for one of our contenders as a job of this shape (its sleep
    policy and trainer-state offload, the size's batch and lengths, the model's config.json, this card): the
    KV cache for the whole generation batch with slack, within what the training state leaves. None for TRL's
    contenders and where the planner finds no utilization that works."""
    from colocgrpo_training.config import DeepSpeedSettings, ResourceSettings, VLLMSettings
    from colocgrpo_training.planner import PlanRequest, plan
    from colocgrpo_training.planner.plan import GIB

    trainer = contender.partition("@")[0]
    if not trainer.startswith("ours-"):
        return None
    keys = (
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "steps_per_generation",
        "max_completion_length",
        "num_generations",
    )
    trainer_args = {key: config[key] for key in keys} | {"beta": 0.0}
    trainer_args["per_device_train_batch_size"] //= num_processes
    request = PlanRequest(
        model=model_path,
        dtype="bfloat16",
        resources=ResourceSettings(nodes=1, gpus_per_node=num_processes, gpu_memory_gib=device_bytes / GIB),
        deepspeed=DeepSpeedSettings(zero_stage=3),
        vllm=VLLMSettings(
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=0.5,  # any: the recommendation does not depend on it
            sleep_policy=trainer.removeprefix("ours-").removesuffix("-offload"),
            max_model_len=config["max_model_len"],
            offload_trainer_state=trainer.endswith("-offload"),
        ),
        max_prompt_tokens=config["prompt_tokens"],
        trainer_args=trainer_args,
    )
    return plan(request).recommended_gpu_memory_utilization
