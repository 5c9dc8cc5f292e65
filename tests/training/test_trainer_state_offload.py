"""Trainer-state offload against a real DeepSpeed 0.19 ZeRO-3 engine on the CPU (trainer venv).

DeepSpeed runs on its CPU accelerator with one gloo process; `offload_states` then copies to new
host buffers, which is enough to see *what* it moves and that `reload_states` restores it:
- the bytes it moves, state by state, are the planner's generation-phase credit
  (`formulas.Zero3Resident.moved_by_offload_states`);
- parameters, gradient partitions, fp32 masters and Adam moments come back bit for bit, also when
  the offload falls inside gradient accumulation, and the run then equals a twin run without it;
- while offloaded the partitions point at the wrong bytes (module order against optimizer-group
  order), and the trainer's guard refuses a forward pass and a weight push meanwhile;
- the engine check names the spec field of every combination DeepSpeed cannot move.
The same checks run on a GPU with the real FusedAdam: tests/gpu/test_trainer_state_offload.py.
"""

from __future__ import annotations

import types

import pytest

pytestmark = pytest.mark.trainer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
deepspeed = pytest.importorskip("deepspeed")

from colocgrpo_training.config import VLLMSettings  # noqa: E402 - after the skips
from colocgrpo_training.generation.vllm_engine import (  # noqa: E402
    ColocatedVLLM,
    TrainerStateOffloadedError,
    TrainerStateOffloadError,
    check_trainer_state_offload,
)
from colocgrpo_training.planner import formulas  # noqa: E402
from support.tiny_llama import tiny_llama  # noqa: E402
from support.zero3_states import (  # noqa: E402
    differences,
    grouped_parameters,
    moved_by,
    relabelled_as_fused_adam,
    single_process_env,
    snapshot,
    zero3_config,
)

BUCKET = 1000
ALL_STATES = {"lp_params", "lp_grads", "hp_params", "optim_states", "contiguous_grad_buffer"}


@pytest.fixture(scope="module")
def make_engine():
    """Builds ZeRO-3 engines in this process: one gloo rank on DeepSpeed's CPU accelerator."""
    if torch.cuda.is_available():
        pytest.skip("CPU variant; tests/gpu/test_trainer_state_offload.py runs on the GPU")
    import importlib

    ds_torch = importlib.import_module("deepspeed.comm.torch")  # `deepspeed.comm.torch` the attribute is torch
    with pytest.MonkeyPatch.context() as mp:
        for key, value in single_process_env().items():
            mp.setenv(key, value)
        # One process needs no shared-memory collectives: skip building that C++ op.
        mp.setattr(ds_torch, "build_shm_op", lambda: None)
        created = not torch.distributed.is_initialized()
        if created:
            deepspeed.init_distributed(dist_backend="gloo")

        def build(seed: int = 0, accumulation: int = 1, offload_optimizer: bool = False):
            model = tiny_llama(seed, attn_implementation="eager")
            optimizer = torch.optim.AdamW(grouped_parameters(model), lr=1e-2)
            engine, *_ = deepspeed.initialize(
                model=model,
                optimizer=optimizer,
                config=zero3_config(accumulation, offload_optimizer=offload_optimizer, bucket=BUCKET),
            )
            return engine

        yield build
        if created:
            torch.distributed.destroy_process_group()


def batch(k: int):
    generator = torch.Generator().manual_seed(100 + k)
    return torch.randint(0, 64, (1, 12), generator=generator)


def micro_step(engine, k: int) -> None:
    ids = batch(k)
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()  # DeepSpeed steps the optimizer only at the accumulation boundary


def parameter_count(engine) -> int:
    return sum(p.ds_numel for p in engine.module.parameters())


