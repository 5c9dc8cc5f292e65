"""The trainer-side half of the GPU weight-integrity suite (tests/support/integrity_checks.py),
run on CPU with the tiny model: prompt tokens from a transformers-5 chat template, the
greedy margin, and the weight versions the suite steps through."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.trainer

torch = pytest.importorskip("torch")

from support.integrity_checks import WeightVersions, chat_prompt_ids, max_margin  # noqa: E402

PROMPTS = ["What is 2 + 3?", "What is 7 + 5? Think step by step."]


@pytest.fixture
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


@torch.no_grad()
def greedy(model, prompts, n=6):
    out = []
    for p in prompts:
        ids = list(p)
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        out.append(ids[len(p) :])
    return out


def test_chat_prompt_ids_are_token_ids(tiny_tokenizer):
    ids = chat_prompt_ids(tiny_tokenizer, PROMPTS)
    assert len(ids) == 2
    for row in ids:
        assert row and all(isinstance(t, int) for t in row)
    # the generation prompt is there: the text ends with the assistant turn opener
    assert tiny_tokenizer.decode(ids[0]).endswith("<|im_start|>assistant\n")


def test_greedy_output_has_zero_margin_and_any_other_token_a_positive_one(model, tiny_tokenizer):
    prompts = chat_prompt_ids(tiny_tokenizer, PROMPTS)
    before = greedy(model, prompts)
    assert max_margin(model, prompts, before) == 0.0
    off = [list(c) for c in before]
    off[1][3] = (off[1][3] + 1) % model.config.vocab_size  # one non-greedy token
    assert max_margin(model, prompts, off) > 0.0
    versions = WeightVersions(model)
    assert versions.step() == 1
    after = greedy(model, prompts)
    assert max_margin(model, prompts, after) == 0.0  # margins are taken at the current weights
    assert max_margin(model, prompts, [[], after[1]]) == float("inf")


def test_versions_are_independent_perturbations_of_the_base(model):
    versions = WeightVersions(model)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    versions.step()
    v1 = {n: p.detach().clone() for n, p in model.named_parameters()}
    changed = {n for n in base if not torch.equal(base[n], v1[n])}
    # relative noise: constant tensors (the tiny model's norm weights) have no spread to scale
    assert changed == {n for n, t in base.items() if t.numel() > 1 and float(t.std()) > 0}
    assert changed
    versions.step()
    # version 2 is drawn around the base, not around version 1: distance to the base stays bounded
    for name, param in model.named_parameters():
        if name in changed:
            spread = float((param - base[name]).std() / base[name].std().clamp_min(1e-12))
            assert 0.05 < spread < 0.2, (name, spread)
    other = WeightVersions(model)  # same base (current weights) → deterministic draws per version
    assert other.version == 0
