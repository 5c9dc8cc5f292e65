"""The memory plan: per-GPU peaks of the training and generation phases, a verdict and a recommendation.

A colocated process alternates two phases on one GPU:
- training: DeepSpeed model states + activations + the LM head's working set, next to whatever vLLM keeps
  (with sleep on: only its CUDA graphs and NCCL buffers; with sleep off: its whole reservation);
- generation: vLLM's whole reservation (gpu_memory_utilization x the WHOLE GPU) next to the trainer's
  model states, which stay on the GPU unless `vllm.offloadTrainerState` moves the optimizer out.
So sleep makes vLLM's reservation and the training activations non-additive, but never the model states.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from colocgrpo_training.config import SleepPolicy
from colocgrpo_training.planner import formulas as f
from colocgrpo_training.planner.inputs import PlanInputs
from colocgrpo_training.planner.merge import MicroBatchMerge
from colocgrpo_training.planner.zero3 import Zero3Knobs, zero3_knobs

GIB = f.GIB
# Below this much free memory per GPU a plan that "fits" is flagged as tight: allocator fragmentation and
# NCCL's lazily grown buffers routinely take a few GiB the formulas do not see.
TIGHT_HEADROOM_FRACTION = 0.05
# Block rounding and fragmentation slack on the KV cache the recommendation sizes for the full batch.
KV_SLACK = 1.05
MAX_RECOMMENDED_UTILIZATION = 0.95


@dataclasses.dataclass(frozen=True)
class Term:
    phase: str  # "training" | "generation" | "vllm"
    name: str
    bytes: int
    detail: str = ""

    @property
    def gib(self) -> float:
        return self.bytes / GIB


@dataclasses.dataclass
class MemoryPlan:
    """The planner's answer for one job; sizes in GiB per GPU, as `plan_job` documents."""

    fits: bool
    gpu_memory_gib: float
    per_gpu_training_gib: float  # training-phase peak, vLLM's leftovers included
    per_gpu_generation_gib: float  # generation-phase peak, trainer states included
    per_gpu_vllm_gib: float  # vLLM's reservation: gpu_memory_utilization x the whole GPU
    vllm_needed_gib: float  # what vLLM needs to hold the whole generation batch at once
    vllm_minimum_gib: float  # what vLLM needs to start at all (one max_model_len sequence)
    gpu_memory_utilization: float | None
    recommended_gpu_memory_utilization: float | None
    utilization_range: tuple[float, float] | None  # (lowest that starts, highest that leaves room for training)
    problems: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    assumptions: list[str] = dataclasses.field(default_factory=list)
    terms: list[Term] = dataclasses.field(default_factory=list)
    summary: str = ""
    inputs: PlanInputs | None = None
    # What vllm.offloadTrainerState moves to pinned host memory while vLLM generates, per GPU.
    trainer_state_offload_gib: float = 0.0
    # The training micro-batch the trainer would run (micro_batches.py), planned against this GPU; None: not planned.
    micro_batches: MicroBatchMerge | None = None
    # ZeRO-3's knobs the operator writes into deepspeed.json (zero3.py); None: not ZeRO-3.
    zero3: Zero3Knobs | None = None

    # -- presentation -------------------------------------------------------------------------------------

    def condition_message(self) -> str:
        """One paragraph for the PlanWarning condition's message."""
        parts = [self.summary]
        parts += self.problems
        parts += self.warnings
        return " ".join(p if p.endswith(".") else p + "." for p in parts if p)

    def lines(self) -> list[str]:
        out = [self.summary]
        if self.inputs is None:
            return out + [f"warning: {w}" for w in self.warnings]
        i = self.inputs
        out.append(f"model {i.model_name}: {i.parameter_count / 1e9:.2f}B parameters, shape from {i.shape.source}")
        out.append(
            f"{i.nodes} node(s) x {i.gpus_per_node} GPU(s) of {self.gpu_memory_gib:.1f} GiB; ZeRO-{i.zero_stage}"
            f"{' + optimizer offload' if i.offload_optimizer else ''}"
            f"{' + param offload' if i.offload_parameters else ''}"
            f"; vLLM TP {i.tensor_parallel_size}, sleep {i.sleep_policy}; micro-batch {i.per_device_train_batch_size}"
            f" x {i.sequence_tokens} tokens ({i.prompt_tokens} prompt + {i.completion_tokens} completion, "
            f"max model len {i.max_model_len})"
        )
        for phase, title, total in (
            ("training", "training phase, per GPU", self.per_gpu_training_gib),
            ("generation", "generation phase, per GPU", self.per_gpu_generation_gib),
            ("vllm", "inside vLLM's reservation", self.per_gpu_vllm_gib),
        ):
            out.append(f"{title}:")
            for term in self.terms:
                if term.phase == phase:
                    detail = f"  ({term.detail})" if term.detail else ""
                    out.append(f"  {term.name:<44} {term.gib:8.2f} GiB{detail}")
            out.append(f"  {'total':<44} {total:8.2f} GiB")
        if self.zero3 is not None:
            out += self.zero3.lines()
        if self.micro_batches is not None:
            out.append(self.micro_batches.message())
            for factor, peak in self.micro_batches.peaks_gib:
                out.append(f"  merged {factor} into 1: training peak {peak:.2f} GiB")
            recompute = self.micro_batches.recompute
            if recompute is not None:
                how = (
                    "no gradient checkpointing"
                    if recompute.off
                    else f"gradient checkpointing on {recompute.checkpointed_layers} of {recompute.num_layers} layers"
                )
                out.append(
                    f"  merged {self.micro_batches.factor} into 1, {how}: training peak {recompute.peak_gib:.2f} GiB"
                )
        if self.recommended_gpu_memory_utilization is not None and self.utilization_range:
            low, high = self.utilization_range
            out.append(
                f"recommended gpuMemoryUtilization: {self.recommended_gpu_memory_utilization:.2f} "
                f"(configured {self.gpu_memory_utilization:.2f}; workable {low:.2f}-{high:.2f})"
            )
        out += [f"problem: {p}" for p in self.problems]
        out += [f"warning: {w}" for w in self.warnings]
        out += [f"assumed: {a}" for a in self.assumptions]
        return out

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 3)

        return {
            "fits": self.fits,
            "summary": self.summary,
            "gpuMemoryGiB": r(self.gpu_memory_gib),
            "perGpuTrainingGiB": r(self.per_gpu_training_gib),
            "perGpuGenerationGiB": r(self.per_gpu_generation_gib),
            "perGpuVllmGiB": r(self.per_gpu_vllm_gib),
            "vllmNeededGiB": r(self.vllm_needed_gib),
            "vllmMinimumGiB": r(self.vllm_minimum_gib),
            "gpuMemoryUtilization": self.gpu_memory_utilization,
            "recommendedGpuMemoryUtilization": self.recommended_gpu_memory_utilization,
            "utilizationRange": list(self.utilization_range) if self.utilization_range else None,
            "trainerStateOffloadGiB": r(self.trainer_state_offload_gib),
            "microBatches": self.micro_batches.to_dict() if self.micro_batches is not None else None,
            "zero3": self.zero3.to_dict() if self.zero3 is not None else None,
            "parameterCount": self.inputs.parameter_count if self.inputs else None,
            "shapeSource": self.inputs.shape.source if self.inputs else None,
            "approximate": bool(self.inputs and self.inputs.shape.approximate),
            "terms": [{"phase": t.phase, "name": t.name, "GiB": r(t.gib), "detail": t.detail} for t in self.terms],
            "problems": self.problems,
            "warnings": self.warnings,
            "assumptions": self.assumptions,
        }