def offloading_generation(engine) -> ColocatedVLLM:
    """The engine's offload hooks without a vLLM build: what `wake_kv_cache` / `sleep` call."""
    gen = ColocatedVLLM.__new__(ColocatedVLLM)
    gen.settings = VLLMSettings(sleep_policy="level2", offload_trainer_state=True)
    gen.model = engine.module
    gen.deepspeed_engine = lambda: engine
    gen.offload_seconds = 0.0
    return gen


def test_offload_moves_every_zero3_buffer_the_planner_credits(make_engine):
    engine = make_engine(seed=1)
    micro_step(engine, 0)  # the optimizer's moments exist after its first step

    def offload() -> None:
        with relabelled_as_fused_adam(engine):
            engine.offload_states(pin_memory=True, non_blocking=False)

    moved = moved_by(engine, offload)
    assert {s.value for s in engine.optimizer.offloaded_states} == ALL_STATES
    planned = formulas.zero3_resident(
        parameter_count(engine), 1, 2, offload_optimizer=False, offload_parameters=False, bucket_elements=BUCKET
    ).moved_by_offload_states(offload_optimizer=False)
    # bf16 partitions 2P, bf16 gradients 2P, fp32 masters 4P, Adam m + v 8P, the bucket 2 x 1000
    assert moved == planned
    assert sum(moved.values()) == 16 * parameter_count(engine) + 2 * BUCKET
    engine.reload_states(non_blocking=False)
    assert not engine.optimizer.offloaded_states


def test_offload_with_the_optimizer_on_cpu_moves_partitions_and_bucket_only(make_engine):
    engine = make_engine(seed=2, offload_optimizer=True)
    micro_step(engine, 0)
    # any optimizer: DeepSpeed moves no moments
    moved = moved_by(engine, lambda: engine.offload_states(pin_memory=True, non_blocking=False))
    planned = formulas.zero3_resident(
        parameter_count(engine), 1, 2, offload_optimizer=True, offload_parameters=False, bucket_elements=BUCKET
    ).moved_by_offload_states(offload_optimizer=True)
    assert moved == planned == {"lp_params": 2 * parameter_count(engine), "contiguous_grad_buffer": 2 * BUCKET}
    engine.reload_states(non_blocking=False)


def test_reload_is_bit_identical_also_inside_gradient_accumulation(make_engine):
    offloaded, twin = make_engine(seed=3, accumulation=4), make_engine(seed=3, accumulation=4)
    gen = offloading_generation(offloaded)
    checked = []
    for k in range(8):
        micro_step(offloaded, k)
        micro_step(twin, k)
        # k = 1: two of four micro-batches accumulated (a generation with steps_per_generation 2);
        # k = 3: right after the optimizer step.
        if k not in (1, 3):
            continue
        before = snapshot(offloaded)
        if k == 1:
            assert before["lp_grads[0]"].abs().sum() > 0, "no accumulated gradient to carry over"
        with relabelled_as_fused_adam(offloaded):
            gen._offload_trainer_state()
        assert {s.value for s in offloaded.optimizer.offloaded_states} == ALL_STATES
        # The hazard the guard exists for: partitions re-pointed in module order into a buffer laid
        # out in optimizer-group order (matrices first, then norms) hold other parameters' bytes.
        wrong = [
            n for n, p in offloaded.module.named_parameters() if not torch.equal(p.ds_tensor, before[f"param:{n}"])
        ]
        assert wrong, "every partition still reads its own bytes: the groups did not reorder parameters"
        with pytest.raises(TrainerStateOffloadedError):
            offloaded(input_ids=batch(k), labels=batch(k))
        with pytest.raises(TrainerStateOffloadedError):
            gen.push_weights()
        gen._reload_trainer_state()
        assert differences(before, snapshot(offloaded)) == [], f"micro-step {k}: state changed by offload+reload"
        checked.append(k)
    assert checked == [1, 3]
    # Two optimizer steps later, one offload having fallen mid-accumulation: equal to the twin, bit for bit.
    assert differences(snapshot(offloaded), snapshot(twin)) == []
    # The guard is gone after the reload: a forward pass runs.
    assert torch.isfinite(offloaded(input_ids=batch(0), labels=batch(0)).loss)


