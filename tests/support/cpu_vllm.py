"""A CPU stand-in for the `vllm` module (just the surface ColocatedVLLM uses), so the CPU
tests run TRL's real GRPO loop through ColocGRPOTrainer and the sleep-policy controller.

It behaves like vLLM where the policy is concerned (docs/sleep-policy.md, "What vLLM's sleep mode does"): a level-2
sleep overwrites the weights with garbage, level 1 restores them, waking the KV cache
before the weights raises, generating while asleep raises. Every generate reports a
fingerprint of the weights it used to `GENERATE_HOOKS`, so a test can compare them with
the trainer's weights at that moment. The real engine is exercised by tests/gpu/.
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass, field

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
        self.weights_awake = self.kv_awake = False

    def wake_up(self, tags=None) -> None:
        tags = tags or ["weights", "kv_cache"]
        if "weights" in tags and not self.weights_awake:
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
        outputs = []
        for prompt, sp in zip(prompts, params, strict=True):
            ids = list(prompt["prompt_token_ids"])
            generated, lps = [], []
            for _ in range(sp.max_tokens):
                logits = self.model(torch.tensor([ids + generated])).logits[0, -1]
                logp = torch.log_softmax(logits / max(sp.temperature, 1e-5), dim=-1)
                if sp.temperature == 0:
                    token = int(logits.argmax())
                else:
                    token = int(torch.multinomial(logp.exp(), 1, generator=self._generator))
                generated.append(token)
                value = float(logp[token])
                lps.append({token: Logprob(value if math.isfinite(value) else -1e9, 1)})
                if token == self.model.config.eos_token_id and not sp.ignore_eos:
                    break
            outputs.append(RequestOutput(ids, [CompletionOutput(generated, lps if sp.logprobs is not None else None)]))
        return outputs


def install(monkeypatch) -> types.ModuleType:
    """Make `import vllm` (done lazily by ColocatedVLLM) return this module."""
    import sys

    module = sys.modules[__name__]
    monkeypatch.setitem(sys.modules, "vllm", module)
    GENERATE_HOOKS.clear()
    ENGINES.clear()
    return module
