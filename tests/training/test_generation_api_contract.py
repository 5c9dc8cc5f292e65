"""The library surface the generation wrapper (training/colocgrpo_training/generation/)
relies on, checked against the installed TRL, DeepSpeed and vLLM — the exact versions the
GPU machine runs (TRL 1.16, DeepSpeed 0.19.8, vLLM 0.26.0).

The GPU code cannot run here, so this pins what it calls: every keyword of our `LLM(...)`
call and our SamplingParams keys exist in vLLM, the in-process path TRL uses to reach the
model for `load_weights`, the sleep/wake/reset signatures, the TRL internals ColocGRPOTrainer
swaps or overrides, DeepSpeed's gather and offload signatures. TRL checks run wherever
the trainer tests run; DeepSpeed and vLLM checks only where those are importable (the CI
trainer venv has neither; a machine with the GPU wheel set has both — see
docs/gpu-proofs.md for the CPU recipe).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.trainer

pytest.importorskip("torch")
trl = pytest.importorskip("trl")

GENERATION = Path(__file__).resolve().parents[2] / "training" / "colocgrpo_training" / "generation"
ENGINE_SOURCE = (GENERATION / "vllm_engine.py").read_text()


def call_keywords(source: str, func_name: str) -> set[str]:
    """Keyword names of every call to `func_name` (a bare name or an attribute) in `source`."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name == func_name:
                names.update(k.arg for k in node.keywords if k.arg)
    return names


def our_engine_kwargs() -> dict:
    """What `_init_vllm` passes to `LLM(...)` (`engine_kwargs`), for a one-GPU engine."""
    from colocgrpo_training.generation.vllm_engine import engine_kwargs

    return engine_kwargs(
        "model",
        tensor_parallel_size=1,
        gpu_memory_utilization=0.5,
        max_model_len=512,
        max_num_seqs=128,
        enable_sleep_mode=True,
        enable_prefix_caching=True,
        model_impl="vllm",
        seed=0,
        trust_remote_code=False,
    )


def our_sampling_base(**generation_kwargs) -> dict:
    """What `generate` passes to `SamplingParams` (`sampling_base`) for TRL's defaults and `logprobs=0`."""
    from colocgrpo_training.generation.vllm_engine import sampling_base

    return sampling_base(
        repetition_penalty=1.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=None,
        max_tokens=64,
        logprobs=0,
        generation_kwargs=generation_kwargs,
    )


def params(fn) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(fn).parameters)


# ------------------------------------------------------------------------------- TRL 1.16
def test_trl_names_the_wrapper_imports_and_swaps():
    import trl.trainer.grpo_trainer as grpo_module
    from trl.generation import vllm_generation
    from trl.trainer import utils as trl_utils

    assert grpo_module.VLLMGeneration is vllm_generation.VLLMGeneration  # the name trainer.py swaps
    assert callable(vllm_generation.empty_cache) and callable(vllm_generation.extract_logprobs)
    assert callable(trl_utils.ensure_master_addr_port)


def test_grpo_trainer_builds_the_engine_with_keywords_our_class_accepts():
    import trl.trainer.grpo_trainer as grpo_module
    from trl.generation.vllm_generation import VLLMGeneration

    passed = call_keywords(inspect.getsource(grpo_module.GRPOTrainer.__init__), "VLLMGeneration")
    accepted = set(params(VLLMGeneration.__init__))
    assert passed and passed <= accepted, passed - accepted
    # ColocatedVLLM forwards these to TRL's __init__ (trl_kwargs.update in vllm_engine.py)
    ours = {"mode", "tensor_parallel_size", "gpu_memory_utilization", "max_model_length", "enable_sleep_mode"}
    assert ours <= accepted


