"""GRPO step time: TRL 1.16's colocate mode against ours, on one CUDA machine.

    python3 -m bench.grpo --out DIR [--contenders trl-sleep,trl-nosleep,ours-auto,...]
                          [--warmup-steps N --measured-steps M] [--budget-seconds S]
                          [--num-processes N --tp T]

`--num-processes N --tp T`: every contender as a job of one node with N GPUs (one process each,
the step's completions shared over them) and vLLM tensor-parallel size T, under the files the
operator renders for that shape (`product`).

Each contender runs in its own `accelerate launch` (DeepSpeed ZeRO-3) process with the same
model, data, batch, lengths and seeds (fixed below, before any run): warm-up steps, then the
median seconds per step over the measured steps, the device memory peak (NVML, whole GPU:
vLLM's memory is outside torch's allocator), and where our time goes (generate / push /
sleep / wake / offload, from ColocatedVLLM's counters). The parent also measures HBM
bandwidth and bf16 matmul FLOP/s on the machine and reports the floor
    decode bytes ÷ bandwidth + 6 · params · tokens ÷ FLOP/s.
Writes DIR/bench.json and DIR/bench.md (rewritten after every contender, so a run cut short
still reports what finished). Contenders run in the given order until `--budget-seconds`
would be exceeded; the rest are reported as skipped. Each contender is killed after
`--contender-timeout` seconds.

Contenders: trl-sleep, trl-nosleep, ours-<off|level1|level2|auto>[-offload], each optionally
@plain, @product or @none (no DeepSpeed). A contender that is not measured (skipped for the time
budget, out of memory at every utilization, failed, timed out) makes the run exit 1.

`--pair A,B[,C...] --pair-index K`: one ours-* contender and one or more TRL configurations, the
list rotated left by K (for a pair: A first for an even K, B first for an odd K); each TRL contender
forms a pair with ours (bench/pair_table.py aggregates a series of such runs). `--generate-only N`: no training, one
generation batch through each contender's engine 1 + N times. bench.json records the host (CPU
model, GPU and driver, commit).

Two sizes (`--size`): `small` is SmolLM2-135M-Instruct; `large` is a random-init decoder of
the same family (Llama architecture, SmolLM2's tokenizer) sized so that ZeRO-3 training
state and vLLM compete for the GPU — about 7B parameters on a 141 GiB H200, 3B on an
80 GiB card (`LARGE_SHAPES`, chosen by device memory) — created on the machine by the
bench itself (`--model-dir`; no checkpoint of that size ships anywhere). At the large size
each contender takes the first `vllm_gpu_memory_utilization` of `--util-ladder` that does
not run out of memory (highest first); the report says which. A third, `cpu`, sizes the step for
CPU dry runs of the plumbing (`--cpu`, a vLLM stand-in): no measurement.

The package's rooms: `sizes` (the shapes, the utilization ladder), `model` (the large model), `contenders`
(trainer, sleep policy, DeepSpeed file, GRPOConfig arguments), `worker` (one contender's process), `floor`
(the machine's rates and the floor), `report` (bench.json, bench.md), `run` (the parent). `python -m
bench.grpo_step` is the same command under its former name.
"""
