"""`ColocatedVLLM`: the colocated vLLM engine's whole life — build, bucketed weight push,
sleep/wake per the sleep policy, TP-group generation, optional trainer-state offload.

Built on TRL 1.16's `VLLMGeneration` (colocate mode only) and overrides three of its
methods: `_init_vllm` (our engine settings, TP groups from `tp_groups`, the policy
controller), `sync_weights` (TRL calls it when the global step changes; here it only
notes that the trainer moved on: pushing is the controller's decision at the next
generate) and `generate` (controller-driven wake/push/sleep, per-request seeds within a
TP group). Those three are every TRL method that sleeps or wakes the engine on its
`enable_sleep_mode`, so the controller is the one owner of the engine's state; the flag
only says whether vLLM is built with sleep mode.

torch and TRL are imported with this module; vLLM only when an engine is built.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Hashable
from contextlib import nullcontext
from typing import Any

import torch
from trl.extras.profiling import ProfilingContext
from trl.generation.vllm_generation import VLLMGeneration, empty_cache, extract_logprobs
from trl.trainer.utils import ensure_master_addr_port

from colocgrpo_training.agreement import agree_max, gather
from colocgrpo_training.config import SleepPolicy, VLLMSettings
from colocgrpo_training.data import DataError
from colocgrpo_training.generation.buckets import DEFAULT_BUCKET_BYTES, plan_buckets
from colocgrpo_training.generation.policy import CostModel, EngineState, SleepController
from colocgrpo_training.generation.schedules import NextGenerate
from colocgrpo_training.generation.tp_groups import (
    engine_seed,
    flatten_group,
    form_tp_groups,
    placement,
    request_seeds,
    slice_back,
)
from colocgrpo_training.grpo_args import ENGINE_ARGUMENTS, vllm_args, vllm_mismatches
from colocgrpo_training.verdict import AgreedError, stage

log = logging.getLogger("colocgrpo.generation")

# What `generate` returns, as TRL's `VLLMGeneration.generate`: per request of this rank,
# (prompt_ids, completion_ids, logprobs, logprob_token_ids); the last two are None when
# vLLM returned no log-probs.
GenerateResult = tuple[
    list[list[int]],
    list[list[int]],
    list[list[list[float | None]]] | None,
    list[list[list[int]]] | None,
]


def full_nbytes(param: torch.Tensor) -> int:
    """Bytes of the full (un-partitioned) parameter: ZeRO-3 partitions carry `ds_numel`."""
    numel = getattr(param, "ds_numel", None)
    if numel is None:
        numel = param.numel()
    return int(numel) * param.element_size()


def engine_kwargs(
    model: str | None,
    *,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    max_model_len: int | None,
    max_num_seqs: int | None,
    enable_sleep_mode: bool,
    enable_prefix_caching: bool,
    model_impl: str,
    seed: int,
    trust_remote_code: bool,
) -> dict[str, Any]:
    """The keyword arguments of the engine's `vllm.LLM(...)`: the settings given, and those every engine of ours
    has (vLLM in the calling process, TRL's batched-token floor, processed log-probs). `ColocatedVLLM` builds its
    engine from them, and so does `python -m bench.generate_profile`, so that the profile measures this engine."""
    return {
        "model": model,
        "tensor_parallel_size": tensor_parallel_size,
        "gpu_memory_utilization": gpu_memory_utilization,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        # Fixed for the engine's life: vLLM cannot switch sleep mode on after it is built.
        "enable_sleep_mode": enable_sleep_mode,
        "enable_prefix_caching": enable_prefix_caching,
        "model_impl": model_impl,
        "distributed_executor_backend": "external_launcher",
        "seed": seed,
        # As TRL: vLLM's profiler is misled by its large default.
        "max_num_batched_tokens": max(4096, max_model_len or 0),
        # Log-probs after temperature/logit processing, for TRL's importance-sampling correction.
        "logprobs_mode": "processed_logprobs",
        "trust_remote_code": trust_remote_code,
    }


def sampling_base(
    *,
    repetition_penalty: float,
    temperature: float,
    top_p: float,
    top_k: int,
    min_p: float | None,
    max_tokens: int,
    logprobs: int | None,
    generation_kwargs: dict[str, Any] | None,
) -> dict[str, Any]:
    """`SamplingParams`' keyword arguments for one generate, as TRL's colocate path writes them: one completion
    per prompt, TRL's sampling arguments (`min_p` None is 0), then `generation_kwargs` over them. Structured
    outputs and per-request seeds are `ColocatedVLLM.generate`'s to add.

    Unlike TRL, vLLM does not detokenize (`detokenize=False`) unless `generation_kwargs` asks for stop strings,
    which need the text, or sets `detokenize` itself: the trainer reads token ids and log-probs only (TRL decodes
    the completions itself), and vLLM's incremental detokenization took 30 % of a short generate's time on an H100
    (docs/benchmarks/gpu.md, "Where a short generate goes")."""
    base: dict[str, Any] = {
        "n": 1,
        "repetition_penalty": repetition_penalty,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": 0.0 if min_p is None else min_p,
        "max_tokens": max_tokens,
        "logprobs": logprobs,
    }
    base.update(generation_kwargs or {})
    base.setdefault("detokenize", bool(base.get("stop")))
    return base


class ColocatedVLLM(VLLMGeneration):
    """vLLM in the training process, under a sleep policy that never generates from stale weights.

    TRL's `VLLMGeneration` in colocate mode with one owner of the engine's state: a [`SleepController`]
    decides around every `generate` whether vLLM wakes, whether the trainer's weights are pushed, and how deep
    it sleeps afterwards (docs/sleep-policy.md). `ColocGRPOTrainer` builds it; tests and benchmarks may build it
    directly. Constructing it builds the vLLM engine (on every rank: a collective) and, unless the policy is
    `off`, puts it to sleep before the trainer sets up. What each policy costs per step:
    docs/benchmarks/gpu.md.

    Args:
        model ([`~transformers.PreTrainedModel`]):
            The trainer's model, whole or partitioned by DeepSpeed ZeRO-3. vLLM loads the checkpoint at
            `model.name_or_path`; the trainer's weights reach it through `push_weights`.
        accelerator ([`~accelerate.Accelerator`]):
            The trainer's accelerator: world size, this process's rank and device.
        processing_class ([`~transformers.PreTrainedTokenizerBase`] or [`~transformers.ProcessorMixin`]):
            Tokenizer or processor, as for TRL's `VLLMGeneration`.
        settings ([`VLLMSettings`]):
            The job's `spec.vllm` as the trainer config carries it: tensor-parallel size, GPU memory utilization,
            max model length, max sequences, prefix caching, sleep policy and trainer-state offload. TRL's
            arguments in `trl_kwargs` must agree with them.
        seed (`int`, *optional*, defaults to `0`):
            Base seed. The engine's seed is equal within a TP group; with TP > 1 each request also carries a seed
            derived from it, the group and the generate count (`tp_groups.request_seeds`).
        bucket_bytes (`int`, *optional*, defaults to `DEFAULT_BUCKET_BYTES`):
            Full-size parameter bytes per push bucket: one gather and one `load_weights` call per bucket.
        gpus_per_node (`int`, *optional*):
            GPUs per node, so that a TP group stays inside one node. Defaults to `$LOCAL_WORLD_SIZE`, else the
            world size.
        engine_holds_trainer_weights (`bool`, *optional*, defaults to `False`):
            Whether the checkpoint vLLM loads equals the trainer's weights at `weight_version()` (a fresh run, no
            resume): then the first generate pushes nothing. Otherwise the engine's record starts unknown, a
            level-2 sleep discards the loaded weights at once (unless the policy is `off`), and the first
            generate pushes.
        **trl_kwargs:
            TRL's other `VLLMGeneration` arguments: sampling (`temperature`, `top_p`, `top_k`, `min_p`,
            `repetition_penalty`, `max_completion_length`, `logprobs`, `generation_kwargs`,
            `structured_outputs_regex`), `model_impl`, `trust_remote_code`. Its vLLM settings (`mode`,
            `tensor_parallel_size`, `gpu_memory_utilization`, `max_model_length`, `enable_sleep_mode`) must be the
            ones `grpo_args.vllm_args` writes from `settings`; those left out are taken from there.

    Hooks the owner sets after construction:
        weight_version (`Callable[[], Hashable]`):
            The trainer's current weight version; `ColocGRPOTrainer` gives its optimizer-step count. Defaults to
            a constant 0.
        deepspeed_engine (`Callable[[], Any]`):
            The DeepSpeed engine whose state `settings.offload_trainer_state` moves to the CPU, or None.
        next_generate ([`NextGenerate`] or `None`):
            Set before each `generate`: whether an optimizer step (a push) comes before the next generate, and
            whether any generate follows. `auto` chooses its sleep level from it; None reads as "no push due".

    Raises:
        ValueError: a vLLM setting in `trl_kwargs` differs from the one `settings` gives.
        ImportError: vLLM is not installed (it is imported when the engine is built).
        TPLayoutError: `settings.tensor_parallel_size` does not divide the GPUs per node, or the world size is
            not a multiple of the GPUs per node.
    """

    # (vLLM names with parameters, their full sizes, buckets): planned at the first push.
    _push_plan: tuple[list[tuple[str, torch.Tensor]], list[tuple[str, int]], list[list[int]]] | None = None
    # Trainer-state offload: whether DeepSpeed's states are on the CPU now, whether the engine
    # was checked for it, and the forward hook that refuses parameter reads meanwhile.
    _trainer_state_offloaded = False
    _offload_checked = False
    _read_guard: Any = None

    def __init__(
        self,
        model: Any,
        accelerator: Any,
        processing_class: Any,
        *,
        settings: VLLMSettings,
        seed: int = 0,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        gpus_per_node: int | None = None,
        engine_holds_trainer_weights: bool = False,
        **trl_kwargs: Any,
    ) -> None:
        self.settings = settings
        self.sleep_policy = settings.sleep_policy
        self.seed = seed
        self.bucket_bytes = bucket_bytes
        self.gpus_per_node = gpus_per_node or _env_int("LOCAL_WORLD_SIZE")
        self._engine_holds_trainer_weights = engine_holds_trainer_weights
        self.weight_version: Callable[[], Hashable] = lambda: 0
        self.deepspeed_engine: Callable[[], Any] = lambda: None
        self.next_generate: NextGenerate | None = None
        self._generation_index = 0
        self.offload_seconds = 0.0
        self.generate_seconds = 0.0
        # Each vLLM setting TRL passes on is the one grpo_args.vllm_args wrote into GRPOConfig from `settings`:
        # checked here, never overwritten. A caller that passes none of them (tests, benchmarks) gets them
        # from the same writer.
        mismatches = vllm_mismatches(settings, trl_kwargs, engine=True)
        if mismatches:
            raise ValueError(f"TRL's engine arguments differ from the vLLM settings: {'; '.join(mismatches)}")
        for key, value in vllm_args(settings).items():
            if key in ENGINE_ARGUMENTS:
                trl_kwargs.setdefault(ENGINE_ARGUMENTS[key], value)
        # spec.vllm.maxNumSeqs, where set, replaces TRL's B x TP x S (as a cap on the engine's batch).
        if settings.max_num_seqs is not None:
            trl_kwargs["max_num_seqs"] = settings.max_num_seqs
        super().__init__(model, accelerator, processing_class, **trl_kwargs)

    # -- build ---------------------------------------------------------------------------
    def _init_vllm(self) -> None:
        from vllm import LLM  # lazy: only GPU machines have vLLM

        acc = self.accelerator
        tp = self.tensor_parallel_size
        world = acc.num_processes
        groups = form_tp_groups(world, tp, self.gpus_per_node or world)
        self.tp_placement = placement(acc.process_index, world, tp, self.gpus_per_node or world)
        self.tp_group = None
        if tp > 1:
            self.tp_group, _ = torch.distributed.new_subgroups_by_enumeration(groups)
        # external_launcher: vLLM runs in this process and reads the launcher's variables.
        os.environ["RANK"] = str(acc.process_index)
        os.environ["LOCAL_RANK"] = str(acc.local_process_index)
        os.environ["WORLD_SIZE"] = str(world)
        ensure_master_addr_port()

        start = time.perf_counter()
        self.llm = LLM(
            **engine_kwargs(
                self.model.name_or_path,
                tensor_parallel_size=tp,
                gpu_memory_utilization=self.gpu_memory_utilization,
                max_model_len=self.max_model_length,
                max_num_seqs=self.max_num_seqs,
                enable_sleep_mode=self.enable_sleep_mode,
                enable_prefix_caching=self.settings.enable_prefix_caching,
                model_impl=self.model_impl,
                # Building the engine reseeds the process: equal within a TP group.
                seed=engine_seed(self.seed, acc.process_index, tp),
                trust_remote_code=self.trust_remote_code,
            )
        )
        log.info(
            "vLLM engine built in %.1fs (policy %s, tp %d)", time.perf_counter() - start, self.sleep_policy.value, tp
        )

        weight_bytes = sum(full_nbytes(p) for p in self.model.parameters())
        self.controller = SleepController(
            self.sleep_policy,
            CostModel.from_weight_bytes(weight_bytes, tp),
            # The engine loaded the base checkpoint: the trainer's version only when the
            # owner vouches for it (fresh model, no resume); otherwise unknown → push.
            state=EngineState(held_version=self.weight_version() if self._engine_holds_trainer_weights else None),
            agree=self._agree_max,
        )
        self.controller.initial_sleep(self)
        acc.wait_for_everyone()

    # -- EngineDriver protocol (called by the controller, in its order) --------------------
    def wake_weights(self) -> None:
        """Map vLLM's weights back onto the GPU (`wake_up(tags=["weights"])`). After a level-2 sleep
        their content is garbage until the controller's push."""
        empty_cache()  # TRL: avoids OOM when re-mapping the weights
        self.llm.wake_up(tags=["weights"])

    def wake_kv_cache(self) -> None:
        """Offload the trainer state first (with `settings.offload_trainer_state`), then allocate vLLM's KV
        cache and drop every cached prefix (the cache was discarded while asleep).

        Raises:
            TrainerStateOffloadError: the DeepSpeed engine cannot move its state (checked at the first
                offload); the message names the spec field.
        """
        with stage(f"offloading the trainer state at step {self.weight_version()}"):
            self._offload_trainer_state()
        self.llm.wake_up(tags=["kv_cache"])
        # The KV cache was discarded while asleep: no cached prefix may survive.
        self.llm.reset_prefix_cache()

    def sleep(self, level: int) -> None:
        """`LLM.sleep(level)`: 1 keeps the weights in pinned host memory, 2 discards them; both free the KV
        cache. Then reloads an offloaded trainer state onto the GPU."""
        self.llm.sleep(level=level)
        with stage(f"reloading the trainer state at step {self.weight_version()}"):
            self._reload_trainer_state()

    def push_weights(self) -> int:
        """Load all of the trainer's weights into vLLM, bucketed: one gather and one `load_weights` call per
        bucket (a parameter this rank already holds whole goes in without a gather). A collective under
        ZeRO-3: every rank calls it. PEFT and FSDP are refused by the API, so no other layout reaches this.

        Returns:
            `int`: the bytes pushed, counted at full (unpartitioned) parameter size.

        Raises:
            TrainerStateOffloadedError: the trainer state is offloaded to the CPU right now.
        """
        if self._trainer_state_offloaded:
            raise TrainerStateOffloadedError("the weight push read the trainer's parameters while they were offloaded")
        nbytes = self._push_bucketed()
        # KV entries computed with the previous weights must not be reused.
        self.llm.reset_prefix_cache()
        return nbytes

    def _push_bucketed(self) -> int:
        if self._push_plan is None:
            # Names, sizes and buckets never change over a run: plan them once.
            named = [(self._fix_param_name_to_vllm(n), p) for n, p in self.model.named_parameters()]
            sizes = [(n, full_nbytes(p)) for n, p in named]
            self._push_plan = (named, sizes, plan_buckets(sizes, self.bucket_bytes))
        named, sizes, buckets = self._push_plan
        vllm_model = self._vllm_model()
        total = 0
        view = not force_gather()
        for bucket in buckets:
            # Where this rank already holds a parameter whole (one-way ZeRO-3 partitions, or
            # no ZeRO-3 at all), hand vLLM that storage: an all-gather would only copy it.
            local = {i: whole_tensor_without_gather(named[i][1]) if view else None for i in bucket}
            to_gather = [named[i][1] for i in bucket if local[i] is None]
            with self._dist.gather_params(to_gather) if to_gather else nullcontext():
                vllm_model.load_weights(
                    [(named[i][0], named[i][1].data if local[i] is None else local[i]) for i in bucket]
                )
            total += sum(sizes[i][1] for i in bucket)
        return total

    def _vllm_model(self) -> Any:
        # In-process with external_launcher: the same path TRL 1.16 uses.
        return self.llm.llm_engine.model_executor.driver_worker.model_runner.model

    def set_policy(self, policy: SleepPolicy | str) -> None:
        """Switch the sleep policy at run time (tests and benchmarks: one engine per process).

        Wakes the engine with the current weights first, so the new controller's record starts true; the
        measured costs carry over. Then sleeps as the new policy does after a generate.

        Args:
            policy ([`SleepPolicy`] or `str`):
                `"off"`, `"level1"`, `"level2"` or `"auto"`.

        Raises:
            ValueError: `policy` is not a sleep policy, or it sleeps and the engine was built with the policy
                `off` (vLLM fixes sleep mode when it builds the engine).
        """
        policy = SleepPolicy(policy)
        # The build-time setting decides, not the current policy: an engine built with sleep
        # mode may switch to "off" and back.
        if policy is not SleepPolicy.OFF and not self.enable_sleep_mode:
            raise ValueError("the engine was built without sleep mode; build it with a sleeping policy")
        version = self.weight_version()
        self.controller.prepare(self, version)
        if policy is SleepPolicy.OFF:
            self._reload_trainer_state()  # an engine that never sleeps would never bring it back
        self.controller = SleepController(
            policy, self.controller.costs, state=EngineState(held_version=version), agree=self._agree_max
        )
        self.sleep_policy = policy
        self.controller.initial_sleep(self)

    # -- TRL's entry points --------------------------------------------------------------
    def sync_weights(self) -> None:
        """TRL calls this when the global step changed. Nothing moves here: the push happens at the next
        `generate` if and when the controller's record says the engine lacks the trainer's weights."""
        log.debug("sync_weights: deferred to the next generate (policy %s)", self.sleep_policy.value)

    def generate(
        self,
        prompts: list[list[int]],
        images: list[list[Any] | None] | None,
        num_generations: int,
        profiler: ProfilingContext | None = None,
    ) -> GenerateResult:
        """Generate one completion per prompt from the trainer's current weights, as TRL's colocate mode.

        First the controller makes the engine ready (wake, push if the engine's weights are not those of
        `weight_version()`, KV cache) and checks the invariant; after the generate it puts the engine to sleep as
        the policy and `next_generate` say. With TP > 1 the ranks of a group gather their prompts, generate them
        all with identical per-request seeds and keep their own slice.

        Args:
            prompts (`list[list[int]]`):
                Token ids, one list per prompt; TRL repeats each prompt `num_generations` times.
            images (`list[list | None]` or `None`):
                Per prompt, its images (PIL) or None; None when no prompt has images.
            num_generations (`int`):
                Completions per distinct prompt. Unused: vLLM samples one completion per entry of `prompts`.
            profiler (`ProfilingContext`, *optional*):
                Wraps the vLLM call (TRL's profiling).

        Returns:
            `tuple` of (prompt_ids, completion_ids, logprobs, logprob_token_ids), for this rank's prompts in order:

            - `prompt_ids`: `list[list[int]]` of shape `(len(prompts), prompt_len)`.
            - `completion_ids`: `list[list[int]]` of shape `(len(prompts), completion_len)`.
            - `logprobs`: `list[list[list[float | None]]]` of shape `(len(prompts), completion_len, num_logprobs)`,
              or None when vLLM returned no log-probs.
            - `logprob_token_ids`: `list[list[list[int]]]`, the same shape as `logprobs`.

            `num_logprobs` is 1 for TRL's `logprobs=0`, up to N+1 for `logprobs=N`, as in TRL.

        Raises:
            PromptTooLongError: a prompt of any rank leaves no room under vLLM's max model length (raised on every
                rank alike, before vLLM sees any prompt).
            StaleWeightsError: the engine would generate from weights other than the trainer's current ones (a
                bug; the check runs right before every generate).
            TrainerStateOffloadError: `settings.offload_trainer_state` and the DeepSpeed engine cannot move its
                state (checked at the first offload).
        """
        from vllm import SamplingParams

        self._refuse_prompts_over_the_limit(prompts)
        version = self.weight_version()
        self.controller.prepare(self, version)
        self.controller.check_ready(version)

        tp = self.tensor_parallel_size
        all_images: list[Any] | None
        if tp > 1:
            # Buffers that all_gather_object fills with each rank's object.
            sizes: list[Any] = [None] * tp
            torch.distributed.all_gather_object(sizes, len(prompts), group=self.tp_group)
            gathered: list[Any] = [None] * tp
            torch.distributed.all_gather_object(gathered, prompts, group=self.tp_group)
            all_prompts = flatten_group(gathered)
            local_images = images if images is not None else [None] * len(prompts)
            gathered_images: list[Any] = [None] * tp
            torch.distributed.all_gather_object(gathered_images, local_images, group=self.tp_group)
            all_images = flatten_group(gathered_images)
            if all(img is None for img in all_images):
                all_images = None
        else:
            sizes, all_prompts, all_images = [len(prompts)], prompts, images

        base = sampling_base(
            repetition_penalty=self.repetition_penalty,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            max_tokens=self.max_completion_length,
            logprobs=self.logprobs,
            generation_kwargs=self.generation_kwargs,
        )
        # As TRL's colocate path: the regex option wins over a structured_outputs dict.
        if self.structured_outputs_regex is not None or isinstance(base.get("structured_outputs"), dict):
            from vllm.sampling_params import StructuredOutputsParams

            if self.structured_outputs_regex is not None:
                base["structured_outputs"] = StructuredOutputsParams(regex=self.structured_outputs_regex)
            else:
                base["structured_outputs"] = StructuredOutputsParams(**base["structured_outputs"])
        if tp > 1:
            # Ranks of a group must sample identically; the process RNG differs per rank
            # (the trainer seeds per device), so every request carries the group's seed.
            seeds = request_seeds(self.seed, self.tp_placement.group_index, self._generation_index, len(all_prompts))
            sampling = [SamplingParams(**{**base, "seed": s}) for s in seeds]
        else:
            sampling = SamplingParams(**base)
        self._generation_index += 1

        if all_images is not None:
            vllm_prompts = []
            for ids, imgs in zip(all_prompts, all_images, strict=True):
                row: dict[str, Any] = {"prompt_token_ids": ids}
                if imgs is not None:
                    row["multi_modal_data"] = {"image": imgs if len(imgs) > 1 else imgs[0]}
                vllm_prompts.append(row)
        else:
            vllm_prompts = [{"prompt_token_ids": ids} for ids in all_prompts]

        start = time.perf_counter()
        with profiler or nullcontext():
            outputs = self.llm.generate(vllm_prompts, sampling_params=sampling, use_tqdm=False)
        self.generate_seconds += time.perf_counter() - start

        prompt_ids = [o.prompt_token_ids for o in outputs]
        completion_ids = [list(c.token_ids) for o in outputs for c in o.outputs]
        logprobs, logprob_token_ids = extract_logprobs(outputs)
        if tp > 1:
            r = self.tp_placement.rank_in_group
            prompt_ids = slice_back(prompt_ids, sizes, r)
            completion_ids = slice_back(completion_ids, sizes, r)
            logprobs = slice_back(logprobs, sizes, r) if logprobs is not None else None
            logprob_token_ids = slice_back(logprob_token_ids, sizes, r) if logprob_token_ids is not None else None

        nxt = self.next_generate or NextGenerate(push_due=False, final=False)
        self.controller.finish(self, nxt.push_due, final=nxt.final)
        return prompt_ids, completion_ids, logprobs, logprob_token_ids

    def _refuse_prompts_over_the_limit(self, prompts: list[list[int]]) -> None:
        """Every rank, before vLLM sees a prompt: the longest prompt of any rank (`agree_max`, a collective every
        rank runs at every generate) against vLLM's limit, the engine's max model length less the one token it must
        generate. Over it, every rank raises the same `PromptTooLongError` naming the prompts (all-gathered): vLLM
        would raise on the ranks of one TP group only, and the others would wait for them in the next collective."""
        limit = self.max_prompt_tokens()
        if limit is None:  # equal on every rank: the engines are built alike
            return
        longest = int(agree_max(float(max((len(p) for p in prompts), default=0))))
        if longest <= limit:
            return
        mine = [(i, len(p), self.processing_class.decode(p[-24:])) for i, p in enumerate(prompts) if len(p) > limit]
        over = [(rank, *row) for rank, rows in enumerate(gather(mine)) for row in rows]
        listed = "; ".join(f"rank {rank}'s prompt {i}, {n} tokens, ending {text!r}" for rank, i, n, text in over[:4])
        raise PromptTooLongError(
            f"{len(over)} prompt(s) longer than the {limit} tokens vLLM takes (its max model length "
            f"{limit + 1}, vllm.maxModelLen, less one token to generate): {listed}. Set dataset.maxPromptTokens to "
            f"at most {limit} to truncate prompts, or raise vllm.maxModelLen"
        )

    def max_prompt_tokens(self) -> int | None:
        """The most prompt tokens vLLM accepts: its max model length less one (None: not known)."""
        engine_config = getattr(getattr(self.llm, "llm_engine", None), "model_config", None)
        length = getattr(engine_config, "max_model_len", None) or self.max_model_length
        return None if length is None else int(length) - 1

    # -- trainer-state offload -------------------------------------------------------------
    def _offload_trainer_state(self) -> None:
        if not self.settings.offload_trainer_state or self._trainer_state_offloaded:
            return
        engine = self.deepspeed_engine()
        if not self._offload_checked:
            check_trainer_state_offload(engine)
            self._offload_checked = True
        start = time.perf_counter()
        # The push already ran; while vLLM holds the GPU these states wait in pinned CPU memory.
        # include=None: every state DeepSpeed can move for this engine (docs/sleep-policy.md).
        engine.offload_states(pin_memory=True, non_blocking=False)
        self._trainer_state_offloaded = True
        # While offloaded, DeepSpeed's partitions point at the wrong bytes of its CPU copy
        # (module order against optimizer-group order) until reload_states maps them back.
        self._read_guard = guard_parameter_reads(self.model)
        seconds = time.perf_counter() - start
        self.offload_seconds += seconds
        log.info("trainer state offloaded to CPU in %.4fs (%s)", seconds, sorted(s.value for s in offloaded(engine)))

    def _reload_trainer_state(self) -> None:
        if not self._trainer_state_offloaded:
            return
        engine = self.deepspeed_engine()
        start = time.perf_counter()
        engine.reload_states(non_blocking=False)
        self._trainer_state_offloaded = False
        if self._read_guard is not None:
            self._read_guard.remove()
            self._read_guard = None
        seconds = time.perf_counter() - start
        self.offload_seconds += seconds
        log.info("trainer state reloaded to GPU in %.4fs", seconds)

    # -- metrics ---------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """Counters and seconds for TRL's log, keyed `generation/<name>`: generates, pushes, bytes pushed,
        sleeps per level, wakes and push/wake/sleep seconds since the policy was last set (`set_policy`), and
        generate/offload seconds since the engine was built."""
        out = {f"generation/{k}": float(v) for k, v in self.controller.counters.as_dict().items()}
        out["generation/generate_seconds"] = self.generate_seconds
        out["generation/offload_seconds"] = self.offload_seconds
        return out

    def _agree_max(self, value: float) -> float:
        """Every rank must take the same sleep decisions (pushes are collectives): decide
        from the slowest rank's measurement."""
        return agree_max(value)