def test_trl_engine_surface_we_override_and_read():
    from trl.generation.vllm_generation import VLLMGeneration

    for name in ("_init_vllm", "sync_weights", "generate", "_fix_param_name_to_vllm", "_iter_named_params"):
        assert callable(getattr(VLLMGeneration, name, None)), name
    assert list(params(VLLMGeneration.generate)) == ["self", "prompts", "images", "num_generations", "profiler"]
    # attributes our _init_vllm / generate read, all set by TRL's __init__ before _init_vllm
    init = inspect.getsource(VLLMGeneration.__init__)
    for attr in (
        "model",
        "accelerator",
        "_dist",
        "tensor_parallel_size",
        "gpu_memory_utilization",
        "max_model_length",
        "max_num_seqs",
        "model_impl",
        "trust_remote_code",
        "repetition_penalty",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "max_completion_length",
        "logprobs",
        "generation_kwargs",
        "structured_outputs_regex",
    ):
        assert f"self.{attr} =" in init, attr
    assert init.index("self._init_vllm()") > init.index("self.generation_kwargs =")


def test_grpo_trainer_calls_the_engine_as_our_generate_expects():
    import trl.trainer.grpo_trainer as grpo_module

    from colocgrpo_training.generation.vllm_engine import ColocatedVLLM

    source = inspect.getsource(grpo_module.GRPOTrainer._generate_single_turn)
    assert "self.vllm_generation.sync_weights()" in source
    assert call_keywords(source, "generate") >= {"prompts", "images", "num_generations", "profiler"}
    assert list(params(ColocatedVLLM.generate)) == ["self", "prompts", "images", "num_generations", "profiler"]
    # auto's prediction reads the micro-step counter and hooks these trainer methods
    assert "self._step = 0" in inspect.getsource(grpo_module.GRPOTrainer.__init__)
    for name in ("_prepare_inputs", "_load_from_checkpoint", "_load_best_model", "log"):
        assert callable(getattr(grpo_module.GRPOTrainer, name, None)), name


def test_grpo_config_fields_the_trainer_and_bench_set():
    from trl import GRPOConfig

    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    trainer_source = (GENERATION / "trainer.py").read_text()
    set_by_trainer = {
        node.attr
        for node in ast.walk(ast.parse(trainer_source))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "grpo_args"
    }
    assert set_by_trainer and set_by_trainer <= fields, set_by_trainer - fields
    bench = (Path(__file__).resolve().parents[2] / "bench" / "grpo" / "contenders.py").read_text()
    # The bench's GRPOConfig arguments are the dict its grpo_kwargs builds.
    kwargs_fn = next(
        n for n in ast.walk(ast.parse(bench)) if isinstance(n, ast.FunctionDef) and n.name == "grpo_kwargs"
    )
    used_by_bench = call_keywords(bench, "GRPOConfig") | call_keywords(ast.get_source_segment(bench, kwargs_fn), "dict")
    assert {"vllm_tensor_parallel_size", "per_device_train_batch_size", "ddp_backend"} <= used_by_bench
    assert used_by_bench and used_by_bench <= fields, used_by_bench - fields


def test_trl_internals_the_old_logprob_deferral_reads():
    """generation/trainer.py's reliance 5: TRL's generation, split and loss as the deferral uses them. The CPU
    test (test_old_logps.py) trains through them; this names what moved if a TRL upgrade breaks it."""
    from trl import GRPOTrainer
    from trl.models.utils import disable_gradient_checkpointing  # noqa: F401  (imported by the trainer)
    from trl.trainer.utils import nanmax, nanmin  # noqa: F401

    from colocgrpo_training.generation.old_logps import IS_MODES, METRIC_NAMES

    prepare = inspect.getsource(GRPOTrainer._prepare_inputs)
    assert "self._buffered_inputs = " in prepare and "split_tensor_dict" in prepare  # the split we post-process
    generate = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    # The generation's old log-probs are its first no-grad forward on self.model, before the reference model's.
    assert generate.index("old_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(") < generate.index(
        "ref_per_token_logps, _, _ = self._get_per_token_logps_and_entropies("
    )
    assert "self.model," in generate.split("old_per_token_logps, _, _ = ")[1][:200]
    for name in METRIC_NAMES:  # the metrics it logs over the placeholder, which the trainer takes back
        assert f'self._metrics[mode]["{name}"].append(' in generate, name
    for mode in IS_MODES:  # the modes old_logps.importance_sampling_ratio rewrites
        assert f'"{mode}"' in generate, mode
    loss = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'old_per_token_logps = inputs.get("old_per_token_logps")' in loss
    assert "per_token_logps.detach() if old_per_token_logps is None" in loss
    # The correction is read after the loss's forward, which sets it for a deferred micro-batch.
    assert loss.index("self._get_per_token_logps_and_entropies(") < loss.index('inputs["importance_sampling_ratio"]')


