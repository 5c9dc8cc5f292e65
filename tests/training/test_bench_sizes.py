"""bench/grpo's size plan: the large and seed decoders' parameter counts, which shape a card gets, the seed
model the bench makes and its exact-length prompts, the vLLM utilizations tried, and the floor's arithmetic."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

pytestmark = pytest.mark.trainer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bench.grpo import contenders, floor, model, prompts, run, sizes  # noqa: E402 - after the skips

GIB = 2**30


@pytest.mark.parametrize("name", sorted(model.LARGE_SHAPES))
def test_shape_params_counts_what_transformers_builds(name):
    shape = model.LARGE_SHAPES[name]
    config = transformers.LlamaConfig(vocab_size=49152, tie_word_embeddings=True, **shape)
    with torch.device("meta"):
        built = transformers.LlamaForCausalLM(config)
    assert model.shape_params(shape) == sum(p.numel() for p in built.parameters())


def test_large_shape_makes_training_state_and_vllm_compete():
    # An H200 (≈ 140 GiB) gets the 7B decoder, an 80 GiB H100 the 3B one; in both the
    # ZeRO-3 training state takes over half the card.
    for device_gib, expected in ((140.4, "7b"), (79.6, "3b")):
        name = model.pick_large_shape(int(device_gib * GIB))
        assert name == expected
        state = model.shape_params(model.LARGE_SHAPES[name]) * sizes.TRAINING_STATE_BYTES_PER_PARAM
        assert 0.5 * device_gib * GIB < state <= 0.85 * device_gib * GIB
    with pytest.raises(SystemExit, match="no large shape fits"):
        model.pick_large_shape(24 * GIB)


def test_util_ladder_leaves_room_for_the_training_state():
    total = int(140.4 * GIB)
    params = model.shape_params(model.LARGE_SHAPES["7b"])
    ladder = sizes.util_ladder(total, params)
    assert ladder == sorted(ladder, reverse=True) and len(ladder) == 3
    state = params * sizes.TRAINING_STATE_BYTES_PER_PARAM
    assert state + ladder[0] * total + sizes.UTIL_RESERVE_BYTES <= total
    assert sizes.util_ladder(total, int(total / 16)) == []  # nothing left for vLLM: nothing to try


def test_floor_counts_one_generation_per_two_optimizer_steps_in_both_sizes():
    machine = {"hbm_bytes_per_s": 4e12, "bf16_flop_per_s": 8e14}
    for size in ("small", "large"):
        config = sizes.SIZES[size]
        seconds = floor.floor_seconds(machine, 10**9, config)
        completions = config["per_device_train_batch_size"] * config["gradient_accumulation_steps"]
        assert completions == config["prompts_per_step"] * config["num_generations"]
        assert seconds["decode_s"] == pytest.approx(10**9 * 2 * 64 / 2 / 4e12)
        assert seconds["train_s"] == pytest.approx(6 * 10**9 * completions * (40 + 64) / 8e14)


def test_each_trainer_gets_its_users_deepspeed_file_unless_named():
    assert contenders.deepspeed_choice("trl-sleep") == "plain"
    assert contenders.deepspeed_choice("ours-auto-offload") == "product"
    assert contenders.deepspeed_choice("trl-sleep@product") == "product"
    assert contenders.deepspeed_choice("ours-auto@plain") == "plain"
    assert contenders.check_contender("trl-sleep@product") == "trl-sleep@product"
    for bad in ("trl-sleep@tuned", "trl-sleep-offload", "ours-sometimes"):
        with pytest.raises(argparse.ArgumentTypeError):
            contenders.check_contender(bad)


def test_product_deepspeed_file_is_the_operators_one_gpu_render():
    from colocgrpo_training.planner.zero3 import EVERY_PARAMETER

    zero = contenders.product_deepspeed()["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["stage3_param_persistence_threshold"] == EVERY_PARAMETER
    assert zero["memory_efficient_linear"] is False
    assert zero["offload_param"]["device"] == "none" and zero["offload_optimizer"]["device"] == "none"
    assert contenders.PLAIN_DEEPSPEED["zero_optimization"] == {"stage": 3}
    # An offloading contender gets the render of an offloading job: ZeRO-3's usual release.
    offloading = contenders.product_deepspeed(offload_trainer_state=True)["zero_optimization"]
    assert offloading["stage3_param_persistence_threshold"] < EVERY_PARAMETER
    assert contenders.deepspeed_file_key("ours-auto-offload") == "product-offload"
    assert contenders.deepspeed_file_key("ours-auto") == "product"
    assert contenders.deepspeed_file_key("trl-sleep") == "plain"


def test_several_processes_share_the_step_under_the_operators_render_for_their_shape():
    # Four GPUs, TP 2: the step's completions split over the processes, vLLM's TP size set for
    # both trainers, and the deepspeed.json the operator renders for a 4-GPU job.
    kwargs = contenders.grpo_kwargs(
        "trl-sleep", Path("/tmp/bench"), 2, cpu=True, num_processes=4, tensor_parallel_size=2
    )
    assert kwargs["per_device_train_batch_size"] * 4 == sizes.CONFIG["per_device_train_batch_size"]
    assert kwargs["vllm_tensor_parallel_size"] == 2 and kwargs["ddp_backend"] == "gloo"
    zero = contenders.product_deepspeed(gpus=4, tensor_parallel_size=2)["zero_optimization"]
    assert zero["stage3_param_persistence_threshold"] == 10 * 5120  # the multi-GPU render: parameters released
    parsed = run.parse_args(["--out", "/tmp/bench", "--num-processes", "4", "--tp", "2"])
    assert (parsed.num_processes, parsed.tp) == (4, 2)
    for bad in (["--num-processes", "4", "--tp", "3"], ["--num-processes", "3"]):
        with pytest.raises(SystemExit):
            run.parse_args(["--out", "/tmp/bench", *bad])


@pytest.mark.parametrize("name", sorted(model.SEED_SHAPES))
def test_the_seed_model_is_a_qwen2_decoder_of_the_counted_size(name, tiny_tokenizer):
    shape = model.SEED_SHAPES[name]
    config = model.seed_config(shape, tiny_tokenizer)
    assert config.model_type == "qwen2" and config.tie_word_embeddings is False
    assert config.eos_token_id == tiny_tokenizer.eos_token_id
    with torch.device("meta"):
        built = transformers.AutoModelForCausalLM.from_config(config)
    assert type(built).__name__ == "Qwen2ForCausalLM"
    assert model.qwen2_params(shape, vocab=len(tiny_tokenizer)) == sum(p.numel() for p in built.parameters())
    # vLLM's KV cache per token: keys and values of every KV head in every layer, bf16.
    layer = built.model.layers[0].self_attn
    assert model.kv_bytes_per_token(shape) == 2 * shape["num_hidden_layers"] * layer.k_proj.out_features * 2


def test_the_seed_size_takes_the_7b_decoder_on_an_h200_and_the_tiny_one_on_cpu():
    assert model.pick_seed_shape(int(139.8 * GIB)) == "7b"
    assert model.pick_seed_shape(None) == "tiny"
    with pytest.raises(SystemExit, match="does not fit"):
        model.pick_seed_shape(int(79.6 * GIB))
    state = model.qwen2_params(model.SEED_SHAPES["7b"]) * sizes.TRAINING_STATE_BYTES_PER_PARAM
    assert 0.7 * 139.8 * GIB < state < 0.85 * 139.8 * GIB  # training state and vLLM compete for the card


def test_the_bench_makes_the_seed_model_once(tmp_path, tiny_model_dir):
    folder = tmp_path / "seed"
    made = model.make_model("seed", folder, str(tiny_model_dir), cpu=True)
    assert (made["kind"], made["shape"], made["architecture"]) == ("seed", "tiny", "Qwen2ForCausalLM")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert sum(p.numel() for p in loaded.parameters()) == made["params"]
    assert transformers.AutoTokenizer.from_pretrained(folder).chat_template  # the prompts are chat-formatted
    (folder / "model.safetensors").unlink()  # kept: a second call finds the marker and makes nothing
    assert model.make_model("seed", folder, str(tiny_model_dir), cpu=True) == made


@pytest.mark.parametrize("tokens", [48, 49, 64, 100])
def test_exact_prompts_are_exactly_as_long_as_trl_tokenizes_them(tokens, tiny_tokenizer):
    rows = prompts.exact_rows(tiny_tokenizer, tokens, 6)
    assert len({r["prompt"][0]["content"] for r in rows}) == 6  # distinct questions, each padded
    for row in rows:
        ids = tiny_tokenizer.apply_chat_template(
            conversation=[row["prompt"]], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"][0]
        assert len(ids) == tokens
    with pytest.raises(ValueError, match="more than"):
        prompts.padded_content(tiny_tokenizer, "What is 1 + 1? Explain.", 5)