# Test-only: every parameter goes through the bucket's gather (`GatheredParameters` under ZeRO-3),
# so a one-GPU run exercises the path multi-GPU jobs take (tests/gpu/drivers/run_on_device.sh).
FORCE_GATHER_ENV = "COLOCGRPO_PUSH_FORCE_GATHER"


def force_gather() -> bool:
    return os.environ.get(FORCE_GATHER_ENV) == "1"


def whole_tensor_without_gather(param: torch.Tensor) -> torch.Tensor | None:
    """The parameter's full tensor if this rank already holds it on the GPU, else None.

    A ZeRO-3 parameter whose partition group has one member (one-GPU jobs, or every rank
    holding a replica) keeps the whole flat tensor in `ds_tensor` — the storage the
    optimizer writes — so a view of it is the current weight: `GatheredParameters` would
    allocate and copy the same bytes. Partitions offloaded to CPU/NVMe, or split over
    several ranks, return None and go through the gather.
    """
    part = getattr(param, "ds_tensor", None)
    if part is None:
        # Not partitioned (no ZeRO-3): the parameter is whole. A ZeRO-3 parameter between
        # partitioning steps also has ds_numel and an empty ds_tensor: never take its .data.
        return None if hasattr(param, "ds_numel") else param.data
    zero3: Any = param  # ZeRO-3 set ds_tensor, so ds_numel and ds_shape are there too
    world = getattr(param, "ds_zero_partition_world_size", None)
    if world != 1 or part.device.type != "cuda" or part.numel() < zero3.ds_numel:
        return None
    if getattr(part, "final_location", None) is not None:  # NVMe-backed: the buffer may be released
        return None
    return part.data.narrow(0, 0, zero3.ds_numel).view(zero3.ds_shape)