def test_engine_check_names_the_field_deepspeed_cannot_serve(make_engine):
    torch_adamw = make_engine(seed=4)
    with pytest.raises(TrainerStateOffloadError, match=r"DeepSpeed's own AdamW.*trains with AdamW"):
        check_trainer_state_offload(torch_adamw)
    with relabelled_as_fused_adam(torch_adamw):
        check_trainer_state_offload(torch_adamw)  # FusedAdam: everything can move
    check_trainer_state_offload(make_engine(seed=5, offload_optimizer=True))  # moments live on the CPU already

    def stub(stage: int = 3, param_device: str = "none"):
        return types.SimpleNamespace(
            zero_optimization_stage=lambda: stage,
            zero_offload_param=lambda: types.SimpleNamespace(device=param_device),
        )

    with pytest.raises(TrainerStateOffloadError, match=r"spec\.deepspeed\.zeroStage.*stage 2"):
        check_trainer_state_offload(stub(stage=2))
    with pytest.raises(TrainerStateOffloadError, match=r"spec\.deepspeed\.offloadParams"):
        check_trainer_state_offload(stub(param_device="cpu"))
    with pytest.raises(TrainerStateOffloadError, match="needs a DeepSpeed engine"):
        check_trainer_state_offload(None)


def test_push_through_zero3_gather_carries_the_trained_weights(make_engine):
    """The bucket's `GatheredParameters` branch (what multi-GPU jobs take) on real ZeRO-3 partitions:
    on the CPU no partition is a CUDA tensor, so every parameter goes through the gather."""
    engine = make_engine(seed=6)
    micro_step(engine, 0)
    target = tiny_llama(7, attn_implementation="eager")
    received: dict[str, torch.Tensor] = {}
    gathered_counts: list[int] = []

    class Receiver:
        def load_weights(self, weights):
            for name, tensor in weights:
                assert tensor.numel() > 0, f"{name}: pushed a released (empty) ZeRO-3 parameter"
                received[name] = tensor.detach().clone()

    from contextlib import contextmanager

    @contextmanager
    def gather_params(params):
        gathered_counts.append(len(params))
        with deepspeed.zero.GatheredParameters(params):
            yield

    gen = ColocatedVLLM.__new__(ColocatedVLLM)
    gen.model = engine.module
    gen.bucket_bytes = 4096
    gen._dist = types.SimpleNamespace(gather_params=gather_params)
    gen.llm = types.SimpleNamespace(
        reset_prefix_cache=lambda: None,
        llm_engine=types.SimpleNamespace(
            model_executor=types.SimpleNamespace(
                driver_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(model=Receiver()))
            )
        ),
    )
    pushed = gen.push_weights()
    params = dict(engine.module.named_parameters())
    assert pushed == sum(p.ds_numel * p.element_size() for p in params.values())
    assert sum(gathered_counts) == len(params) and len(gathered_counts) > 1  # several buckets, all gathered
    with deepspeed.zero.GatheredParameters(list(params.values())):
        for name, param in params.items():
            assert torch.equal(received[name], param.data), name
    assert not all(torch.equal(received[n], p) for n, p in target.named_parameters())  # not the base weights


def test_rendered_offload_file_completes_to_deepspeeds_adamw():
    """What the GPU check and bench/offload_memory.py train under: the operator's render of an offloading
    job, completed by transformers' own code, names DeepSpeed's AdamW with concrete numbers."""
    from bench.machine_job import completed_deepspeed_config

    model = tiny_llama(0, attn_implementation="eager")
    config = completed_deepspeed_config(model, offload_trainer_state=True, accumulation=4, micro_batch=2, bf16=False)
    assert "auto" not in repr(config), config
    assert config["optimizer"] == {
        "type": "AdamW",
        "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0},
    }
    zero = config["zero_optimization"]
    # The planner's knobs, sized for this model: a bucket of one decoder layer, large parameters released after use.
    assert zero["reduce_bucket_size"] == sum(p.numel() for p in model.model.layers[0].parameters())
    assert zero["stage3_param_persistence_threshold"] == 10 * model.config.hidden_size
    assert config["gradient_accumulation_steps"] == 4 and config["train_micro_batch_size_per_gpu"] == 2


