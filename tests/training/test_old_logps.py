"""Old log-probs from the training forward (colocgrpo_training/generation/old_logps.py, ColocGRPOTrainer).

The pure parts against hand-computed values, then TRL's real GRPO loop on CPU (the vLLM stand-in, whose
sampling log-probs are shifted per token so that the importance-sampling correction is far from 1) trained
twice from the same seed: TRL's way (a no-grad forward over the whole generation batch) and ours. The
weights after training, the losses and the sampling metrics must agree; the no-grad forward must cover only
the micro-batches trained after an optimizer step; and a correction left at 1 must show in the weights.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from colocgrpo_training.generation.old_logps import (  # noqa: E402
    METRIC_NAMES,
    SamplingStats,
    deferrable_chunks,
    importance_sampling_ratio,
    scored_mask,
)

pytestmark = pytest.mark.trainer


@pytest.mark.parametrize(
    ("micro_step", "spg", "ga", "expected"),
    [
        (0, 2, 1, [True, False]),  # the bench's large size after the merge: two optimizer steps per generation
        (0, 8, 4, [True] * 4 + [False] * 4),
        (0, 4, 4, [True] * 4),  # TRL's default: one generation per optimizer step
        (4, 4, 4, [True] * 4),
        (1, 1, 2, [True]),  # two generations per optimizer step: the second is still before the step
        (2, 2, 4, [True, True]),
        (3, 2, 4, [True, False]),  # a generation on the last micro-step of an accumulation (after resuming)
    ],
)
def test_micro_batches_before_the_next_optimizer_step_are_deferrable(micro_step, spg, ga, expected):
    assert deferrable_chunks(micro_step, spg, ga) == expected


def test_a_bad_schedule_is_refused():
    with pytest.raises(ValueError, match="steps_per_generation"):
        deferrable_chunks(0, 0, 1)


OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, -1.0]])
SAMPLING = torch.tensor([[-1.5, -1.0, float("nan")], [-0.2, -1.0, -4.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_token_modes_truncate_or_zero_the_ratio_outside_the_clip():
    diff = torch.tensor([[0.5, -1.0, 0.0], [0.0, -2.0, 0.0]])  # NaN and masked tokens: 0
    truncated = importance_sampling_ratio(OLD, SAMPLING, MASK, "token_truncate", None, 1.5)
    assert torch.allclose(truncated, torch.clamp(torch.exp(diff), max=1.5))
    masked = importance_sampling_ratio(OLD, SAMPLING, MASK, "token_mask", 0.3, 1.5)
    expected = torch.exp(diff)
    expected[expected > 1.5] = 0.0
    expected[expected < 0.3] = 0.0
    assert torch.allclose(masked, expected)
    assert masked[1, 1] == 0.0 and masked[0, 1] == pytest.approx(math.exp(-1.0))


def test_sequence_modes_use_the_summed_difference():
    truncated = importance_sampling_ratio(OLD, SAMPLING, MASK, "sequence_truncate", None, 3.0)
    assert truncated.shape == (2, 1)
    assert truncated[0, 0] == pytest.approx(math.exp(-0.5)) and truncated[1, 0] == pytest.approx(math.exp(-2.0))
    masked = importance_sampling_ratio(OLD, SAMPLING, MASK, "sequence_mask", 0.5, 3.0)
    assert masked[0, 0] == pytest.approx(math.exp(-0.5)) and masked[1, 0] == 0.0


def test_the_scored_tokens_leave_out_tool_results_as_trl_does():
    completion = torch.tensor([[1, 1, 1, 0]])
    assert torch.equal(scored_mask({"completion_mask": completion}), completion)
    tools = torch.tensor([[1, 0, 1, 1]])
    assert torch.equal(scored_mask({"completion_mask": completion, "tool_mask": tools}), torch.tensor([[1, 0, 1, 0]]))


def test_an_unknown_mode_is_named():
    with pytest.raises(ValueError, match="'token'"):
        importance_sampling_ratio(OLD, SAMPLING, MASK, "token", None, None)


def test_the_metrics_skip_unscored_and_masked_tokens_and_add_up_over_parts():
    ratio = importance_sampling_ratio(OLD, SAMPLING, MASK, "token_truncate", None, 3.0)
    whole = SamplingStats("token_truncate")
    whole.add(OLD, SAMPLING, MASK, ratio)
    parts = SamplingStats("token_truncate")
    parts.add(OLD[1:], SAMPLING[1:], MASK[1:], ratio[1:])  # scored in two parts, in any order
    parts.add(OLD[:1], SAMPLING[:1], MASK[:1], ratio[:1])
    values = whole.values()
    assert list(values) == list(METRIC_NAMES)
    assert {k: float(v) for k, v in parts.values().items()} == pytest.approx({k: float(v) for k, v in values.items()})
    deltas = [0.5, 1.0, 0.0, 2.0]  # the NaN token and the masked one are left out
    assert values["sampling/sampling_logp_difference/mean"] == pytest.approx(sum(deltas) / 4)
    assert values["sampling/sampling_logp_difference/max"] == pytest.approx(2.0)
    assert values["sampling/importance_sampling_ratio/min"] == pytest.approx(math.exp(-2.0))
    assert values["sampling/importance_sampling_ratio/max"] == pytest.approx(math.exp(0.5))
    empty = SamplingStats("token_truncate")
    empty.add(OLD, SAMPLING, torch.zeros_like(MASK), ratio)
    assert all(float(v) == 0.0 for v in empty.values().values())
    assert all(float(v) == 0.0 for v in SamplingStats("sequence_mask").values().values())
    sequences = SamplingStats("sequence_truncate")
    sequences.add(OLD, SAMPLING, MASK, importance_sampling_ratio(OLD, SAMPLING, MASK, "sequence_truncate", None, 3.0))
    assert sequences.values()["sampling/importance_sampling_ratio/min"] == pytest.approx(math.exp(-2.0))


# -- TRL's loop, both ways -------------------------------------------------------------------------
def _shift_sampling_logprobs(monkeypatch):
    """vLLM's log-probs made to differ from the trainer's by a per-token amount (0, -0.4 or +0.3), so that the
    correction's ratio is far from 1 and differs across tokens."""
    import vllm

    original = vllm.LLM.generate
    if getattr(original, "shifted", False):
        return  # once per test: a second wrapper would shift twice

    def generate(self, *args, **kwargs):
        outputs = original(self, *args, **kwargs)
        for output in outputs:
            for step in output.outputs[0].logprobs or []:
                for token, logprob in step.items():
                    logprob.logprob += (0.0, -0.4, 0.3)[token % 3]
        return outputs

    generate.shifted = True  # type: ignore[attr-defined]
    monkeypatch.setattr(vllm.LLM, "generate", generate)


