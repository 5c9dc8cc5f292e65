"""Merged micro-batches compute TRL 1.16's GRPO step: a real GRPO run on CPU (tiny model, transformers generation),
unmerged and merged from the same seed, agrees step by step; bnpo, which the rule marks as not exact, does not.

SGD rather than Adam: Adam's m/sqrt(v) turns float noise in near-zero gradients into whole-step differences, which
would hide what is compared. The model stops on many token ids, so completions differ in length and token counts
differ between micro-batches (what bnpo's per-micro-batch normalisation is sensitive to).
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def short_model(tmp_path_factory):
    """The tiny model, stopping on about a third of its vocabulary: completions of 1-6 tokens."""
    from colocgrpo_dev.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("short") / "model", seed=1)
    config_file = path / "generation_config.json"
    config = json.loads(config_file.read_text())
    config["eos_token_id"] = [config["eos_token_id"], *range(100, 230)]
    config_file.write_text(json.dumps(config))
    return path


def _reward(completions, **kwargs):
    return [float(len(str(c)) % 5) for c in completions]


def settings(loss_type: str, tmp_path) -> dict:
    return dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        steps_per_generation=4,  # two optimizer steps per generation
        num_generations=4,
        max_steps=4,  # two generations
        max_completion_length=6,
        loss_type=loss_type,
        optim="sgd",
        learning_rate=0.5,
        max_grad_norm=1e9,  # no clipping: the gradients themselves are compared
        beta=0.0,
        seed=11,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def train(model_dir, kwargs: dict, ours: dict | None = None):
    """TRL's GRPOTrainer, or with `ours` (its options) ColocGRPOTrainer generating with transformers as TRL does."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from colocgrpo_training.config import VLLMSettings
    from colocgrpo_training.generation import ColocGRPOTrainer
    from colocgrpo_training.generation.checkpointing import decoder_layers, layer_checkpointing

    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + {i % 3}?"}]} for i in range(16)]
    common = dict(
        model=str(model_dir), reward_funcs=[_reward], args=GRPOConfig(**kwargs), train_dataset=Dataset.from_list(rows)
    )
    if ours is None:
        trainer = GRPOTrainer(**common)
    else:
        trainer = ColocGRPOTrainer(**common, generation_settings=VLLMSettings(enabled=False), **ours)
    # Forwards started per decoder layer: a checkpointed layer starts its forward again in the backward (counted
    # as it starts: torch's recompute stops once it has what the backward needs, before the forward's end).
    calls = [0] * len(decoder_layers(trainer.model))
    for index, layer in enumerate(decoder_layers(trainer.model)):
        layer.register_forward_pre_hook(lambda *_, index=index: calls.__setitem__(index, calls[index] + 1))
    lengths: list[int] = []
    original = trainer._generate_and_score_completions

    def recording(batch):
        out = original(batch)
        lengths.extend(out["completion_mask"].sum(1).tolist())
        return out

    trainer._generate_and_score_completions = recording  # type: ignore[method-assign]
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    logs = [e for e in trainer.state.log_history if "loss" in e and "grad_norm" in e]
    return {
        "params": params,
        "moved": max(float((params[n] - before[n]).abs().max()) for n in params),
        "losses": [e["loss"] for e in logs],
        "grad_norms": [e["grad_norm"] for e in logs],
        "micro_steps": trainer._step,
        "rows": trainer.args.per_device_train_batch_size,
        "lengths": lengths,
        "checkpointing": trainer.model.is_gradient_checkpointing,
        "layers": layer_checkpointing(trainer.model),
        "layer_calls": calls,
    }


