"""The planner's arithmetic against hand-computed numbers (the arithmetic is in the comments)."""

from __future__ import annotations

import pytest

from colocgrpo_training.planner import BUILTIN_SHAPES, ModelShape
from colocgrpo_training.planner import formulas as f
from colocgrpo_training.planner.shapes import builtin_shape, shape_from_config
from support.tiny_llama import write_llama_config

QWEN_7B = ModelShape(**BUILTIN_SHAPES["qwen2.5-7b"])
QWEN_14B = ModelShape(**BUILTIN_SHAPES["qwen2.5-14b"])
SMOLLM2_135M = ModelShape(**BUILTIN_SHAPES["smollm2-135m"])


def test_qwen25_7b_parameter_count():
    # embedding 152064 x 3584 = 544,997,376, untied LM head the same: 1,089,994,752
    # one layer: q 3584*3584 + bias 3584 = 12,848,640; k, v 2 x (3584*512 + 512) = 3,671,040;
    #            o 3584*3584 = 12,845,056; MLP 3 x 3584 x 18944 = 203,685,888; 2 norms 7,168
    #            = 233,057,792; x 28 layers = 6,525,618,176
    # + final norm 3584 -> 7,615,616,512 (the model card says 7.61B)
    assert QWEN_7B.layer_parameters() == 233_057_792
    assert QWEN_7B.parameter_count() == 7_615_616_512


def test_qwen25_14b_and_smollm2_parameter_counts():
    # 14B: layer = 26,219,520 (q+bias) + 10,487,808 (k,v+bias) + 26,214,400 (o) + 212,336,640 (MLP) + 10,240
    #      = 275,268,608; x 48 = 13,212,893,184; + 2 x 778,567,680 (untied) + 5,120 = 14,770,033,664
    assert QWEN_14B.parameter_count() == 14_770_033_664
    # SmolLM2-135M: layer = 331,776 (q) + 221,184 (k,v) + 331,776 (o) + 2,654,208 (MLP) + 1,152 = 3,540,096;
    #      x 30 = 106,202,880; + tied embedding 49152 x 576 = 28,311,552; + 576 = 134,515,008
    assert SMOLLM2_135M.parameter_count() == 134_515_008


def test_zero3_7b_on_8_gpus_equals_deepspeed_estimate():
    # DeepSpeed estimate_zero3_model_states_mem_needs (no offload): 4 x largest_layer + 18 x P / GPUs
    # largest layer = the embedding, 544,997,376 params -> 4 x = 2,179,989,504 bytes
    # 18 x 7,615,616,512 / 8 = 17,135,137,152 bytes  (2 params16 + 4 grads + 12 fp32 master/m/v, per param)
    states = f.model_states(QWEN_7B.parameter_count(), QWEN_7B.largest_layer_parameters(), 8, 3, False, False)
    assert states.gather_buffer == 2_179_989_504
    assert states.parameters + states.gradients + states.optimizer == 17_135_137_152
    assert states.total == 19_315_126_656  # = 17.99 GiB per GPU
    assert states.optimizer == 12 * 7_615_616_512 // 8  # Adam: fp32 master + m + v, partitioned


def test_zero3_offload_rows_equal_deepspeed_estimate():
    p, largest = QWEN_7B.parameter_count(), QWEN_7B.largest_layer_parameters()
    # offload optimizer: 4 x largest + 2 x P / GPUs = 2,179,989,504 + 1,903,904,128
    assert f.model_states(p, largest, 8, 3, True, False).total == 2_179_989_504 + 1_903_904_128
    # offload optimizer and parameters: 4 x largest only
    assert f.model_states(p, largest, 8, 3, True, True).total == 2_179_989_504