def test_offload_memory_driver_plans_the_same_job_and_picks_a_shape_the_host_can_pin():
    from bench import offload_memory
    from bench.grpo.model import LARGE_SHAPES, shape_params

    gib = 2**30
    seven, three = (shape_params(LARGE_SHAPES[s]) * 16 for s in ("7b", "3b"))
    assert offload_memory.choose_shape("auto", 150 * gib, 1000 * gib) == ("7b", "the bench's large size")
    # 120 GiB of available host memory cannot pin 7B's 107 GiB of state next to the process: the 3B shape
    reserve = offload_memory.HOST_RESERVE_BYTES
    name, why = offload_memory.choose_shape("auto", 150 * gib, 120 * gib)
    assert name == "3b" and "host" in why and three + reserve <= 120 * gib < seven + reserve
    assert offload_memory.choose_shape("7b", 150 * gib, 1 * gib) == ("7b", "requested")

    config = transformers.LlamaConfig(
        vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192, **LARGE_SHAPES["3b"]
    )
    with_offload = offload_memory.planned(config, 139.8, offload=True)
    without = offload_memory.planned(config, 139.8, offload=False)
    p = shape_params(LARGE_SHAPES["3b"])
    with torch.device("meta"):  # one decoder layer's parameters, counted on the model itself
        layer = sum(
            t.numel() for t in transformers.models.llama.modeling_llama.LlamaDecoderLayer(config, 0).parameters()
        )
    # one GPU: 16 bytes per parameter and the one-layer bucket move (within the GiB rounding of the plan's figure)
    assert abs(with_offload["trainer_state_offload_bytes"] - (16 * p + 2 * layer)) < 2**20
    assert with_offload["trainer_kept_during_generation_bytes"] == 0
    # without the offload a one-GPU job keeps its parameters resident: DeepSpeed's 5e8-element bucket
    assert without["trainer_kept_during_generation_bytes"] == 16 * p + 2 * 500_000_000
    assert with_offload["utilization_range"][1] > without["utilization_range"][1]


def test_offload_memory_report_reads_its_own_result():
    from bench import offload_memory

    gib = 2**30
    plan = {"trainer_state_offload_bytes": 100 * gib, "trainer_kept_during_generation_bytes": 0}
    result = {
        "shape": "7b",
        "shape_chosen_because": "the bench's large size",
        "parameters": 7_000_000_000,
        "before_offload": {"allocated": 101 * gib, "free": 30 * gib},
        "offloaded": {"allocated": 1 * gib, "free": 130 * gib},
        "after_reload": {"allocated": 101 * gib, "free": 30 * gib},
        "max_utilization_before_offload": 0.21,
        "max_utilization_offloaded": 0.93,
        "freed_bytes": 100 * gib,
        "freed_vs_planned": 1.0,
        "offloaded_states": ["hp_params", "lp_params"],
        "plan_with_offload": {**plan, "utilization_range": (0.1, 0.95)},
        "plan_without_offload": {**plan, "utilization_range": None},
        "offload_seconds": 6.0,
        "reload_seconds": 5.0,
        "checksums_equal": True,
    }
    text = "\n".join(offload_memory.report(result))
    assert "| offloaded | 1.00 | 130.00 | 0.93 |" in text
    assert "ZeRO-3 state between optimizer steps: 100.00 GiB" in text and "0.1-0.95 with it" in text