def max_difference(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_merged_micro_batches_train_the_same_model(loss_type, short_model, tmp_path):
    from colocgrpo_training.planner.micro_batches import plan_micro_batches

    kwargs = settings(loss_type, tmp_path)
    merge = plan_micro_batches(kwargs, None, pin=2)
    assert merge.factor == 2
    merged_kwargs = merge.rewrite(kwargs)
    assert (merged_kwargs["per_device_train_batch_size"], merged_kwargs["gradient_accumulation_steps"]) == (4, 1)
    assert merged_kwargs["steps_per_generation"] == 2

    unmerged = train(short_model, kwargs)
    merged = train(short_model, merged_kwargs)
    assert (unmerged["rows"], unmerged["micro_steps"]) == (2, 8)
    assert (merged["rows"], merged["micro_steps"]) == (4, 4)  # half the forwards and backwards
    assert len(set(unmerged["lengths"])) > 1, "completions of one length: bnpo's control would prove nothing"
    assert unmerged["lengths"] == merged["lengths"]  # the same completions, both generations
    assert unmerged["moved"] > 1e-2, "the weights barely moved: agreement would prove nothing"
    assert len(unmerged["losses"]) == len(merged["losses"]) == 4
    assert merged["losses"] == pytest.approx(unmerged["losses"], rel=1e-4, abs=1e-6)
    assert merged["grad_norms"] == pytest.approx(unmerged["grad_norms"], rel=1e-4)
    assert max_difference(unmerged["params"], merged["params"]) < 1e-5


def test_bnpo_merged_trains_a_different_model(short_model, tmp_path):
    # bnpo divides each micro-batch by its own token count: merged, rows are weighted differently. The rule refuses
    # it (test_micro_batches.py); forced here, the step really changes.
    from colocgrpo_training.planner.merge import MicroBatchMerge
    from colocgrpo_training.planner.micro_batches import exactness_problems

    kwargs = settings("bnpo", tmp_path)
    assert exactness_problems(kwargs)
    unmerged = train(short_model, kwargs)
    merged = train(short_model, MicroBatchMerge(2, 2, 2, 4, "forced").rewrite(kwargs))
    assert unmerged["lengths"][:8] == merged["lengths"][:8]  # the same first generation (8 completions)
    assert merged["grad_norms"][0] != pytest.approx(unmerged["grad_norms"][0], rel=1e-3)
    assert max_difference(unmerged["params"], merged["params"]) > 1e-3


def test_the_planners_recompute_switch_trains_the_same_model(short_model, tmp_path):
    # Where the merged micro-batch's activations fit, the planner turns GRPOConfig's default checkpointing off
    # (test_micro_batches.py); the backward then keeps each layer's activations instead of recomputing them.
    from colocgrpo_training.planner.merge import MicroBatchMerge, Recompute

    kwargs = settings("dapo", tmp_path)
    assert "gradient_checkpointing" not in kwargs  # TRL's default: on
    no_recompute = MicroBatchMerge(1, 2, 2, 4, "kept", recompute=Recompute(0, 2, 1.0)).rewrite(kwargs)
    assert no_recompute == {**kwargs, "gradient_checkpointing": False}

    checkpointed = train(short_model, kwargs)
    kept = train(short_model, no_recompute)
    assert (checkpointed["checkpointing"], kept["checkpointing"]) == (True, False)
    assert checkpointed["lengths"] == kept["lengths"] and checkpointed["moved"] > 1e-2
    assert kept["losses"] == pytest.approx(checkpointed["losses"], rel=1e-5, abs=1e-7)
    assert kept["grad_norms"] == pytest.approx(checkpointed["grad_norms"], rel=1e-5)
    assert max_difference(checkpointed["params"], kept["params"]) < 1e-6


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory):
    """The short-completion model with 4 decoder layers."""
    from colocgrpo_dev.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("four") / "model", num_layers=4, seed=1)
    config_file = path / "generation_config.json"
    config = json.loads(config_file.read_text())
    config["eos_token_id"] = [config["eos_token_id"], *range(100, 230)]
    config_file.write_text(json.dumps(config))
    return path


def test_checkpointing_the_first_layers_only_trains_the_same_model(four_layers, tmp_path):
    # Where some layers' activations fit, the planner checkpoints the first k (test_micro_batches.py) and the
    # trainer keeps the others whole, through both generations' no-grad forwards, after which TRL turns
    # checkpointing on for every layer again (generation/checkpointing.py).
    kwargs = settings("dapo", tmp_path)
    every = train(four_layers, kwargs, ours={})
    first_two = train(four_layers, kwargs, ours={"checkpointed_layers": 2})
    assert every["layers"] == [True] * 4 and first_two["layers"] == [True, True, False, False]
    # every layer runs the same forwards (no-grad and training); a checkpointed one runs each training forward again
    assert len(set(every["layer_calls"])) == 1
    recomputed = first_two["layer_calls"][0] - first_two["layer_calls"][3]
    assert recomputed > 0 and first_two["layer_calls"][:2] == every["layer_calls"][:2]
    assert first_two["layer_calls"][2:] == [every["layer_calls"][0] - recomputed] * 2
    assert every["lengths"] == first_two["lengths"] and every["moved"] > 1e-2
    assert first_two["losses"] == pytest.approx(every["losses"], rel=1e-5, abs=1e-7)
    assert first_two["grad_norms"] == pytest.approx(every["grad_norms"], rel=1e-5)
    assert max_difference(every["params"], first_two["params"]) < 1e-6


def test_every_n_layers_survives_our_generations_not_trls(four_layers, tmp_path):
    # transformers' own knob, set by a job: TRL 1.16 re-enables checkpointing from gradient_checkpointing_kwargs
    # after its first generation's no-grad forwards, every layer again and every_n_layers handed to torch's
    # checkpoint, which refuses it in the next backward. Our trainer keeps each layer as the Trainer set it.
    kwargs = {**settings("dapo", tmp_path), "gradient_checkpointing_kwargs": {"every_n_layers": 2}}
    with pytest.raises(ValueError, match="Unexpected keyword arguments: every_n_layers"):
        train(four_layers, kwargs)
    ours = train(four_layers, kwargs, ours={})
    assert ours["layers"] == [True, False, True, False] and ours["moved"] > 1e-2
    assert len(ours["losses"]) == 4