def test_zero2_and_lower_stages():
    p = QWEN_7B.parameter_count()
    # DeepSpeed estimate_zero2_model_states_mem_needs: 2P + 18P/N, and 2P with optimizer offload
    assert f.model_states(p, 0, 8, 2, False, False).total == 2 * p + 6 * p // 8 + 12 * p // 8
    assert f.model_states(p, 0, 8, 2, True, False).total == 2 * p
    # ZeRO-1 replicates the 16-bit gradients too: 4P + 16P/N; stage 0: 20P
    assert f.model_states(p, 0, 8, 1, False, False).total == 4 * p + 4 * p // 8 + 12 * p // 8
    assert f.model_states(p, 0, 8, 0, False, False).total == 20 * p


def test_activation_bytes_hand_computed_for_smollm2():
    # per token per layer (a = 2 bytes, h = 576, q = 9*64 = 576, kv = 3*64 = 192, i = 1536):
    #   two RMSNorms 2 x (4*576 + 2*576) = 6,912; attention 2 x (2*576 + 2*192) = 3,072; MLP 4*2*1536 = 12,288;
    #   measured excess 2*2*576 + 576 = 2,880  -> 25,152 bytes
    assert f.activation_bytes_per_token_per_layer(SMOLLM2_135M, 2) == 25_152
    tokens = 8 * 1024
    # with checkpointing: 30 layers x tokens x 2*576 (layer inputs) + tokens x 25,152 (one recomputed layer)
    #   + 2 x tokens x 2*576 (gradients between layers) + tokens x 2*1536 (MLP-wide gradient in that layer's
    #   backward) + tokens x 6*576 (final norm) = 8192 x 68,544 = 561,512,448 bytes (0.52 GiB; H200: 0.50)
    expected = 30 * tokens * 1152 + tokens * 25_152 + 2 * tokens * 1152 + tokens * 3072 + tokens * 3456
    assert expected == 561_512_448
    assert f.activation_bytes(SMOLLM2_135M, tokens, 2, 30) == expected
    # without: every layer keeps everything (6.21e9 bytes = 5.78 GiB; measured 5.74 GiB)
    assert f.activation_bytes(SMOLLM2_135M, tokens, 2, 0) == 30 * tokens * 25_152 + tokens * 3456
    assert f.activation_bytes(SMOLLM2_135M, tokens, 2, 0) > 5 * f.activation_bytes(SMOLLM2_135M, tokens, 2, 30)
    # the first 10 checkpointed, the last 20 whole: their inputs, and the larger of the 20 whole layers (the backward
    # frees them first) and one recompute (tokens x (25,152 + 2 x 1152 + 3072))
    recompute = tokens * 25_152 + 2 * tokens * 1152 + tokens * 3072
    assert f.activation_bytes(SMOLLM2_135M, tokens, 2, 10) == 10 * tokens * 1152 + 20 * tokens * 25_152 + tokens * 3456
    # 29 of 30: one whole layer is less than a recompute, so the recompute sets the peak
    assert f.activation_bytes(SMOLLM2_135M, tokens, 2, 29) == 29 * tokens * 1152 + recompute + tokens * 3456
    # interleaved (transformers' every_n_layers): a recompute can come while whole layers below are held
    interleaved = f.activation_bytes(SMOLLM2_135M, tokens, 2, 10, whole_layers_last=False)
    assert interleaved == 10 * tokens * 1152 + 20 * tokens * 25_152 + recompute + tokens * 3456
    # every layer, or none: the same either way
    for k in (0, 30):
        assert f.activation_bytes(SMOLLM2_135M, tokens, 2, k, whole_layers_last=False) == f.activation_bytes(
            SMOLLM2_135M, tokens, 2, k
        )


def test_every_n_layers_checkpoints_layers_0_n_2n():
    # transformers' _set_gradient_checkpointing: layer_index % every_n_layers == 0
    assert [f.checkpointed_layers(32, n) for n in (1, 2, 3, 4, 32, 40)] == [32, 16, 11, 8, 1, 1]
    assert f.checkpointed_layers(30, 7) == len([i for i in range(30) if i % 7 == 0]) == 5


