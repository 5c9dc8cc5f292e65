"""Bucketed weight push and the import boundary, with real torch / TRL (trainer venv).

vLLM itself only runs on a GPU (tests/gpu/); here the receiving side is a second real
torch model whose `load_weights` copies by name, as vLLM's model classes do.
"""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

pytestmark = pytest.mark.trainer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from support.tiny_llama import tiny_llama  # noqa: E402 - after the skips


def test_package_import_pulls_in_neither_torch_nor_vllm():
    code = (
        "import sys, colocgrpo_training.generation as g;"
        "assert g.SleepController;"
        "bad = [m for m in ('torch', 'vllm', 'trl', 'transformers') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_trainer_class_imports_without_vllm():
    import importlib.util

    from trl import GRPOTrainer

    from colocgrpo_training.generation import ColocatedVLLM, ColocGRPOTrainer

    assert issubclass(ColocGRPOTrainer, GRPOTrainer)
    assert ColocatedVLLM.__mro__[1].__name__ == "VLLMGeneration"
    if importlib.util.find_spec("vllm") is None:
        assert "vllm" not in sys.modules


class LoadWeightsReceiver:
    """Stands in for vLLM's model: `load_weights(iterable of (name, tensor))` copies by name."""

    def __init__(self, target):
        self.params = dict(target.named_parameters())
        self.calls: list[list[str]] = []
        self.bytes_per_call: list[int] = []

    def load_weights(self, weights):
        weights = list(weights)
        self.calls.append([n for n, _ in weights])
        self.bytes_per_call.append(sum(t.numel() * t.element_size() for _, t in weights))
        for name, tensor in weights:
            with torch.no_grad():
                self.params[name].copy_(tensor)


def make_engine(source, receiver, bucket_bytes):
    from accelerate import Accelerator
    from trl.distributed import DistributedBackend

    from colocgrpo_training.generation.vllm_engine import ColocatedVLLM

    # The engine without its vLLM build (GPU only): just the push machinery.
    engine = ColocatedVLLM.__new__(ColocatedVLLM)
    engine.model = source
    engine.accelerator = Accelerator(cpu=True)
    engine._dist = DistributedBackend(engine.accelerator)
    engine.bucket_bytes = bucket_bytes
    resets = []
    engine.llm = types.SimpleNamespace(
        reset_prefix_cache=lambda: resets.append(1),
        llm_engine=types.SimpleNamespace(
            model_executor=types.SimpleNamespace(
                driver_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(model=receiver))
            )
        ),
    )
    return engine, resets


@pytest.mark.parametrize("bucket_bytes", [1, 10_000, 40_000, 10**9])
def test_bucketed_push_copies_every_parameter_once_within_budget(bucket_bytes):
    source, target = tiny_llama(1), tiny_llama(2)
    assert not torch.equal(source.model.layers[0].mlp.up_proj.weight, target.model.layers[0].mlp.up_proj.weight)
    receiver = LoadWeightsReceiver(target)
    engine, resets = make_engine(source, receiver, bucket_bytes)

    pushed = engine.push_weights()

    names = [n for n, _ in source.named_parameters()]  # tied lm_head appears once
    assert [n for call in receiver.calls for n in call] == names
    for call, nbytes in zip(receiver.calls, receiver.bytes_per_call, strict=False):
        assert nbytes <= bucket_bytes or len(call) == 1
    assert pushed == sum(p.numel() * p.element_size() for p in source.parameters())
    for (name, a), b in zip(source.named_parameters(), target.parameters(), strict=False):
        assert torch.equal(a, b), name
    assert resets == [1]  # prefix cache reset after the push
    if bucket_bytes == 10**9:
        assert len(receiver.calls) == 1
    if bucket_bytes == 1:
        assert len(receiver.calls) == len(names)


