"""Per-GPU memory formulas, in bytes. Pure arithmetic; docs/planner.md derives each one.

Sources:
- DeepSpeed 0.19.8 `estimate_zero3_model_states_mem_needs` (deepspeed/runtime/zero/stage3.py) and
  `estimate_zero2_model_states_mem_needs` (stage_1_and_2.py) for model states;
- TRL 1.16 `add_fused_lm_head` / `ChunkedLogProbFunction` (trl/trainer/utils.py, trl/kernels/chunked_logprob.py)
  for the LM head: TRL 1.16 never materializes the [tokens, vocab] logits during training;
- TRL 1.16 `VLLMGeneration` (trl/generation/vllm_generation.py) and GRPOTrainer for the engine's arguments
  (max_num_seqs = per_device_train_batch_size x TP x steps_per_generation, max_num_batched_tokens = 4096);
- vLLM's KV cache layout: 2 (K and V) x layers x kv_heads x head_dim x dtype bytes per token.
"""

from __future__ import annotations

import dataclasses

from colocgrpo_training.planner.shapes import ModelShape

GIB = 1024**3

# torch's CUDA context, cuBLAS/cuDNN workspaces and NCCL's communicator setup in each training process.
# Not in any allocator statistic; 0.5-1 GiB on Hopper with CUDA 12/13 lazy module loading.
CUDA_CONTEXT_BYTES = int(0.75 * GIB)
# What vLLM's sleep (either level) leaves on the GPU: CUDA graphs and NCCL buffers. Measured on one H200
# (vllm 0.26, SmolLM2-135M, TP 1, utilization 0.3): the engine held 42 GiB and both levels freed ~41.
VLLM_SLEEP_RESIDUAL_BYTES = int(1.0 * GIB)
# Extra residual per engine with TP > 1: NCCL communicators and vLLM's custom all-reduce IPC buffers.
VLLM_TP_RESIDUAL_BYTES = int(0.5 * GIB)
# TRL 1.16 builds the colocated engine with max_num_batched_tokens=4096 (vllm_generation.py).
TRL_VLLM_MAX_NUM_BATCHED_TOKENS = 4096
# TRL 1.16 fused LM head tiles: TOKEN_CHUNK_SIZE tokens x _CHUNKED_LOGPROB_CHUNK_SIZE vocabulary columns.
TRL_LOGPROB_TOKEN_TILE = 4096
TRL_LOGPROB_VOCAB_TILE = 32768


@dataclasses.dataclass(frozen=True)
class ModelStates:
    """Per-GPU bytes of parameters, gradients and optimizer states (DeepSpeed's accounting)."""

    parameters: int  # 16-bit weights (partition or replica)
    gradients: int  # 16-bit and fp32 gradients
    optimizer: int  # fp32 master weights + Adam's two moments
    gather_buffer: int  # ZeRO-3 only: 4 x largest layer, DeepSpeed's `largest_layer_memory`

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.gather_buffer


