"""What each rank of a launched multi-process trainer did, for tests/training/test_multirank.py.

Enabled in a trainer process by `COLOCGRPO_PROBE_DIR`: the CPU vLLM stand-in
(`support.cpu_vllm`) calls `engine_built()` when ColocatedVLLM builds its engine, and from
then on each rank appends JSON lines to `DIR/rank<R>.jsonl`:
- `build`: pid, TP size, the weights' full bytes and the cost model's priors;
- `generate`: the requests the engine got (its TP group's prompts and seeds) and the completions;
- `sleep`: each sleep the engine was put to, and `decision`: the controller's level and modeled costs;
- `push`: after every weight push, whether the engine's weights equal the trainer's weights
  gathered by DeepSpeed (`GatheredParameters`, independently of the push's own gather) bit for
  bit, their digest, how the ZeRO-3 partitions are laid out, and which decoder layers are checkpointed;
- `agree`: a rank's own measurement and the value all ranks agreed on;
- `no_grad_forward`: the rows of each log-prob forward the trainer ran without gradients (TRL's old log-probs);
- `log`: every set of values the trainer logged (`Trainer.log`).
Rank 0 also saves the first push's gathered weights (`first-push.pt`).

Faults and variants it injects, each for the ranks listed:
  COLOCGRPO_PROBE_WAKE1_SKEW="2,3:0.5"      the level-1 weight wake is 0.5 s slower there
  COLOCGRPO_PROBE_HIDE="2,3:checkpoint-9"   their listing of the checkpoint folder lacks checkpoint-9
  COLOCGRPO_PROBE_SIGTERM_AT_BUILD="3"      SIGTERM while the engine is built (before training starts)
  COLOCGRPO_PROBE_LOGPROB_SHIFT="0,1:on"    the engine's log-probs differ from its model's by a per-token amount
                                            (`LOGPROB_SHIFTS`), so vLLM's importance-sampling correction is far from 1
  COLOCGRPO_PROBE_OLD_LOGPS="0,1:forward"   the trainer forwards every row for its old log-probs, as TRL does
                                            (`ColocGRPOTrainer(defer_old_logps=False)`)
  COLOCGRPO_PROBE_STOP_AFTER="0,1:2"        the engine ends every completion there after 2 tokens (with EOS)
  COLOCGRPO_PROBE_NO_GRAD_TOKENS="0,1,2,3:64"  the trainer's tokens per no-grad forward (`no_grad_tokens`)
  COLOCGRPO_PROBE_RANK_ENV="3:NAME=VALUE"   NAME=VALUE in the environment of those ranks alone, set when the
                                            interpreter starts (the stand-in's `sitecustomize`); `;` separates
                                            several such entries
  COLOCGRPO_PROBE_CWD="3:/some/folder"      the working directory of those ranks, set when the interpreter starts
                                            (a path under /proc/self/cwd then names another file there)
  COLOCGRPO_PROBE_LONG_PROMPT="2:300"       at the rank's first generate its first prompt is 300 tokens long (its
                                            own tokens repeated), before ColocatedVLLM sees it
  COLOCGRPO_PROBE_PINNED_ALLOC_FAILS="1"    the rank's first trainer-state offload fails as a pinned host
                                            allocation that CUDA refuses does
  COLOCGRPO_PROBE_KILL_IN_SAVE="1:checkpoint-2"  SIGKILL to the rank in the middle of saving checkpoint-2: after
                                            its model files, before its optimizer states and trainer_state.json
  COLOCGRPO_PROBE_GPU_MEMORY="0,1,2:80;3:0.01"  the memory of those ranks' GPU, in GiB, as the micro-batch merge
                                            reads it (`micro_batching.device_memory_gib`), set when the interpreter
                                            starts; `;` separates entries; `unreadable` makes reading it fail
Each injected fault first records a `fault` event with its wall-clock time.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any

DIR_ENV = "COLOCGRPO_PROBE_DIR"
WAKE1_SKEW_ENV = "COLOCGRPO_PROBE_WAKE1_SKEW"
HIDE_ENV = "COLOCGRPO_PROBE_HIDE"
SIGTERM_AT_BUILD_ENV = "COLOCGRPO_PROBE_SIGTERM_AT_BUILD"
LOGPROB_SHIFT_ENV = "COLOCGRPO_PROBE_LOGPROB_SHIFT"
OLD_LOGPS_ENV = "COLOCGRPO_PROBE_OLD_LOGPS"
STOP_AFTER_ENV = "COLOCGRPO_PROBE_STOP_AFTER"
NO_GRAD_TOKENS_ENV = "COLOCGRPO_PROBE_NO_GRAD_TOKENS"
RANK_ENV_ENV = "COLOCGRPO_PROBE_RANK_ENV"
CWD_ENV = "COLOCGRPO_PROBE_CWD"
LONG_PROMPT_ENV = "COLOCGRPO_PROBE_LONG_PROMPT"
PINNED_ALLOC_FAILS_ENV = "COLOCGRPO_PROBE_PINNED_ALLOC_FAILS"
KILL_IN_SAVE_ENV = "COLOCGRPO_PROBE_KILL_IN_SAVE"
GPU_MEMORY_ENV = "COLOCGRPO_PROBE_GPU_MEMORY"
# What torch reports when cudaHostAlloc refuses pinned host memory (the caching host allocator's CUDA check).
PINNED_ALLOC_ERROR = "CUDA error: out of memory (cudaHostAlloc: pinned host memory for the trainer state)"
# Added to the engine's log-prob of token t: LOGPROB_SHIFTS[t % 3].
LOGPROB_SHIFTS = (0.0, -0.4, 0.3)


def enabled() -> bool:
    return bool(os.environ.get(DIR_ENV))


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _for_this_rank(env: str) -> str | None:
    """The value after `ranks:` in `env` when this rank is listed, else None."""
    spec = os.environ.get(env, "")
    if not spec:
        return None
    ranks, _, value = spec.partition(":")
    return value if _rank() in {int(r) for r in ranks.split(",") if r} else None


def apply_rank_environment() -> None:
    """`RANK_ENV_ENV`'s variables, `CWD_ENV`'s folder and `GPU_MEMORY_ENV`'s GPU memory for this rank (a worker
    started by a launcher; the launcher has no RANK)."""
    if "RANK" not in os.environ:
        return
    for entry in filter(None, os.environ.get(RANK_ENV_ENV, "").split(";")):
        ranks, _, assignment = entry.partition(":")
        name, _, value = assignment.partition("=")
        if _rank() in {int(r) for r in ranks.split(",") if r}:
            os.environ[name] = value
    folder = _for_this_rank(CWD_ENV)
    if folder:
        os.chdir(folder)
    for entry in filter(None, os.environ.get(GPU_MEMORY_ENV, "").split(";")):
        ranks, _, value = entry.partition(":")
        if _rank() in {int(r) for r in ranks.split(",") if r}:
            from colocgrpo_training import micro_batching

            micro_batching.device_memory_gib = functools.partial(_gpu_memory, value)


def _gpu_memory(value: str) -> float:
    if value == "unreadable":
        raise RuntimeError("the probe made this GPU's memory unreadable")
    return float(value)


def weights_digest(named: list[tuple[str, Any]]) -> str:
    """A digest of (name, exact bytes) of every tensor, in name order."""
    h = hashlib.sha256()
    for name, tensor in sorted(named, key=lambda item: item[0]):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class Probe:
    def __init__(self) -> None:
        self.rank = _rank()
        self.path = Path(os.environ[DIR_ENV]) / f"rank{self.rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        skew = _for_this_rank(WAKE1_SKEW_ENV)
        self.wake1_skew_seconds = float(skew) if skew else 0.0
        self.logprobs_shifted = _for_this_rank(LOGPROB_SHIFT_ENV) is not None
        stop = _for_this_rank(STOP_AFTER_ENV)
        self.stop_after = int(stop) if stop else None
        self.pushes = 0
        self.long_prompt_sent = False

    def fault(self, what: str) -> None:
        """Record an injected fault and when it struck."""
        import time

        self.record("fault", what=what, time=time.time())

    def record(self, event: str, **fields: Any) -> None:
        with self.path.open("a") as out:
            out.write(json.dumps({"event": event, "rank": self.rank, **fields}) + "\n")

    # -- called by the stand-in engine ---------------------------------------------------
    def generated(self, prompts: list[list[int]], seeds: list[int | None], completions: list[list[int]]) -> None:
        self.record("generate", prompts=prompts, seeds=seeds, completions=completions)

    def slept(self, level: int) -> None:
        self.record("sleep", level=level)

    def logprob_shift(self, token: int) -> float:
        """What the engine adds to its log-prob of `token` (0 unless COLOCGRPO_PROBE_LOGPROB_SHIFT lists this rank)."""
        return LOGPROB_SHIFTS[token % len(LOGPROB_SHIFTS)] if self.logprobs_shifted else 0.0

    def stops_after(self, generated: int) -> bool:
        """The engine ends a completion of `generated` tokens here (COLOCGRPO_PROBE_STOP_AFTER)."""
        return self.stop_after is not None and generated >= self.stop_after

    # -- wrapped trainer code ------------------------------------------------------------
    def check_push(self, engine: Any) -> None:
        """The engine's weights against the trainer's, gathered here on every rank (a collective:
        every rank pushes at the same point, so every rank runs this at the same point)."""
        import deepspeed
        import torch

        named = list(engine.model.named_parameters())
        target = dict(engine._vllm_model().model.named_parameters())
        layouts = sorted({getattr(p, "ds_zero_partition_world_size", 0) for _, p in named})
        split = sum(1 for _, p in named if hasattr(p, "ds_tensor") and p.ds_tensor.numel() < p.ds_numel)
        with deepspeed.zero.GatheredParameters([p for _, p in named]):
            gathered = [(engine._fix_param_name_to_vllm(n), p.data) for n, p in named]
            equal = sorted(n for n, _ in gathered) == sorted(target) and all(
                torch.equal(t, target[n]) for n, t in gathered
            )
            digest = weights_digest(gathered)
            if self.pushes == 0 and self.rank == 0:
                torch.save({n: t.clone() for n, t in gathered}, self.path.parent / "first-push.pt")
        self.pushes += 1
        from colocgrpo_training.generation.checkpointing import layer_checkpointing

        self.record(
            "push",
            checkpointing=layer_checkpointing(engine.model),
            version=engine.weight_version(),
            equal=equal,
            digest=digest,
            partition_world_sizes=layouts,
            split_parameters=split,
            parameters=len(named),
        )


_PROBE: Probe | None = None


def engine_built() -> Probe:
    """Called by the stand-in's LLM(): install the probe once per process, inject the faults."""
    global _PROBE
    if _PROBE is None:
        _PROBE = Probe()
        _install(_PROBE)
        if _for_this_rank(SIGTERM_AT_BUILD_ENV) is not None:
            _PROBE.record("sigterm_at_build")
            signal.raise_signal(signal.SIGTERM)
    return _PROBE