def test_trl_distributed_backend_gathers_lists():
    from trl.distributed import DistributedBackend

    assert list(params(DistributedBackend.gather_params)) == ["self", "params"]
    assert isinstance(DistributedBackend.is_fsdp, property) and isinstance(DistributedBackend.is_zero3, property)
    assert "GatheredParameters(params)" in inspect.getsource(DistributedBackend.gather_params)


# ------------------------------------------------------------------------------- DeepSpeed
def test_deepspeed_gather_and_offload_signatures():
    deepspeed = pytest.importorskip("deepspeed")
    from deepspeed.runtime.engine import DeepSpeedEngine

    gp = params(deepspeed.zero.GatheredParameters.__init__)
    assert list(gp)[:2] == ["self", "params"]
    assert "list(params)" in inspect.getsource(deepspeed.zero.GatheredParameters.__init__)  # lists are gathered at once
    off = params(DeepSpeedEngine.offload_states)
    assert {"include", "device", "pin_memory", "non_blocking"} <= set(off)
    assert off["include"].default is None  # None: every state is offloaded
    assert set(params(DeepSpeedEngine.reload_states)) == {"self", "non_blocking"}
    assert call_keywords(ENGINE_SOURCE, "offload_states") <= set(off)
    assert call_keywords(ENGINE_SOURCE, "reload_states") <= {"non_blocking"}
    # check_trainer_state_offload() and the rendered DeepSpeed AdamW: ZeRO-3 moves optimizer states and
    # fp32 masters only for FusedAdam; the engine refuses offloaded parameters; with the optimizer on the
    # CPU it drops master weights, moments and (ZeRO-3) gradients from the set. The planner's
    # Zero3Resident names the same five states.
    from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    from colocgrpo_training.planner.formulas import Zero3Resident

    stage3 = inspect.getsource(DeepSpeedZeroOptimizer_Stage3.offload_states)
    guard = "if needs_offload(OffloadStateTypeEnum.optim_states) or needs_offload(OffloadStateTypeEnum.hp_params):"
    assert guard in stage3 and "FusedAdam" in stage3
    engine_offload = inspect.getsource(DeepSpeedEngine.offload_states)
    assert "not supported for offloaded parameters" in engine_offload
    refine = inspect.getsource(DeepSpeedEngine._refine_include_states)
    assert "hp_params" in refine and "optim_states" in refine and "lp_grads" in refine
    assert {m.value for m in OffloadStateTypeEnum} == set(Zero3Resident.__dataclass_fields__)


def test_the_engine_is_built_from_engine_kwargs_and_samples_from_sampling_base():
    # The engine's keywords and sampling dict are pure functions, so that bench.generate_profile builds the same
    # engine and samples the same way; _init_vllm and generate use them and nothing beside them.
    assert call_keywords(ENGINE_SOURCE, "LLM") == set()  # only **engine_kwargs(...)
    assert re.search(r"\bLLM\(\s*\*\*engine_kwargs\(", ENGINE_SOURCE)
    assert "base = sampling_base(" in ENGINE_SOURCE
    kwargs = our_engine_kwargs()
    assert kwargs["distributed_executor_backend"] == "external_launcher"
    assert kwargs["logprobs_mode"] == "processed_logprobs"
    assert kwargs["max_num_batched_tokens"] == 4096 and kwargs["max_model_len"] == 512
    assert our_sampling_base() == {
        "n": 1,
        "repetition_penalty": 1.0,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "max_tokens": 64,
        "logprobs": 0,
        "detokenize": False,  # the trainer reads token ids and log-probs only
    }
    # generation_kwargs go over TRL's arguments, as in TRL's colocate path.
    assert our_sampling_base(ignore_eos=True, temperature=0.7)["temperature"] == 0.7
    # Stop strings need the text: vLLM detokenizes then, and so does a request that asks for it.
    assert our_sampling_base(stop=["</answer>"])["detokenize"] is True
    assert our_sampling_base(stop=[])["detokenize"] is False
    assert our_sampling_base(detokenize=True)["detokenize"] is True