def model_states(
    params: int,
    largest_layer_params: int,
    world_size: int,
    zero_stage: int,
    offload_optimizer: bool,
    offload_parameters: bool,
) -> ModelStates:
    """Bytes per GPU for bf16/fp16 mixed-precision Adam, split so that the totals equal DeepSpeed's own.

    DeepSpeed's estimators (bytes per GPU, P params, N GPUs, L the largest layer's params):
      ZeRO-3:                       4L + 18P/N     (18 = 2 params16 + 4 grads fp32 + 12 fp32 master/m/v)
      ZeRO-3 + offload optimizer:   4L + 2P/N      (only the 16-bit partition stays on the GPU)
      ZeRO-3 + offload opt + param: 4L
      ZeRO-2:                       2P + 18P/N     (2P replicated params16; 18 = 2 grads16 + 4 grads32 + 12)
      ZeRO-2 + offload optimizer:   2P
    DeepSpeed has no estimator for stages 1 and 0; by the same accounting (ZeRO paper, Rajbhandari et al.
    2020): ZeRO-1 replicates the 16-bit gradients as well, 4P + 16P/N; stage 0 replicates all, 20P.
    Offloading parameters exists only in ZeRO-3 (callers warn and ignore it otherwise).
    """
    p, n = params, max(1, world_size)
    if zero_stage == 3:
        gather = 4 * largest_layer_params
        if offload_optimizer and offload_parameters:
            return ModelStates(0, 0, 0, gather)
        if offload_optimizer:
            return ModelStates(2 * p // n, 0, 0, gather)
        return ModelStates(2 * p // n, 4 * p // n, 12 * p // n, gather)
    if zero_stage == 2:
        if offload_optimizer:
            return ModelStates(2 * p, 0, 0, 0)
        return ModelStates(2 * p, 6 * p // n, 12 * p // n, 0)
    if zero_stage == 1:
        if offload_optimizer:
            return ModelStates(2 * p, 0, 0, 0)
        return ModelStates(2 * p, 2 * p + 4 * p // n, 12 * p // n, 0)
    return ModelStates(2 * p, 6 * p, 12 * p, 0)


@dataclasses.dataclass(frozen=True)
class Zero3Resident:
    """What a ZeRO-3 engine holds on the GPU between optimizer steps, buffer by buffer, as DeepSpeed 0.19
    allocates them (deepspeed/runtime/zero/stage3.py) — the states `offload_states` names. Unlike the
    estimator's 18P/N (a training peak: the step also makes fp32 gradients of a sub-group), this is what
    sits there while vLLM generates."""

    lp_params: int  # lp_param_buffer: the 16-bit partitions
    lp_grads: int  # grad_partitions_flat_buffer: 16-bit gradient partitions (on the CPU with optimizer offload)
    hp_params: int  # fp32_partitioned_groups_flat: the fp32 master partitions
    optim_states: int  # the optimizer's exp_avg and exp_avg_sq (fp32)
    contiguous_grad_buffer: int  # the reduce bucket: reduce_bucket_size elements, 16-bit

    @property
    def total(self) -> int:
        return sum(dataclasses.astuple(self))

    def moved_by_offload_states(self, offload_optimizer: bool) -> dict[str, int]:
        """Bytes per state that `DeepSpeedEngine.offload_states()` (include=None) takes off the GPU.

        DeepSpeed 0.19: every state with its FusedAdam (the optimizer the operator renders for the offload);
        with the optimizer offloaded to the CPU `_refine_include_states` drops hp_params, optim_states and,
        in ZeRO-3, lp_grads (they are not on the GPU). Offloaded parameters it refuses (validation does too).
        """
        moved = dataclasses.asdict(self)
        if offload_optimizer:
            for state in ("hp_params", "optim_states", "lp_grads"):
                moved.pop(state)
        return moved


def zero3_resident(
    params: int,
    world_size: int,
    dtype_bytes: int,
    offload_optimizer: bool,
    offload_parameters: bool,
    bucket_elements: int,
) -> Zero3Resident:
    """Bytes per GPU of each ZeRO-3 buffer between optimizer steps (P/N per partition; DeepSpeed pads each
    parameter's partition to a multiple of N elements, at most N - 1 elements more per parameter)."""
    p, n, a = params, max(1, world_size), dtype_bytes
    on_gpu_optimizer = not offload_optimizer
    return Zero3Resident(
        lp_params=0 if offload_parameters else a * p // n,
        lp_grads=a * p // n if on_gpu_optimizer else 0,
        hp_params=4 * p // n if on_gpu_optimizer else 0,
        optim_states=8 * p // n if on_gpu_optimizer else 0,
        contiguous_grad_buffer=a * bucket_elements,
    )


# DeepSpeed 0.19's `zero_optimization.sub_group_size` default (elements); the operator renders none.
DEEPSPEED_SUB_GROUP_ELEMENTS = 1_000_000_000


def zero3_step_sub_group_elements(params: int, largest_layer_params: int, world_size: int) -> int:
    """Elements of the largest optimizer sub-group on one GPU. DeepSpeed 0.19 (`_create_fp16_sub_groups`) fills a
    sub-group with whole parameter partitions until it holds `sub_group_size` elements, so it is at most that plus
    one partition of the largest parameter, and never more than the GPU's P/N."""
    n = max(1, world_size)
    return min(params // n, DEEPSPEED_SUB_GROUP_ELEMENTS + -(-largest_layer_params // n))


def zero3_step_bytes(params: int, largest_layer_params: int, world_size: int, dtype_bytes: int) -> int:
    """What a ZeRO-3 optimizer step on the GPU allocates beyond the buffers it keeps between steps.

    DeepSpeed 0.19 (`_prepare_fp32_grad_for_sub_group`, stage3.py) steps one sub-group at a time: it flattens the
    sub-group's 16-bit gradient partitions into a new buffer (a B per element), casts that to fp32 (4 B), runs
    the optimizer on it and frees both before the next sub-group. The step comes after the last backward, when the
    activations are freed: this working set and the backward's do not add up. (DeepSpeed's estimator counts 4P/N
    gradient bytes beside the activations instead: 2P/N more than the 16-bit partitions a backward fills.)
    """
    group = zero3_step_sub_group_elements(params, largest_layer_params, world_size)
    return (4 + dtype_bytes) * group


def reference_model_bytes(
    params: int, world_size: int, zero_stage: int, offload_parameters: bool, dtype_bytes: int
) -> int:
    """The frozen reference model TRL loads when beta > 0: 16-bit weights, partitioned under ZeRO-3."""
    if zero_stage == 3:
        return 0 if offload_parameters else dtype_bytes * params // max(1, world_size)
    return dtype_bytes * params


def activation_bytes_per_token_per_layer(shape: ModelShape, dtype_bytes: int) -> int:
    """Tensors autograd keeps for one decoder layer and one token (flash/SDPA attention: no seq^2 term).

    Counted per layer: two RMSNorms, each saving its fp32 upcast input (4h) and its 16-bit output (a*h);
    attention saving q, k, v after RoPE and its output (a*(2*q_size + 2*kv_size)); the SwiGLU MLP saving
    gate, up, silu(gate) and their product (4*a*i). This is Korthikanti et al. 2022 ("Reducing Activation
    Recomputation in Large Transformer Models", 34*h bytes per token per layer for GPT) redone for
    RMSNorm + GQA + SwiGLU without dropout.

    Calibrated on an H200 (torch 2.11, transformers 5.17, SDPA; bench/planner/calibrate_activations.py): the
    count above came out 8-14 % low for SmolLM2/Qwen2.5/Llama-3.2 shapes; the measured excess is
    2*a*q_size + h per token and layer (the attention output kept again in the layout o_proj reads, plus
    small tensors), which is added here. With it the estimates are within 5 % of the measurements.
    """
    a, h = dtype_bytes, shape.hidden_size
    norms = 2 * (4 * h + a * h)
    attention = a * (2 * shape.q_size + 2 * shape.kv_size)
    mlp = 4 * a * shape.intermediate_size
    measured_excess = 2 * a * shape.q_size + h
    return norms + attention + mlp + measured_excess


def checkpointed_layers(num_layers: int, every_n_layers: int) -> int:
    """How many decoder layers transformers checkpoints with `gradient_checkpointing_kwargs.every_n_layers`:
    layers 0, n, 2n, ... (`PreTrainedModel._set_gradient_checkpointing`), so ceil(layers / n)."""
    return len(range(0, num_layers, max(1, every_n_layers)))


def activation_bytes(
    shape: ModelShape, tokens: int, dtype_bytes: int, checkpointed: int, whole_layers_last: bool = True
) -> int:
    """Peak activation memory of one micro-batch of `tokens` tokens (batch x padded sequence length), with
    `checkpointed` of the decoder layers under gradient checkpointing (0: none, `shape.num_layers`: every one).

    A layer without checkpointing keeps its activations: tokens x per-layer bytes. With Hugging Face's
    per-decoder-layer checkpointing only a checkpointed layer's input survives the forward (tokens x a*h); the
    backward then recomputes one checkpointed layer at a time (tokens x per-layer bytes), holds the gradient flowing
    between layers (2 x tokens x a*h) and, inside the recomputed layer's backward, one MLP-wide gradient
    (tokens x a*i; measured, see above). Plus the final norm (tokens x (4+a)h).

    Some layers checkpointed: where the whole layers are the last ones (`whole_layers_last`, the trainer's pattern:
    generation/checkpointing.py), the backward frees them before the first recompute, so the peak is the larger of
    the two moments, all stored activations or the checkpointed inputs plus one recompute. Where they interleave
    (transformers' `every_n_layers`), a recompute can come while whole layers below are still held: both counted.
    """
    a, h = dtype_bytes, shape.hidden_size
    per_layer = activation_bytes_per_token_per_layer(shape, dtype_bytes)
    final_norm = tokens * (4 + a) * h
    checkpointed = max(0, min(checkpointed, shape.num_layers))
    kept_whole = (shape.num_layers - checkpointed) * tokens * per_layer
    if checkpointed == 0:
        return kept_whole + final_norm
    inputs = checkpointed * tokens * a * h
    recompute = tokens * per_layer + 2 * tokens * a * h + tokens * a * shape.intermediate_size
    held = max(kept_whole, recompute) if whole_layers_last else kept_whole + recompute
    return inputs + held + final_norm


def fused_lm_head_bytes(shape: ModelShape, completion_tokens: int, dtype_bytes: int) -> int:
    """TRL 1.16's chunked log-prob LM head (the training forward/backward), per micro-batch.

    TRL scores only completion positions, in tiles of 4096 tokens x 32768 vocabulary columns, so the
    [tokens, vocab] logits never exist. Its backward allocates an fp32 gradient for the LM-head weight
    (vocab x h x 4) and for the hidden states (tokens x h x 4), next to a compact copy of the hidden
    states (tokens x h x a) and one tile buffer (counted at fp32, the accumulation dtype).
    """
    tile = min(completion_tokens, TRL_LOGPROB_TOKEN_TILE) * min(shape.vocab_size, TRL_LOGPROB_VOCAB_TILE) * 4
    weight_grad = shape.vocab_size * shape.hidden_size * 4
    hidden = completion_tokens * shape.hidden_size * (4 + dtype_bytes)
    return tile + weight_grad + hidden


def materialized_logits_bytes(shape: ModelShape, completion_tokens: int) -> int:
    """What a plain `model(...).logits` path would hold (tokens x vocab in fp32): shown for comparison only,
    since it is what dominates small models with big vocabularies in trainers without a fused head."""
    return completion_tokens * shape.vocab_size * 4


def vllm_weight_bytes(params: int, dtype_bytes: int, tensor_parallel: int) -> int:
    """Weights per GPU: every matrix, the vocab-parallel embedding and LM head included, is split by TP."""
    return dtype_bytes * params // max(1, tensor_parallel)


def kv_cache_bytes_per_token(shape: ModelShape, kv_dtype_bytes: int, tensor_parallel: int) -> int:
    """2 (K, V) x layers x kv_heads per GPU x head_dim x dtype bytes; vLLM replicates KV heads when TP
    exceeds their number, so a GPU never holds less than one head."""
    tp = max(1, tensor_parallel)
    kv_heads_per_gpu = max(1, shape.num_kv_heads // tp)
    return 2 * shape.num_layers * kv_heads_per_gpu * shape.head_size * kv_dtype_bytes


def vllm_activation_bytes(
    shape: ModelShape,
    dtype_bytes: int,
    tensor_parallel: int,
    max_num_seqs: int,
    max_num_batched_tokens: int = TRL_VLLM_MAX_NUM_BATCHED_TOKENS,
) -> int:
    """vLLM's profiling peak outside weights and KV cache: one forward of max_num_batched_tokens tokens
    (hidden states plus this GPU's share of q/k/v and the SwiGLU intermediate) and the sampler's fp32
    logits and probabilities for max_num_seqs sequences over the full (gathered) vocabulary."""
    tp = max(1, tensor_parallel)
    per_token = dtype_bytes * (
        4 * shape.hidden_size + (shape.q_size + 2 * shape.kv_size) // tp + 3 * shape.intermediate_size // tp
    )
    sampler = max_num_seqs * shape.vocab_size * 8
    return max_num_batched_tokens * per_token + sampler


def vllm_sleep_residual_bytes(tensor_parallel: int) -> int:
    return VLLM_SLEEP_RESIDUAL_BYTES + (VLLM_TP_RESIDUAL_BYTES if tensor_parallel > 1 else 0)