def _install(probe: Probe) -> None:
    # Imported here: this runs while ColocatedVLLM builds its engine, when all of these exist.
    from colocgrpo_training import checkpoints
    from colocgrpo_training.generation.policy import SleepController
    from colocgrpo_training.generation.vllm_engine import ColocatedVLLM, full_nbytes

    initial_sleep = SleepController.initial_sleep

    @functools.wraps(initial_sleep)
    def recorded_initial_sleep(self, driver):
        probe.record(
            "build",
            pid=os.getpid(),
            tp=driver.tensor_parallel_size,
            weight_bytes=sum(full_nbytes(p) for p in driver.model.parameters()),
            priors={kind.value: seconds for kind, seconds in self.costs.seconds.items()},
        )
        return initial_sleep(self, driver)

    finish = SleepController.finish

    @functools.wraps(finish)
    def recorded_finish(self, driver, push_due, final=False):
        decision = finish(self, driver, push_due, final)
        probe.record(
            "decision",
            level=decision.level,
            push_due=push_due,
            final=final,
            cost_level1=decision.modeled_cost_level1,
            cost_level2=decision.modeled_cost_level2,
        )
        return decision

    push_weights = ColocatedVLLM.push_weights

    @functools.wraps(push_weights)
    def checked_push_weights(self):
        nbytes = push_weights(self)
        probe.check_push(self)
        return nbytes

    agree_max = ColocatedVLLM._agree_max

    @functools.wraps(agree_max)
    def recorded_agree_max(self, value):
        agreed = agree_max(self, value)
        probe.record("agree", local=value, agreed=agreed)
        return agreed

    SleepController.initial_sleep = recorded_initial_sleep
    SleepController.finish = recorded_finish
    ColocatedVLLM.push_weights = checked_push_weights
    ColocatedVLLM._agree_max = recorded_agree_max
    _install_trainer_records(probe)
    _install_faults(probe)

    hidden = _for_this_rank(HIDE_ENV)
    if hidden:
        listing = checkpoints.checkpoints_by_step

        @functools.wraps(listing)
        def lagging_listing(output_dir):
            return [(step, path) for step, path in listing(output_dir) if path.name not in hidden.split("+")]

        checkpoints.checkpoints_by_step = lagging_listing