def test_push_after_an_optimizer_step_carries_the_new_weights():
    source, target = tiny_llama(1), tiny_llama(2)
    receiver = LoadWeightsReceiver(target)
    engine, _ = make_engine(source, receiver, 40_000)
    engine.push_weights()
    before = target.lm_head.weight.detach().clone()
    opt = torch.optim.SGD(source.parameters(), lr=1.0)
    loss = source(input_ids=torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]])).loss
    loss.backward()
    opt.step()
    engine.push_weights()
    assert not torch.equal(before, target.lm_head.weight)
    assert torch.equal(source.lm_head.weight, target.lm_head.weight)


def _zero3_like(full: torch.Tensor, world: int, device: str = "cpu") -> torch.nn.Parameter:
    """A parameter with the attributes DeepSpeed's ZeRO-3 partitioning leaves on it."""
    param = torch.nn.Parameter(torch.empty(0))
    param.ds_numel, param.ds_shape = full.numel(), full.shape
    param.ds_zero_partition_world_size = world
    per_rank = -(-full.numel() // world)
    param.ds_tensor = torch.zeros(per_rank, device=device)
    param.ds_tensor[: min(per_rank, full.numel())] = full.flatten()[:per_rank]
    param.ds_tensor.final_location = None
    return param


def test_push_source_without_gather_only_where_the_rank_holds_the_whole_tensor():
    from colocgrpo_training.generation.vllm_engine import whole_tensor_without_gather

    plain = torch.nn.Parameter(torch.randn(3, 4))
    assert whole_tensor_without_gather(plain).data_ptr() == plain.data_ptr()  # no ZeRO-3: already whole, no copy
    full = torch.randn(3, 4)
    # Split over two ranks, or the partition on the CPU (param offload): must be gathered.
    assert whole_tensor_without_gather(_zero3_like(full, world=2)) is None
    assert whole_tensor_without_gather(_zero3_like(full, world=1)) is None  # CPU partition
    between = torch.nn.Parameter(torch.empty(0))
    between.ds_numel, between.ds_tensor = 12, None  # ZeRO-3 param not partitioned yet
    assert whole_tensor_without_gather(between) is None
    if torch.cuda.is_available():  # the view itself: tests/gpu/test_push_path.py proves it under DeepSpeed
        one_way = _zero3_like(full.cuda(), world=1, device="cuda")
        assert torch.equal(whole_tensor_without_gather(one_way).cpu(), full)


def test_force_gather_switch_sends_every_parameter_through_the_gather(monkeypatch):
    """COLOCGRPO_PUSH_FORCE_GATHER=1 (test-only): the push never takes the no-gather view, so one GPU
    runs the GatheredParameters path of multi-GPU jobs. Here every parameter "has" a view."""
    from gpu.drivers import learning_run

    from colocgrpo_training.generation import vllm_engine

    assert learning_run.FORCE_GATHER_ENV == vllm_engine.FORCE_GATHER_ENV == "COLOCGRPO_PUSH_FORCE_GATHER"
    source, target = tiny_llama(1), tiny_llama(2)
    names = [n for n, _ in source.named_parameters()]

    def pushed_through(force: bool) -> tuple[int, int]:
        receiver = LoadWeightsReceiver(target)
        engine, _ = make_engine(source, receiver, 10_000)
        gathered, viewed = [], []
        monkeypatch.setattr(vllm_engine, "whole_tensor_without_gather", lambda p: viewed.append(p) or p.data)
        real_gather = engine._dist.gather_params

        def gather_params(params):
            gathered.extend(params)
            return real_gather(params)

        monkeypatch.setattr(engine._dist, "gather_params", gather_params)
        if force:
            monkeypatch.setenv(vllm_engine.FORCE_GATHER_ENV, "1")
        else:
            monkeypatch.delenv(vllm_engine.FORCE_GATHER_ENV, raising=False)
        engine.push_weights()
        for (name, a), b in zip(source.named_parameters(), target.parameters(), strict=False):
            assert torch.equal(a, b), name
        return len(gathered), len(viewed)

    assert pushed_through(force=False) == (0, len(names))  # every parameter viewed, nothing gathered
    assert pushed_through(force=True) == (len(names), 0)  # the switch: every parameter gathered
