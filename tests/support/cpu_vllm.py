"""A CPU stand-in for the `vllm` module (just the surface ColocatedVLLM uses), so the CPU
tests run TRL's real GRPO loop through ColocGRPOTrainer and the sleep-policy controller.

It refuses a prompt that leaves no room under its max model length, as vLLM's input check does, and it
behaves like vLLM where the policy is concerned (docs/sleep-policy.md, "What vLLM's sleep mode does"): a level-2
sleep overwrites the weights with garbage, level 1 restores them, waking the KV cache
before the weights raises, generating while asleep raises. A request that carries a seed
samples from a generator seeded with it (as vLLM's per-request seeds do), so equal requests
with equal seeds give equal completions in every process. Every generate hands the model it
used to `GENERATE_HOOKS`, so a test can compare it with the trainer's weights at that moment.
The real engine is exercised by tests/gpu/.

In-process tests put this module in `sys.modules["vllm"]` (`install`); trainer processes
started by a launcher import it through a `vllm` package written by `write_package`. Under
a multi-rank probe (`support.rank_probe`, enabled by its environment variable) the engine
also reports what each rank did.
"""

from __future__ import annotations

import math
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

GENERATE_HOOKS: list = []
ENGINES: list = []


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 16
    logprobs: int | None = None
    repetition_penalty: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    detokenize: bool = True  # the stand-in returns token ids only, either way
    extra: dict = field(default_factory=dict)


@dataclass
class Logprob:
    logprob: float
    rank: int


@dataclass
class CompletionOutput:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]


class _Receiver:
    def __init__(self, model):
        self.model = model
        self.params = dict(model.named_parameters())

    def load_weights(self, weights):
        with torch.no_grad():
            for name, tensor in weights:
                self.params[name].copy_(tensor.to(self.params[name].dtype))


def _load_unpartitioned(path: str):
    """vLLM loads its own full copy of the weights; under a DeepSpeed ZeRO-3 run (CPU dry runs
    of tests/gpu/drivers/learning_run.py) transformers would otherwise partition this one too."""
    from transformers.integrations import deepspeed as hf_deepspeed

    saved = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed._hf_deepspeed_config_weak_ref = None
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = saved


class LLM:
    def __init__(self, model: str, enable_sleep_mode: bool = False, max_model_len=None, seed: int = 0, **_: object):
        from support import rank_probe

        self.probe = rank_probe.engine_built() if rank_probe.enabled() else None
        self.model = _load_unpartitioned(model)
        self.enable_sleep_mode = enable_sleep_mode
        self.weights_awake = self.kv_awake = True
        self._host = None
        self._generator = torch.Generator().manual_seed(seed)
        receiver = _Receiver(self.model)
        self.llm_engine = types.SimpleNamespace(
            model_executor=types.SimpleNamespace(
                driver_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(model=receiver))
            ),
            model_config=types.SimpleNamespace(max_model_len=max_model_len or 512),
        )
        self.prefix_cache_resets = 0
        ENGINES.append(self)

    def sleep(self, level: int = 1) -> None:
        assert self.enable_sleep_mode, "sleep needs enable_sleep_mode=True"
        if not (self.weights_awake and self.kv_awake):
            raise RuntimeError("sleep on a sleeping engine")
        if level == 1:
            self._host = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self._level = level
        if self.probe is not None:
            self.probe.slept(level)
        self.weights_awake = self.kv_awake = False

    def wake_up(self, tags=None) -> None:
        tags = tags or ["weights", "kv_cache"]
        if "weights" in tags and not self.weights_awake:
            if self._level == 1 and self.probe is not None:
                time.sleep(self.probe.wake1_skew_seconds)  # a slower host link on some ranks
            with torch.no_grad():
                if self._level == 1:
                    self.model.load_state_dict(self._host)
                else:  # re-mapped memory: garbage
                    for p in self.model.parameters():
                        p.normal_(generator=self._generator)
            self.weights_awake = True
        if "kv_cache" in tags and not self.kv_awake:
            if not self.weights_awake:
                raise RuntimeError("CUDA error: KV cache woken before the weights")
            self.kv_awake = True

    def reset_prefix_cache(self) -> None:
        self.prefix_cache_resets += 1

    @torch.no_grad()
    def generate(self, prompts, sampling_params=None, use_tqdm=False):
        if not (self.weights_awake and self.kv_awake):
            raise RuntimeError("generate on a sleeping engine")
        for hook in GENERATE_HOOKS:
            hook(self.model)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        limit = self.llm_engine.model_config.max_model_len
        for prompt in prompts:  # vLLM's input check: a prompt must leave room for one generated token
            if len(prompt["prompt_token_ids"]) >= limit:
                raise ValueError(
                    f"The decoder prompt (length {len(prompt['prompt_token_ids'])}) is longer than the maximum model "
                    f"length of {limit}. Make sure that `max_model_len` is no smaller than the number of text tokens."
                )
        outputs = []
        for prompt, sp in zip(prompts, params, strict=True):
            ids = list(prompt["prompt_token_ids"])
            generator = self._generator if sp.seed is None else torch.Generator().manual_seed(sp.seed)
            generated, lps = [], []
            for _ in range(sp.max_tokens):
                logits = self.model(torch.tensor([ids + generated])).logits[0, -1]
                logp = torch.log_softmax(logits / max(sp.temperature, 1e-5), dim=-1)
                if sp.temperature == 0:
                    token = int(logits.argmax())
                else:
                    token = int(torch.multinomial(logp.exp(), 1, generator=generator))
                generated.append(token)
                value = float(logp[token]) + (self.probe.logprob_shift(token) if self.probe is not None else 0.0)
                lps.append({token: Logprob(value if math.isfinite(value) else -1e9, 1)})
                if token == self.model.config.eos_token_id and not sp.ignore_eos:
                    break
                if self.probe is not None and self.probe.stops_after(len(generated)):
                    generated[-1] = self.model.config.eos_token_id  # this rank's completions end here
                    lps[-1] = {generated[-1]: Logprob(float(logp[generated[-1]]), 1)}
                    break
            outputs.append(RequestOutput(ids, [CompletionOutput(generated, lps if sp.logprobs is not None else None)]))
        if self.probe is not None:
            self.probe.generated(
                [list(p["prompt_token_ids"]) for p in prompts],
                [sp.seed for sp in params],
                [o.outputs[0].token_ids for o in outputs],
            )
        return outputs