def test_zero3_step_makes_fp32_gradients_one_sub_group_at_a_time():
    # 7.18B on one GPU: sub-groups of DeepSpeed's 1e9 elements, one may overshoot by at most the largest
    # parameter (the 49152 x 4096 embedding, 201,326,592): 1,201,326,592 elements x (2 flattened + 4 fp32) bytes
    p, largest = 7_180_914_688, 49152 * 4096
    assert f.zero3_step_sub_group_elements(p, largest, 1) == 1_000_000_000 + largest
    assert f.zero3_step_bytes(p, largest, 1, 2) == 6 * (1_000_000_000 + largest)  # 6.7 GiB
    # over 2 GPUs the overshoot is one partition of that parameter; a GPU's share below 1e9 is one sub-group
    assert f.zero3_step_sub_group_elements(p, largest, 2) == 1_000_000_000 + largest // 2
    assert f.zero3_step_sub_group_elements(p, largest, 8) == p // 8


def test_kv_cache_per_token():
    # Qwen2.5-14B, TP 4: 2 (K,V) x 48 layers x (8 kv heads / 4) x 128 head_dim x 2 bytes = 49,152 bytes
    assert f.kv_cache_bytes_per_token(QWEN_14B, 2, 4) == 49_152
    # Qwen2.5-0.5B has 2 KV heads; at TP 4 each GPU still holds one (vLLM replicates): 2 x 24 x 1 x 64 x 2
    qwen_05b = ModelShape(**BUILTIN_SHAPES["qwen2.5-0.5b"])
    assert f.kv_cache_bytes_per_token(qwen_05b, 2, 4) == 6_144
    assert f.kv_cache_bytes_per_token(qwen_05b, 2, 1) == 2 * 24 * 2 * 64 * 2


def test_fused_lm_head_never_materializes_logits():
    # TRL 1.16: one fp32 tile of 4096 tokens x 32768 vocab + fp32 LM-head weight grad + hidden copies
    tokens = 16 * 1024
    head = f.fused_lm_head_bytes(QWEN_14B, tokens, 2)
    assert head == 4096 * 32768 * 4 + 152064 * 5120 * 4 + tokens * 5120 * 6
    # the materialized alternative would be tokens x vocab x 4 = 9.3 GiB
    assert f.materialized_logits_bytes(QWEN_14B, tokens) == tokens * 152064 * 4
    assert head < f.materialized_logits_bytes(QWEN_14B, tokens)


def test_vllm_weights_split_by_tp():
    # 2 bytes x 14,770,033,664 / 4 = 7,385,016,832 bytes (6.88 GiB)
    assert f.vllm_weight_bytes(QWEN_14B.parameter_count(), 2, 4) == 7_385_016_832


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("Qwen/Qwen2.5-14B-Instruct", "qwen2.5-14b"),
        ("Qwen/Qwen2.5-1.5B", "qwen2.5-1.5b"),
        ("/models/Qwen2.5-72B-Instruct/", "qwen2.5-72b"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.3-70b"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m"),
        ("/tmp/models/smollm2-135m-instruct", "smollm2-135m"),
    ],
)
def test_builtin_table_matches_names(name, key):
    shape = builtin_shape(name)
    assert shape is not None and key in shape.source


def test_builtin_table_rejects_near_misses():
    assert builtin_shape("Qwen/Qwen2.5-14Bx") is None
    assert builtin_shape("mistralai/Mistral-7B-v0.1") is None


def test_config_json_shape(tmp_path):
    config = write_llama_config(tmp_path, tie_word_embeddings=False, max_position_embeddings=2048)
    shape = shape_from_config(config)
    # SMALL_LLAMA_CONFIG: hidden 256, 4 layers, KV heads 64 wide, MLP 512, vocabulary 1000.
    # layer: q 256*256 + k,v 2*256*64 + o 256*256 + MLP 3*256*512 + norms 512 = 557,568
    # total: 4 x 557,568 + 2 x 1000*256 (untied) + 256 = 2,742,528
    assert shape.layer_parameters() == 557_568
    assert shape.parameter_count() == 2_742_528
    assert shape.max_position_embeddings == 2048 and not shape.qkv_bias