def train(tiny_model_dir, tmp_path, monkeypatch, *, defer: bool, spg: int, ga: int, steps: int):
    from trl import GRPOTrainer

    from support import cpu_vllm
    from support.cpu_trainer import cpu_trainer

    cpu_vllm.install(monkeypatch)
    _shift_sampling_logprobs(monkeypatch)
    original = GRPOTrainer._get_per_token_logps_and_entropies
    if not getattr(original, "counted", False):  # once per test; each trainer counts into its own list

        def counted(self, model, input_ids, *args, **kwargs):
            if not torch.is_grad_enabled():
                self.no_grad_rows.append(input_ids.size(0))
            return original(self, model, input_ids, *args, **kwargs)

        counted.counted = True  # type: ignore[attr-defined]
        monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", counted)
    trainer = cpu_trainer(
        tiny_model_dir,
        tmp_path / f"out-{defer}",
        prompts=32,
        trainer_options={"defer_old_logps": defer},
        per_device_train_batch_size=4,
        num_generations=4,
        gradient_accumulation_steps=ga,
        steps_per_generation=spg,
        max_steps=steps,
        max_completion_length=5,
        learning_rate=0.05,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=3.0,
        seed=5,
    )
    trainer.no_grad_rows = []
    trainer.train()
    weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    logs = [e for e in trainer.state.log_history if "loss" in e]
    return weights, logs, trainer.no_grad_rows


def _assert_same_training(ours, trls):
    (w_ours, logs_ours, _), (w_trl, logs_trl, _) = ours, trls
    moved = max(float((w_trl[n] - w).abs().max()) for n, w in w_ours.items())
    assert moved < 1e-5, f"the weights differ by up to {moved}"
    assert len(logs_ours) == len(logs_trl)
    for a, b in zip(logs_ours, logs_trl, strict=True):
        assert (METRIC_NAMES[0] in a) == (METRIC_NAMES[0] in b), (a, b)
        for key in ("loss", *(METRIC_NAMES if METRIC_NAMES[0] in b else ())):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (key, a[key], b[key])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spg", "ga", "steps"),
    [
        (4, 2, 4),  # a generation per two optimizer steps: the first step's micro-batches deferred
        (2, 2, 2),  # TRL's default shape: every micro-batch deferred, no no-grad forward at all
    ],
)
def test_deferred_old_logps_train_as_trl_does_with_fewer_rows_forwarded(
    spg, ga, steps, tiny_model_dir, tmp_path, monkeypatch
):
    ours = train(tiny_model_dir, tmp_path, monkeypatch, defer=True, spg=spg, ga=ga, steps=steps)
    trls = train(tiny_model_dir, tmp_path, monkeypatch, defer=False, spg=spg, ga=ga, steps=steps)
    _assert_same_training(ours, trls)
    ratio_max = [e["sampling/importance_sampling_ratio/max"] for e in trls[1] if METRIC_NAMES[4] in e]
    assert len(ratio_max) == steps * ga // spg  # one value per generation
    assert max(ratio_max) > 1.2, "the correction stayed near 1: the comparison would prove nothing"
    generations = steps * ga // spg
    assert sum(trls[2]) == generations * spg * 4  # TRL: every row of every generation
    later = spg - ga if spg > ga else 0
    assert sum(ours[2]) == generations * later * 4, ours[2]


@pytest.mark.slow
def test_a_correction_left_at_one_changes_the_weights(tiny_model_dir, tmp_path, monkeypatch):
    """The comparison above can fail: with the deferred micro-batches' ratio forced to 1 the weights differ."""
    from colocgrpo_training.generation import trainer as trainer_module

    trls = train(tiny_model_dir, tmp_path, monkeypatch, defer=False, spg=2, ga=2, steps=2)
    monkeypatch.setattr(trainer_module, "importance_sampling_ratio", lambda old, *a, **k: torch.ones_like(old))
    broken = train(tiny_model_dir, tmp_path, monkeypatch, defer=True, spg=2, ga=2, steps=2)
    with pytest.raises(AssertionError):
        _assert_same_training(broken, trls)
