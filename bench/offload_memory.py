"""What `vllm.offloadTrainerState` frees on the GPU at the bench's large size, against the plan.

    python3 -m bench.offload_memory --out DIR [--shape auto|7b|3b]

One process, no vLLM: the large size's decoder (bench/grpo/model.py `LARGE_SHAPES`, random
weights made on the GPU under ZeRO-3 init, nothing written to disk) trains one optimizer step
under the deepspeed.json the operator renders for a one-GPU job with trainer-state offload
(DeepSpeed's own AdamW), completed as transformers completes it. Then, as the trainer does
around a generation, `offload_states` and `reload_states`. Reported: memory allocated and free
on the device before the offload, while offloaded and after the reload; the bytes freed against
what the memory planner credits the offload (`colocgrpo plan` for the same job: model shape,
one H200, the large size's batch); the vLLM utilization the free memory allows before and while
offloaded, against the planner's highest workable utilization without and with the offload; and
per-state checksums before the offload and after the reload (equal: nothing lost in transit).

The offload keeps its buffers in pinned host memory, 16 bytes per parameter here: `--shape auto`
takes the largest shape whose ZeRO-3 state fits the device (as the bench does) and whose
offload fits the host's available memory, and says which limit chose it.
Writes DIR/offload_memory.json and DIR/offload_memory.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.grpo.model import LARGE_SHAPES, shape_params
from bench.grpo.sizes import PROMPT_TOKENS, SIZES, TRAINING_STATE_BYTES_PER_PARAM

GIB = 2**30
MODEL = os.environ.get("COLOCGRPO_TEST_MODEL", "/tmp/models/smollm2-135m-instruct")  # the family's config
HOST_RESERVE_BYTES = 16 * GIB  # the process itself, the page cache it needs, pinned staging of the copy
DEVICE_FRACTION = 0.85  # as bench/grpo/model.pick_large_shape


def host_available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def choose_shape(requested: str, device_bytes: int, host_bytes: int) -> tuple[str, str]:
    if requested != "auto":
        return requested, "requested"
    for name, shape in LARGE_SHAPES.items():  # largest first
        state = shape_params(shape) * TRAINING_STATE_BYTES_PER_PARAM
        if state > DEVICE_FRACTION * device_bytes:
            continue
        if state + HOST_RESERVE_BYTES > host_bytes:
            print(
                f"[offload] {name}: offload needs {state / GIB:.0f} GiB pinned host memory, "
                f"{host_bytes / GIB:.0f} GiB available",
                flush=True,
            )
            continue
        why = (
            "the bench's large size" if name == next(iter(LARGE_SHAPES)) else "the largest whose offload fits the host"
        )
        return name, why
    raise SystemExit(
        f"no large shape fits the device ({device_bytes / GIB:.0f} GiB) and host ({host_bytes / GIB:.0f} GiB)"
    )


def planned(model_config, gpu_memory_gib: float, offload: bool) -> dict:
    """The memory plan of a one-GPU job of this shape and the large size's batch."""
    from colocgrpo_training.config import DeepSpeedSettings, ResourceSettings, VLLMSettings
    from colocgrpo_training.planner import PlanRequest
    from colocgrpo_training.planner import plan as plan_memory

    size = SIZES["large"]
    keys = (
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "steps_per_generation",
        "max_completion_length",
    )
    with tempfile.TemporaryDirectory() as tmp:
        model_config.to_json_file(str(Path(tmp) / "config.json"))
        request = PlanRequest(
            model=tmp,
            dtype="bfloat16",
            resources=ResourceSettings(nodes=1, gpus_per_node=1, gpu_memory_gib=gpu_memory_gib),
            deepspeed=DeepSpeedSettings(zero_stage=3),
            vllm=VLLMSettings(sleep_policy="auto", max_model_len=size["max_model_len"], offload_trainer_state=offload),
            max_prompt_tokens=PROMPT_TOKENS,
            trainer_args={k: size[k] for k in keys},
        )
        plan = plan_memory(request)
    kept = sum(
        t.bytes
        for t in plan.terms
        if t.phase == "generation" and t.name.startswith(("trainer", "ZeRO-3 gradient bucket"))
    )
    return {
        "trainer_state_offload_bytes": int(plan.trainer_state_offload_gib * GIB),
        "trainer_kept_during_generation_bytes": kept,
        "utilization_range": plan.utilization_range,
        "recommended_gpu_memory_utilization": plan.recommended_gpu_memory_utilization,
        "fits": plan.fits,
        "problems": plan.problems,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", choices=["auto", *LARGE_SHAPES], default="auto")
    parser.add_argument("--tokens", type=int, default=PROMPT_TOKENS + SIZES["large"]["max_completion_length"])
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    import deepspeed
    import torch
    import transformers

    from bench.machine_job import completed_deepspeed_config
    from colocgrpo_dev.ports import free_port
    from colocgrpo_training.generation.vllm_engine import check_trainer_state_offload
    from colocgrpo_training.planner import formulas

    device_bytes = torch.cuda.get_device_properties(0).total_memory
    host_bytes = host_available_bytes()
    shape_name, why = choose_shape(args.shape, device_bytes, host_bytes)
    result: dict = {"shape": shape_name, "shape_chosen_because": why, "host_available_bytes": host_bytes}
    print(f"[offload] shape {shape_name} ({why}); host has {host_bytes / GIB:.0f} GiB available", flush=True)

    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))  # a fixed port would meet another run's on a shared host
    deepspeed.init_distributed(dist_backend="nccl")
    config = transformers.AutoConfig.from_pretrained(MODEL)
    for key, value in LARGE_SHAPES[shape_name].items():
        setattr(config, key, value)
    config.head_dim = config.hidden_size // config.num_attention_heads
    config.use_cache = False
    # The rendered file needs a model for its "auto" sizes; a meta-device twin is enough for that.
    with torch.device("meta"):
        shape_only = transformers.AutoModelForCausalLM.from_config(config)
    ds_config = completed_deepspeed_config(shape_only, gpus=1, offload_trainer_state=True)
    del shape_only
    result["deepspeed_config"] = ds_config
    start = time.perf_counter()
    torch.manual_seed(0)
    with torch.device("cuda"):  # as bench/grpo/model.make_model; DeepSpeed partitions it below
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=ds_config
    )
    check_trainer_state_offload(engine)
    result["engine_seconds"] = time.perf_counter() - start
    params = sum(p.ds_numel for p in engine.module.parameters())
    result["parameters"] = params
    print(f"[offload] {params / 1e9:.2f}B parameters, engine in {result['engine_seconds']:.0f} s", flush=True)

    ids = torch.randint(0, config.vocab_size, (1, args.tokens), device=engine.device)
    start = time.perf_counter()
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    torch.cuda.synchronize()
    result["step_seconds"] = time.perf_counter() - start  # includes FusedAdam's first-use build

    def measure(tag: str) -> None:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        result[tag] = {"allocated": torch.cuda.memory_allocated(), "free": free, "total": total}
        print(
            f"[offload] {tag}: allocated {result[tag]['allocated'] / GIB:.2f} GiB, free {free / GIB:.2f} "
            f"of {total / GIB:.2f} GiB",
            flush=True,
        )

    sums_before = state_checksums(engine)
    measure("before_offload")
    start = time.perf_counter()
    engine.offload_states(pin_memory=True, non_blocking=False)
    result["offload_seconds"] = time.perf_counter() - start
    result["offloaded_states"] = sorted(s.value for s in engine.optimizer.offloaded_states)
    measure("offloaded")
    start = time.perf_counter()
    engine.reload_states(non_blocking=False)
    result["reload_seconds"] = time.perf_counter() - start
    measure("after_reload")
    sums_after = state_checksums(engine)
    result["checksums_equal"] = sums_before == sums_after
    result["checksums"] = {"before": sums_before, "after": sums_after}

    bucket = engine.optimizer.reduce_bucket_size
    resident = formulas.zero3_resident(params, 1, 2, False, False, bucket)
    freed = result["before_offload"]["allocated"] - result["offloaded"]["allocated"]
    gpu_gib = device_bytes / GIB
    plan_with, plan_without = planned(config, gpu_gib, True), planned(config, gpu_gib, False)
    result.update(
        freed_bytes=freed,
        formula_moved_bytes=sum(resident.moved_by_offload_states(False).values()),
        plan_with_offload=plan_with,
        plan_without_offload=plan_without,
        # vLLM refuses a utilization whose share of the whole GPU exceeds the free memory at start.
        max_utilization_before_offload=int(result["before_offload"]["free"] / device_bytes * 100) / 100,
        max_utilization_offloaded=int(result["offloaded"]["free"] / device_bytes * 100) / 100,
    )
    result["freed_vs_planned"] = freed / plan_with["trainer_state_offload_bytes"]
    (out / "offload_memory.json").write_text(json.dumps(result, indent=2, default=str))
    lines = report(result)
    (out / "offload_memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    ok = result["checksums_equal"] and abs(result["freed_vs_planned"] - 1) <= 0.01
    return 0 if ok else 1


def state_checksums(engine) -> dict[str, list[str]]:
    """Per offloadable state, the float64 sum of each buffer (the same buffers tests/support/zero3_states.py
    names): equal before the offload and after the reload when nothing was lost in transit."""
    opt = engine.optimizer
    moments = [s[k] for s in opt.optimizer.state.values() for k in ("exp_avg", "exp_avg_sq") if k in s]
    buffers = {
        "lp_params": [opt.lp_param_buffer],
        "lp_grads": [opt.grad_partitions_flat_buffer],
        "hp_params": list(opt.fp32_partitioned_groups_flat),
        "optim_states": moments,
    }
    # repr: a NaN equals itself here, as it should for "nothing changed"
    return {name: [repr(_float64_sum(t)) for t in tensors] for name, tensors in buffers.items()}


def _float64_sum(tensor, chunk: int = 1 << 28) -> float:
    """The float64 sum of a (flat) buffer, a chunk at a time: a float64 copy of a 7B-element buffer
    would need tens of GiB of device memory."""
    flat = tensor.reshape(-1)
    return sum(float(flat[i : i + chunk].double().sum()) for i in range(0, flat.numel(), chunk))


def report(r: dict) -> list[str]:
    def g(n: float) -> str:
        return f"{n / GIB:.2f}"

    resident = (
        r["plan_with_offload"]["trainer_kept_during_generation_bytes"]
        + r["plan_with_offload"]["trainer_state_offload_bytes"]
    )
    with_range = r["plan_with_offload"]["utilization_range"] or ("-", "-")
    without_range = r["plan_without_offload"]["utilization_range"] or ("-", "-")
    return [
        f"shape {r['shape']} ({r['shape_chosen_because']}), {r['parameters'] / 1e9:.2f}B parameters, one process, "
        f"ZeRO-3 with DeepSpeed's AdamW (operator render, offloadTrainerState)",
        "",
        "| | allocated GiB | free GiB | vLLM utilization it allows |",
        "|---|---|---|---|",
        f"| before offload_states | {g(r['before_offload']['allocated'])} | {g(r['before_offload']['free'])} "
        f"| {r['max_utilization_before_offload']:.2f} |",
        f"| offloaded | {g(r['offloaded']['allocated'])} | {g(r['offloaded']['free'])} "
        f"| {r['max_utilization_offloaded']:.2f} |",
        f"| after reload_states | {g(r['after_reload']['allocated'])} | {g(r['after_reload']['free'])} | |",
        "",
        f"freed {g(r['freed_bytes'])} GiB; planner credits {g(r['plan_with_offload']['trainer_state_offload_bytes'])} "
        f"GiB (ratio {r['freed_vs_planned']:.4f}); states moved: {', '.join(r['offloaded_states'])}",
        f"planner, ZeRO-3 state between optimizer steps: {g(resident)} GiB (measured before the offload: "
        f"{g(r['before_offload']['allocated'])} GiB allocated); left on the GPU while offloaded: "
        f"{g(r['plan_with_offload']['trainer_kept_during_generation_bytes'])} GiB "
        f"(measured: {g(r['offloaded']['allocated'])} GiB)",
        f"planner's workable gpuMemoryUtilization: {without_range[0]}-{without_range[1]} without the offload, "
        f"{with_range[0]}-{with_range[1]} with it",
        f"offload {r['offload_seconds']:.1f} s, reload {r['reload_seconds']:.1f} s (pinned host memory); "
        f"checksums equal after the reload: {r['checksums_equal']}",
    ]


if __name__ == "__main__":
    sys.exit(main())