class PromptTooLongError(DataError, AgreedError):
    """Prompts longer than vLLM's limit; raised on every rank alike, naming each rank's prompts."""


class TrainerStateOffloadError(RuntimeError):
    """`offload_trainer_state` asks for what this DeepSpeed engine cannot move."""


class TrainerStateOffloadedError(RuntimeError):
    """Something read the trainer's parameters between `offload_states` and `reload_states`."""


def check_trainer_state_offload(engine: Any) -> None:
    """Raise `TrainerStateOffloadError` unless DeepSpeed 0.19's `offload_states` can move this
    engine's state: ZeRO-3, parameters on the GPU, and an optimizer that is either DeepSpeed's
    FusedAdam (the `optimizer` block the operator renders) or offloaded to the CPU already. The
    operator refuses the same specs (api/validation.py); this catches a hand-made deepspeed.json."""
    field = "offload_trainer_state (spec.vllm.offloadTrainerState)"
    if engine is None:
        raise TrainerStateOffloadError(f"{field} needs a DeepSpeed engine; this trainer runs without DeepSpeed")
    stage = engine.zero_optimization_stage()
    if stage != 3:
        raise TrainerStateOffloadError(
            f"{field} needs ZeRO stage 3 (spec.deepspeed.zeroStage), this engine runs stage {stage}"
        )
    param_offload = engine.zero_offload_param()
    if param_offload is not None and getattr(param_offload.device, "value", param_offload.device) != "none":
        raise TrainerStateOffloadError(
            f"{field} cannot be combined with parameter offload (spec.deepspeed.offloadParams): DeepSpeed "
            "refuses to move the states of offloaded parameters"
        )
    optimizer = getattr(engine, "optimizer", None)
    if optimizer is None or not hasattr(optimizer, "offload_states"):
        raise TrainerStateOffloadError(
            f"{field} needs a ZeRO-3 optimizer; this engine has {type(optimizer).__name__}, which cannot move states"
        )
    if not engine.zero_use_cpu_optimizer():
        from deepspeed.ops.adam.fused_adam import FusedAdam

        inner = getattr(optimizer, "optimizer", None)
        if inner.__class__ is not FusedAdam:
            raise TrainerStateOffloadError(
                f'{field} needs DeepSpeed\'s own AdamW (the "optimizer" block the operator renders into '
                f"deepspeed.json): DeepSpeed 0.19 moves Adam moments and fp32 master weights only for its "
                f"FusedAdam, and this engine trains with {type(inner).__name__}"
            )


def offloaded(engine: Any) -> set[Any]:
    """The states DeepSpeed reports as offloaded (`offloaded_states` of its ZeRO optimizer)."""
    return set(getattr(engine.optimizer, "offloaded_states", ()))


def guard_parameter_reads(module: Any) -> Any:
    """A forward pre-hook on the trainer model that raises while its state is offloaded: a
    forward then would compute with wrong weights (or fail on CPU tensors) instead of saying so.
    Returns the hook's handle; `.remove()` it after `reload_states`."""

    def refuse(*_: Any, **__: Any) -> None:
        raise TrainerStateOffloadedError(
            "the trainer model ran a forward pass between offload_states and reload_states "
            "(vllm.offloadTrainerState): its parameters were on the CPU, mapped in the wrong order"
        )

    return module.register_forward_pre_hook(refuse, prepend=True)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value and value.isdigit() else None