# ------------------------------------------------------------------------------- vLLM 0.26
@pytest.fixture(scope="module")
def vllm():
    return pytest.importorskip("vllm", reason="vLLM not installed (CI); see docs/gpu-proofs.md for the CPU recipe")


def test_every_llm_keyword_we_pass_exists(vllm):
    from vllm.engine.arg_utils import EngineArgs

    ours = set(our_engine_kwargs())
    explicit = set(params(vllm.LLM.__init__))
    engine_args = {f.name for f in dataclasses.fields(EngineArgs)}
    assert {"distributed_executor_backend", "enable_sleep_mode", "logprobs_mode", "seed"} <= ours
    assert ours <= explicit | engine_args, ours - explicit - engine_args
    from vllm.v1.executor import abstract

    assert 'distributed_executor_backend == "external_launcher"' in inspect.getsource(abstract)


def test_sampling_params_take_our_keys_and_a_per_request_seed(vllm):
    keys = set(our_sampling_base(ignore_eos=True))
    fields = set(params(vllm.SamplingParams))
    assert keys <= fields, keys - fields
    sp = vllm.SamplingParams(n=1, temperature=0.0, max_tokens=4, logprobs=0, ignore_eos=True, seed=(1 << 63) - 1)
    assert sp.seed == (1 << 63) - 1 and sp.ignore_eos
    from vllm.sampling_params import StructuredOutputsParams

    assert "regex" in params(StructuredOutputsParams)


def test_sleep_wake_generate_reset_signatures(vllm):
    LLM = vllm.LLM
    assert params(LLM.sleep)["level"].default == 1
    assert "tags" in params(LLM.wake_up)
    gen = params(LLM.generate)
    assert {"prompts", "sampling_params", "use_tqdm"} <= set(gen)
    reset = params(LLM.reset_prefix_cache)
    assert all(p.default is not inspect.Parameter.empty for n, p in reset.items() if n != "self")
    assert "collective_rpc" in dir(LLM)


def test_in_process_path_to_the_model_for_load_weights(vllm):
    """`llm.llm_engine.model_executor.driver_worker.model_runner.model` (TRL 1.16's colocate
    path, and ours): each hop, in vLLM 0.26's source."""
    from vllm.v1.engine import llm_engine
    from vllm.v1.executor import uniproc_executor
    from vllm.v1.worker import gpu_worker, worker_base

    assert "self.model_executor = self.engine_core.engine_core.model_executor" in inspect.getsource(llm_engine)
    assert issubclass(uniproc_executor.ExecutorWithExternalLauncher, uniproc_executor.UniProcExecutor)
    assert "self.driver_worker = WorkerWrapperBase(" in inspect.getsource(uniproc_executor.UniProcExecutor)
    launcher = inspect.getsource(uniproc_executor.ExecutorWithExternalLauncher)
    for var in ("RANK", "LOCAL_RANK"):
        assert f'os.environ["{var}"]' in launcher
    assert "return getattr(self.worker, attr)" in inspect.getsource(worker_base.WorkerWrapperBase.__getattr__)
    assert "self.model_runner" in inspect.getsource(gpu_worker)
    # TRL reaches the model the same way: a rename in either breaks both
    from trl.generation.vllm_generation import VLLMGeneration

    hop = "llm.llm_engine.model_executor.driver_worker.model_runner.model"
    assert hop in inspect.getsource(VLLMGeneration.sync_weights)
    assert hop in ENGINE_SOURCE