def install(monkeypatch) -> types.ModuleType:
    """Make `import vllm` (done lazily by ColocatedVLLM) return this module."""
    import sys

    module = sys.modules[__name__]
    monkeypatch.setitem(sys.modules, "vllm", module)
    GENERATE_HOOKS.clear()
    ENGINES.clear()
    return module


# The names TRL 1.16 imports from vLLM besides LLM and SamplingParams (trl/generation/).
_PACKAGE_FILES = {
    "__init__.py": (
        '"""CPU stand-in for vLLM (tests/support/cpu_vllm.py), for processes started by a launcher."""\n'
        "from support.cpu_vllm import *  # noqa: F403\n"
        "from support.cpu_vllm import LLM, CompletionOutput, Logprob, RequestOutput, SamplingParams  # noqa: F401\n"
        '__version__ = "0.26.0"\n'
    ),
    "sampling_params.py": (
        "class StructuredOutputsParams:\n    def __init__(self, **kwargs):\n        self.kwargs = kwargs\n"
    ),
    "utils/__init__.py": "",
    "utils/network_utils.py": 'def get_ip():\n    return "127.0.0.1"\n',
    "distributed/__init__.py": "",
    "distributed/weight_transfer/__init__.py": "",
    "distributed/weight_transfer/nccl_engine.py": "NCCLTrainerSendWeightsArgs = NCCLWeightTransferEngine = None\n",
}


# Imported by every interpreter started with the stand-in on PYTHONPATH, before anything else: the environment that
# `support.rank_probe.RANK_ENV_ENV` gives some ranks alone (a launcher gives every rank the same environment).
_SITECUSTOMIZE = """from support.rank_probe import apply_rank_environment

apply_rank_environment()
"""


def write_package(root: str | Path) -> Path:
    """Write an importable `vllm` package backed by this module under `root` and return
    `root`: put it and tests/ on PYTHONPATH of a launched trainer (its workers import vLLM
    by name). Only what TRL and ColocatedVLLM import exists. A `sitecustomize` beside it applies
    per-rank environment variables (`support.rank_probe.RANK_ENV_ENV`)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    for name, text in _PACKAGE_FILES.items():
        path = root / "vllm" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