def _install_trainer_records(probe: Probe) -> None:
    """Record the trainer's no-grad log-prob forwards and its logs; with OLD_LOGPS_ENV, TRL's own old log-probs."""
    import torch
    from transformers import Trainer
    from trl import GRPOTrainer

    from colocgrpo_training.generation import ColocGRPOTrainer

    logps = GRPOTrainer._get_per_token_logps_and_entropies

    @functools.wraps(logps)
    def counted_logps(self, model, input_ids, *args, **kwargs):
        if not torch.is_grad_enabled():
            rows, chunk = int(input_ids.size(0)), kwargs.get("batch_size") or int(input_ids.size(0))
            probe.record("no_grad_forward", rows=rows, tokens=int(input_ids.size(1)), forwards=-(-rows // chunk))
        return logps(self, model, input_ids, *args, **kwargs)

    no_grad_tokens = _for_this_rank(NO_GRAD_TOKENS_ENV)
    if no_grad_tokens is not None:
        ours = ColocGRPOTrainer._get_per_token_logps_and_entropies

        @functools.wraps(ours)
        def sized_logps(self, *args, **kwargs):
            self.no_grad_tokens = int(no_grad_tokens)
            return ours(self, *args, **kwargs)

        ColocGRPOTrainer._get_per_token_logps_and_entropies = sized_logps

    log = Trainer.log

    @functools.wraps(log)
    def recorded_log(self, logs, *args, **kwargs):
        probe.record("log", logs={k: float(v) for k, v in logs.items() if isinstance(v, int | float)})
        return log(self, logs, *args, **kwargs)

    GRPOTrainer._get_per_token_logps_and_entropies = counted_logps
    Trainer.log = recorded_log
    if _for_this_rank(OLD_LOGPS_ENV) == "forward":
        ColocGRPOTrainer._defers_old_logps = lambda self, generation_batch: False


def _install_faults(probe: Probe) -> None:
    """The faults `LONG_PROMPT_ENV`, `PINNED_ALLOC_FAILS_ENV` and `KILL_IN_SAVE_ENV` inject on this rank."""
    from transformers import Trainer

    from colocgrpo_training.generation.vllm_engine import ColocatedVLLM

    long_prompt = _for_this_rank(LONG_PROMPT_ENV)
    if long_prompt:
        generate = ColocatedVLLM.generate

        @functools.wraps(generate)
        def lengthened_generate(self, prompts, *args, **kwargs):
            if not probe.long_prompt_sent:
                probe.long_prompt_sent = True
                first = list(prompts[0])
                prompts = [(first * (1 + int(long_prompt) // len(first)))[: int(long_prompt)], *prompts[1:]]
                probe.fault(f"prompt 0 of {int(long_prompt)} tokens")
            return generate(self, prompts, *args, **kwargs)

        ColocatedVLLM.generate = lengthened_generate

    if _for_this_rank(PINNED_ALLOC_FAILS_ENV) is not None:

        def refused_offload(self):
            probe.fault("pinned allocation refused")
            raise RuntimeError(PINNED_ALLOC_ERROR)

        ColocatedVLLM._offload_trainer_state = refused_offload

    killed_in = _for_this_rank(KILL_IN_SAVE_ENV)
    if killed_in:
        save_optimizer = Trainer._save_optimizer_and_scheduler

        @functools.wraps(save_optimizer)
        def killed_save_optimizer(self, output_dir):
            if Path(output_dir).name == killed_in:
                probe.fault(f"SIGKILL while saving {killed_in}")
                os.kill(os.getpid(), signal.SIGKILL)
            return save_optimizer(self, output_dir)

        Trainer._save_optimizer_and_scheduler = killed_save_optimizer