def _g(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _ceil2(x: float) -> float:
    return math.ceil(x * 100 - 1e-9) / 100


def _floor2(x: float) -> float:
    return math.floor(x * 100 + 1e-9) / 100


def cpu_job_plan() -> MemoryPlan:
    """gpusPerNode 0 runs no vLLM and no DeepSpeed: nothing to plan, whatever the model."""
    return MemoryPlan(
        fits=True,
        gpu_memory_gib=0.0,
        per_gpu_training_gib=0.0,
        per_gpu_generation_gib=0.0,
        per_gpu_vllm_gib=0.0,
        vllm_needed_gib=0.0,
        vllm_minimum_gib=0.0,
        gpu_memory_utilization=None,
        recommended_gpu_memory_utilization=None,
        utilization_range=None,
        summary="CPU job (gpusPerNode 0): no vLLM and no GPU memory to plan",
    )


def plan_inputs(i: PlanInputs) -> MemoryPlan:
    """The arithmetic. Every term is per GPU, in bytes, then reported in GiB."""
    if i.gpus_per_node == 0:
        return cpu_job_plan()
    s, a, tp = i.shape, i.dtype_bytes, i.tensor_parallel_size
    gpu = int(i.gpu_memory_gib * GIB)
    p, n = i.parameter_count, i.world_size

    states = f.model_states(p, s.largest_layer_parameters(), n, i.zero_stage, i.offload_optimizer, i.offload_parameters)
    resident = None
    knobs = None
    if i.zero_stage == 3:
        knobs = zero3_knobs(
            s, world_size=n, offload_parameters=i.offload_parameters, offload_trainer_state=i.offload_trainer_state
        )
        resident = f.zero3_resident(
            p, n, a, i.offload_optimizer, i.offload_parameters, knobs.bucket_elements(s.hidden_size)
        )
    # ZeRO-3 with the optimizer on the GPU: a backward fills the 16-bit gradient partitions, and the step makes
    # fp32 gradients one sub-group at a time once the activations are gone (formulas.zero3_step_bytes).
    gpu_step = resident is not None and not i.offload_optimizer
    gradients = resident.lp_grads if resident is not None and gpu_step else states.gradients
    reference = f.reference_model_bytes(p, n, i.zero_stage, i.offload_parameters, a) if i.beta > 0 else 0
    tokens = i.per_device_train_batch_size * i.sequence_tokens
    completion_tokens = i.per_device_train_batch_size * min(i.completion_tokens, i.sequence_tokens)
    activations = f.activation_bytes(s, tokens, a, i.checkpointed_layers, i.whole_layers_last)
    lm_head = f.fused_lm_head_bytes(s, completion_tokens, a)
    context = f.CUDA_CONTEXT_BYTES

    engine_seqs = i.generation_sequences
    kv_per_token = f.kv_cache_bytes_per_token(s, a, tp)
    weights = f.vllm_weight_bytes(p, a, tp)
    engine_activations = f.vllm_activation_bytes(s, a, tp, engine_seqs)
    residual = f.vllm_sleep_residual_bytes(tp)
    fixed = weights + engine_activations + residual
    kv_one = i.max_model_len * kv_per_token
    kv_batch = engine_seqs * i.sequence_tokens * kv_per_token
    vllm_minimum = fixed + kv_one
    vllm_needed = fixed + max(kv_one, kv_batch)
    budget = int(i.gpu_memory_utilization * gpu)
    sleeping = i.sleep_policy is not SleepPolicy.OFF

    stage = f"ZeRO-{i.zero_stage}"
    offload = " (optimizer offloaded to CPU)" if i.offload_optimizer else ""
    terms = [
        Term(
            "training",
            "parameters (16-bit)",
            states.parameters,
            f"{stage}: 2 B x {p / 1e9:.2f}B"
            + (f" / {n} GPUs" if i.zero_stage == 3 else "")
            + (" -> CPU" if i.offload_parameters else ""),
        ),
        Term(
            "training",
            "gradients",
            gradients,
            f"{stage}: 16-bit partitions; fp32 per sub-group at the step" if gpu_step else f"{stage}{offload}",
        ),
        Term(
            "training",
            "optimizer states (fp32 master + Adam m, v)",
            states.optimizer,
            f"12 B/param{' / ' + str(n) + ' GPUs' if i.zero_stage >= 1 else ''}{offload}",
        ),
    ]
    if states.gather_buffer:
        terms.append(
            Term(
                "training",
                "ZeRO-3 gather buffers",
                states.gather_buffer,
                f"4 B x largest layer {s.largest_layer_parameters() / 1e6:.0f}M params",
            )
        )
    if resident is not None:
        bucket = resident.contiguous_grad_buffer
        terms.append(
            Term(
                "training",
                "ZeRO-3 gradient bucket",
                bucket,
                f"reduce_bucket_size {bucket // a:,} x {a} B (ZeRO-3 knobs)",
            )
        )
    if reference:
        terms.append(Term("training", "reference model (beta > 0)", reference, "16-bit weights"))
    terms += [
        Term(
            "training",
            "activations",
            activations,
            f"{i.per_device_train_batch_size} x {i.sequence_tokens} tokens, {_checkpointing(i)}",
        ),
        Term(
            "training",
            "LM head (TRL fused log-probs)",
            lm_head,
            f"{completion_tokens} completion tokens; full logits would be "
            f"{_g(f.materialized_logits_bytes(s, completion_tokens))}",
        ),
    ]
    if gpu_step:
        step = f.zero3_step_bytes(p, s.largest_layer_parameters(), n, a)
        group = f.zero3_step_sub_group_elements(p, s.largest_layer_parameters(), n)
        terms.append(
            Term(
                "training",
                "ZeRO-3 step beyond the backward",
                max(0, step - activations - lm_head),
                f"a sub-group's gradients flattened and cast to fp32, {group / 1e6:.0f}M elements x {4 + a} B = "
                f"{_g(step)}, once activations and LM head ({_g(activations + lm_head)}) are freed",
            )
        )
    terms += [
        Term("training", "CUDA context + workspaces", context),
        Term(
            "training",
            "vLLM while asleep (CUDA graphs, NCCL)" if sleeping else "vLLM reservation (sleep off)",
            residual if sleeping else budget,
        ),
    ]
    training_peak = sum(t.bytes for t in terms if t.phase == "training")

    terms.append(
        Term(
            "generation",
            "vLLM reservation",
            budget,
            f"gpuMemoryUtilization {i.gpu_memory_utilization:.2f} x {i.gpu_memory_gib:.1f} GiB (the whole GPU)",
        )
    )
    trainer_kept, offloaded = generation_trainer_terms(i, states, resident, reference)
    terms += trainer_kept
    terms.append(Term("generation", "CUDA context + workspaces", context))
    kept_on_gpu = sum(t.bytes for t in trainer_kept)
    generation_peak = sum(t.bytes for t in terms if t.phase == "generation")
    kv_available = budget - fixed
    terms += [
        Term("vllm", "weights / TP", weights, f"{a} B x {p / 1e9:.2f}B / {tp}"),
        Term(
            "vllm",
            "activations + sampler (profiling peak)",
            engine_activations,
            f"{f.TRL_VLLM_MAX_NUM_BATCHED_TOKENS} batched tokens, {engine_seqs} seqs x vocab {s.vocab_size}",
        ),
        Term("vllm", "CUDA graphs + NCCL (kept while asleep)", residual),
        Term(
            "vllm",
            "KV cache for the whole batch",
            kv_batch,
            f"{engine_seqs} seqs x {i.sequence_tokens} tokens x {kv_per_token / 1024:.0f} KiB/token",
        ),
        Term(
            "vllm",
            "KV cache available in the reservation",
            max(0, kv_available),
            f"holds {max(0, kv_available) // max(1, i.sequence_tokens * kv_per_token)} of {engine_seqs} seqs",
        ),
    ]

    # Utilization bounds: vLLM must start (one max_model_len sequence) and the other phase must still fit.
    high_bytes = gpu - context - kept_on_gpu
    if not sleeping:
        high_bytes = min(high_bytes, gpu - (training_peak - budget))
    low = _ceil2(vllm_minimum / gpu)
    high = min(MAX_RECOMMENDED_UTILIZATION, _floor2(high_bytes / gpu))
    recommended = None
    if high >= low:
        recommended = min(high, max(low, _ceil2(vllm_needed * KV_SLACK / gpu)))

    problems: list[str] = []
    warnings = list(i.warnings)
    if budget < vllm_minimum:
        problems.append(
            f"vLLM does not fit in its reservation: gpuMemoryUtilization {i.gpu_memory_utilization:.2f} gives "
            f"{_g(budget)}, but weights/TP {_g(weights)} + activations {_g(engine_activations)} + CUDA graphs "
            f"{_g(residual)} + KV cache for one {i.max_model_len}-token sequence {_g(kv_one)} need "
            f"{_g(vllm_minimum)}: {_g(vllm_minimum - budget)} short"
            + (f"; use at least {low:.2f}" if recommended is not None else "; raise tensorParallelSize")
        )
    if training_peak > gpu:
        biggest = max((t for t in terms if t.phase == "training"), key=lambda t: t.bytes)
        problems.append(
            f"training phase needs {_g(training_peak)} per GPU of {i.gpu_memory_gib:.1f} GiB: "
            f"{_g(training_peak - gpu)} over; largest term: {biggest.name} {_g(biggest.bytes)}"
        )
    if generation_peak > gpu:
        problems.append(
            f"generation phase needs {_g(generation_peak)} per GPU of {i.gpu_memory_gib:.1f} GiB: "
            f"{_g(generation_peak - gpu)} over (vLLM reservation {_g(budget)} + trainer states "
            f"{_g(generation_peak - budget - context)} kept on the GPU)"
            + (
                f"; lower gpuMemoryUtilization to {high:.2f} or less"
                if high >= low
                else "; offload optimizer/parameters or add GPUs"
            )
        )
    if recommended is None and not problems:
        problems.append(f"no gpuMemoryUtilization works: vLLM needs {low:.2f} but the trainer leaves {high:.2f}")
    if not problems:
        if budget < vllm_needed:
            held = max(0, kv_available) // max(1, i.sequence_tokens * kv_per_token)
            warnings.append(
                f"vLLM's KV cache holds {held} of the {engine_seqs} sequences a generation needs at "
                f"{i.sequence_tokens} tokens; it will generate in waves (slower); gpuMemoryUtilization "
                f"{recommended:.2f} would hold them all"
            )
        peak = max(training_peak, generation_peak)
        if gpu - peak < TIGHT_HEADROOM_FRACTION * gpu:
            warnings.append(
                f"tight: the peak ({_g(peak)}) leaves {_g(gpu - peak)} of {i.gpu_memory_gib:.1f} GiB; "
                "fragmentation and NCCL buffers can take that"
            )

    assumptions = list(i.assumptions)
    if offloaded:
        assumptions.append(
            f"vllm.offloadTrainerState moves {_g(offloaded)} per GPU ({_g(offloaded * i.gpus_per_node)} per node) "
            "into pinned host memory while vLLM generates; DeepSpeed keeps those buffers for the whole run, so "
            "spec.resources.memory must hold them too"
        )
    fits = not problems
    verdict = "fits" if fits else "does NOT fit"
    summary = (
        f"{i.model_name} {verdict} on {i.gpu_memory_gib:.1f} GiB GPUs: training peak {_g(training_peak)}, "
        f"generation peak {_g(generation_peak)} per GPU"
    )
    return MemoryPlan(
        fits=fits,
        gpu_memory_gib=i.gpu_memory_gib,
        per_gpu_training_gib=training_peak / GIB,
        per_gpu_generation_gib=generation_peak / GIB,
        per_gpu_vllm_gib=budget / GIB,
        vllm_needed_gib=vllm_needed / GIB,
        vllm_minimum_gib=vllm_minimum / GIB,
        gpu_memory_utilization=i.gpu_memory_utilization,
        recommended_gpu_memory_utilization=recommended,
        utilization_range=(low, high) if recommended is not None else None,
        problems=problems,
        warnings=warnings,
        assumptions=assumptions,
        terms=terms,
        summary=summary,
        inputs=i,
        trainer_state_offload_gib=offloaded / GIB,
        zero3=knobs,
    )


def generation_trainer_terms(
    i: PlanInputs, states: f.ModelStates, resident: f.Zero3Resident | None, reference: int
) -> tuple[list[Term], int]:
    """The trainer's memory while vLLM generates. ZeRO-3: DeepSpeed's buffers between steps, less what
    `offload_states` moves with vllm.offloadTrainerState (the same rule as DeepSpeed 0.19, state by
    state: formulas.Zero3Resident). Other stages: DeepSpeed's estimate, all kept."""
    if resident is None:
        terms = [
            Term("generation", "trainer parameters + gradients kept on GPU", states.parameters + states.gradients),
            Term("generation", "trainer optimizer states kept on GPU", states.optimizer),
        ]
        return terms + ([Term("generation", "reference model (beta > 0)", reference)] if reference else []), 0
    moved = resident.moved_by_offload_states(i.offload_optimizer) if i.offload_trainer_state else {}

    def kept(*names: str) -> int:
        return sum(getattr(resident, name) - moved.get(name, 0) for name in names)

    why = "the rest moved to CPU by vllm.offloadTrainerState" if moved else "ZeRO-3 buffers between optimizer steps"
    out = [
        Term("generation", "trainer parameters + gradients kept on GPU", kept("lp_params", "lp_grads"), why),
        Term("generation", "trainer optimizer states kept on GPU", kept("hp_params", "optim_states"), why),
        Term("generation", "ZeRO-3 gradient bucket kept on GPU", kept("contiguous_grad_buffer"), why),
    ]
    if reference:  # a separate DeepSpeed engine without an optimizer: offload_states does not touch it
        out.append(Term("generation", "reference model (beta > 0)", reference, "16-bit weights, not offloaded"))
    return out, sum(moved.values())


def _checkpointing(i: PlanInputs) -> str:
    layers = i.shape.num_layers
    if i.checkpointed_layers == 0:
        return "no gradient checkpointing"
    if i.checkpointed_layers >= layers:
        return "gradient checkpointing"
    return f"gradient checkpointing on {i.checkpointed_layers} of {layers} layers"
