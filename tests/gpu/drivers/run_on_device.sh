#!/usr/bin/env bash
# GPU proofs on a CUDA machine, after the GPU stack is installed (docs/gpu-proofs.md; on an air-gapped host:
# tests/gpu/drivers/offline_wheels/install.sh → /tmp/site/env.sh, the model at /tmp/models/smollm2-135m-instruct).
#
#   SMOKE=1 bash tests/gpu/drivers/run_on_device.sh                  # every part, minimal (~5 min)
#   PARTS=integrity,learning bash tests/gpu/drivers/run_on_device.sh # full parts (≤ 9 min together)
#   PARTS=bench bash tests/gpu/drivers/run_on_device.sh              # full benchmark (≤ 9 min)
#   PARTS=push,bench ...                                     # + the push-source check (~1 min)
#   PARTS=bench-large bash tests/gpu/drivers/run_on_device.sh        # the ~7B comparison (≤ 9 min)
#   PARTS=pair PAIR=ours-auto,trl-sleep PAIR_INDEX=K bash ...        # one ~7B headline pair, order from K (≤ 9 min)
#   PARTS=pair PAIR=ours-auto,trl-sleep,trl-sleep@product PAIR_MARGIN_S=30 PAIR_INDEX=K DEADLINE_S=585 bash ...
#                                                                    # ours against both TRL DeepSpeed files (~8 min)
#   PARTS=probe,pair ...                                             # the machine's rates first (~30 s), then the pair
#   PARTS=pair PAIR=ours-auto,trl-best@plain,trl-best@product PAIR_INDEX=K PAIR_MARGIN_S=20 DEADLINE_S=588 bash ...
#                                                                    # ours against TRL's best recipe, both files (~6 min)
#   PARTS=seed-model bash ...                                        # the seed size's ~7B Qwen2 model, made once (~1 min)
#   PARTS=pair SIZE=seed PAIR=ours-auto,trl-best PAIR_INDEX=K DEADLINE_S=588 bash ...
#                                                                    # one seed-shaped pair (512 + 1,024 tokens, ~7-8 min)
#   PARTS=gen-compare bash tests/gpu/drivers/run_on_device.sh        # ~7B generate-only, both trainers (≤ 9 min)
#   PARTS=gen-profile bash tests/gpu/drivers/run_on_device.sh        # where one large-size generate goes (≤ 4.5 min)
#   PARTS=zero3 bash tests/gpu/drivers/run_on_device.sh              # ~7B training side per DeepSpeed file (~5 min)
#   PARTS=zero3-variants bash tests/gpu/drivers/run_on_device.sh     # ~7B training-side candidates, one process (~5 min)
#   PARTS=calibrate bash tests/gpu/drivers/run_on_device.sh          # the planner's activation formula, measured (~2 min)
# Trainer-state offload and the ZeRO-3 gather path, one call each (each ≤ 9 min alone):
#   PARTS=offload            bit-identical offload round trips, freed memory = the plan (~3 min)
#   PARTS=offload-memory     the large size: memory and utilization before/while/after the offload (~4 min)
#   PARTS=offload-learning   30 steps with the offload against sleep off: log-prob difference within 5 % (~6 min)
#   PARTS=gather-integrity   the integrity suite, ZeRO-3 model, every push gathered (~3 min)
#   PARTS=gather-learning    30 level-2 steps, 8-GPU deepspeed.json on one GPU, pushes gathered (~5 min)
# Several GPUs: NPROC processes (one per GPU) and vLLM tensor-parallel size TP for integrity, learning and
# bench (TP divides NPROC; a TP group stays on this one node). Every part minimal, in one call:
#   SMOKE=1 NPROC=2 TP=2 bash tests/gpu/drivers/run_on_device.sh     # TP 2 on 2 GPUs
#   SMOKE=1 NPROC=4 TP=4 bash tests/gpu/drivers/run_on_device.sh     # TP 4 on 4 GPUs
#   SMOKE=1 NPROC=4 TP=2 bash tests/gpu/drivers/run_on_device.sh     # DP 2 x TP 2 on 4 GPUs
# and each full part in a call of its own (NPROC=4 TP=2 PARTS=integrity, ...=learning, ...=bench).
# CPU=1: the same command as a dry run of the plumbing on CPU, with the vLLM stand-in (tests/support/cpu_vllm.py)
# and, unless COLOCGRPO_TEST_MODEL names one, the tiny model built here; make test runs
#   CPU=1 SMOKE=1 NPROC=4 TP=2 bash tests/gpu/drivers/run_on_device.sh   (tests/training/test_gpu_dry_run.py)
#
# Writes only these files into $OUT (a handful, so that a host which returns few files returns them all):
#   summary.txt        parts, exit codes, seconds, verdicts, GPU, versions (read this first)
#   results.tar.gz     every part's JSON, CSV and logs (no checkpoints or weights)
#   integrity.log learning.log bench.log   each part's console output (tail-capped)
#   integrity-ranks.log   NPROC > 1: each rank's own integrity output, in rank order (tail-capped)
#   pair-K.json        PARTS=pair: that run's bench.json (for bench/pair_table.py)
#   generate_profile.json generate_profile_ops.txt   PARTS=gen-profile: the report and its profiler op tables
# Extra arguments: LEARN_ARGS="..." for learning_run.py, BENCH_ARGS="..." for python -m bench.grpo
# (e.g. LEARN_ARGS="--steps 60", BENCH_ARGS="--contenders trl-sleep,ours-auto").
# Work files live in $WORK (default /tmp/gpu-work). Every part has a hard time limit and the
# whole script a deadline (DEADLINE_S, default 560 s, so that it ends inside a 10-minute command limit).
# Exit status: 0 when every selected part passed.
set -uo pipefail
T0=$(date +%s)
cd "$(dirname "$0")/../../.."
REPO=$PWD
OUT="${OUT:-$REPO/gpu-out}"
WORK="${WORK:-/tmp/gpu-work}"
SMOKE="${SMOKE:-0}"
DEADLINE_S="${DEADLINE_S:-560}"
NPROC="${NPROC:-1}"
TP="${TP:-1}"
CPU="${CPU:-0}"
if [[ "$SMOKE" == 1 ]]; then PARTS="${PARTS:-integrity,learning,bench}"; else PARTS="${PARTS:-integrity,learning}"; fi
mkdir -p "$OUT" "$WORK"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
die() { say "FATAL: $*"; exit 3; }
(( NPROC >= 1 && TP >= 1 && NPROC % TP == 0 )) || die "TP=$TP must divide NPROC=$NPROC"

# -- environment (env.sh from install.sh sets PYTHONPATH=/tmp/site and the variables below) --
[[ -f /tmp/site/env.sh ]] && source /tmp/site/env.sh
export PYTHONPATH="$REPO:$REPO/operator:$REPO/training:$REPO/dev:${PYTHONPATH:-}"
export COLOCGRPO_TEST_MODEL="${COLOCGRPO_TEST_MODEL:-/tmp/models/smollm2-135m-instruct}"
# Required: flashinfer is not carried (vLLM's LLM() fails without it); no NVLink multicast.
export VLLM_USE_FLASHINFER_SAMPLER=0 TVM_FFI_DISABLE_TORCH_C_DLPACK=1 VLLM_NO_USAGE_STATS=1
# DeepSpeed 0.19's op builder cannot parse suffixed targets such as 9.0a (colocgrpo_training/cuda_arch.py);
# the tests that build FusedAdam in their own process need the readable value too.
if [[ -n "${TORCH_CUDA_ARCH_LIST:-}" ]]; then
  TORCH_CUDA_ARCH_LIST=$(python3 -c 'import sys; from colocgrpo_training.cuda_arch import deepspeed_readable as r; print(r(sys.argv[1]))' "$TORCH_CUDA_ARCH_LIST")
  export TORCH_CUDA_ARCH_LIST
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_DATASETS_CACHE="$WORK/hf-datasets"
unset RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
PY="${PYTHON:-python3}"

say "colocgrpo GPU proofs: SMOKE=$SMOKE PARTS=$PARTS NPROC=$NPROC TP=$TP CPU=$CPU commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if [[ "$CPU" == 1 ]]; then
  # The dry run: the vLLM stand-in as an importable package for every launched process, the tiny model.
  export PYTHONPATH="$WORK/standin:$REPO/tests:$PYTHONPATH" OMP_NUM_THREADS=1
  "$PY" -c 'import sys; from support.cpu_vllm import write_package; write_package(sys.argv[1])' "$WORK/standin" \
    || die "cannot write the vLLM stand-in"
  if [[ ! -d "$COLOCGRPO_TEST_MODEL" ]]; then
    "$PY" -m colocgrpo_dev.models.tiny "$WORK/tiny-model" >/dev/null || die "cannot build the tiny model"
    export COLOCGRPO_TEST_MODEL="$WORK/tiny-model"
  fi
  # The tiny random model's greedy output barely moves under SmolLM2's perturbation, and its logits are small.
  export COLOCGRPO_INTEGRITY_DEVICE=cpu COLOCGRPO_INTEGRITY_DTYPE=float32
  export COLOCGRPO_INTEGRITY_SIGMA=4 COLOCGRPO_INTEGRITY_STALE_MARGIN=0.1
  # CPU-sized steps (the stand-in recomputes every token); later arguments in LEARN_ARGS/BENCH_ARGS win.
  LEARN_ARGS="--cpu --steps 3 --batch 16 --num-generations 4 --max-completion-length 8 ${LEARN_ARGS:-}"
  BENCH_ARGS="--cpu --size cpu ${BENCH_ARGS:-}"
  BENCH_CONTENDERS="${BENCH_CONTENDERS:-ours-auto}"  # the offload moves GPU memory: nothing to move on CPU
  say "gpu: none (CPU dry run, vLLM stand-in, model $COLOCGRPO_TEST_MODEL)"
else
  say "gpu: $(nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader 2>&1 | head -1)"
fi
# Every pytest process of the suites, one or NPROC of them, leaves without the interpreter's finalization, as the
# trainer does (pytest_exit.py).
PYTEST_MODULE=(-m pytest -p tests.gpu.drivers.pytest_exit)
# The integrity suite in NPROC processes (each rank checks its share of its TP group's generates).
# With several, each rank writes to a file of its own under $WORK/integrity/ranks (torch's launcher redirects them):
# ranks writing one console interleave their lines, so no rank's result could be read whole.
if (( NPROC > 1 )); then
  PYTEST=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$NPROC"
    --log-dir "$WORK/integrity/ranks" --redirects 3 "${PYTEST_MODULE[@]}")
else
  PYTEST=("$PY" "${PYTEST_MODULE[@]}")
fi
SHAPE_ARGS=(--num-processes "$NPROC" --tp "$TP")
[[ -d "$COLOCGRPO_TEST_MODEL" ]] || die "model missing at $COLOCGRPO_TEST_MODEL (run tests/gpu/drivers/offline_wheels/install.sh first)"
if ! "$PY" -c 'import pytest' 2>/dev/null; then
  ls .whl/*.whl >/dev/null 2>&1 || die "pytest missing and no .whl/ carried (carry .whl)"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/pytest-site .whl/*.whl || die "pytest install failed"
  export PYTHONPATH="$PYTHONPATH:/tmp/pytest-site"
fi
versions=$(timeout 180 "$PY" -c 'import torch, vllm, trl, deepspeed, transformers, accelerate, pytest
print(f"torch {torch.__version__} cuda {torch.cuda.is_available()} vllm {vllm.__version__} trl {trl.__version__} "
      f"deepspeed {deepspeed.__version__} transformers {transformers.__version__} accelerate {accelerate.__version__} pytest {pytest.__version__}")' 2>&1 | tail -1)
say "versions: $versions"
[[ "$versions" == torch* ]] || die "the GPU stack does not import (source /tmp/site/env.sh after install.sh)"

# -- parts ---------------------------------------------------------------------------------
status=0
# run_part NAME LIMIT_S CMD...: runs CMD under a hard limit (capped by the deadline), logs
# to $OUT/NAME.log (last 400 lines) and $WORK/NAME.full.log, records rc and seconds.
run_part() {
  local name=$1 limit=$2; shift 2
  local left=$(( DEADLINE_S - ($(date +%s) - T0) - 15 ))
  (( limit > left )) && limit=$left
  if (( limit < 60 )); then say "== $name: SKIPPED (only ${left}s left before the deadline)"; status=1; return; fi
  say "== $name (limit ${limit}s)"
  local t=$(date +%s)
  timeout -k 20 "$limit" "$@" >"$WORK/$name.full.log" 2>&1
  local rc=$?
  tail -n 400 "$WORK/$name.full.log" >"$OUT/$name.log"
  local secs=$(( $(date +%s) - t ))
  local note=""; [[ $rc == 124 || $rc == 137 ]] && note=" TIMED OUT"
  say "$name: rc=$rc$note ${secs}s"
  [[ $rc == 0 ]] || status=1
}

if [[ ",$PARTS," == *",probe,"* ]]; then
  # The machine now (host CPU, host memory first touch against a rewrite, GPU launch latency, matmul rate and
  # pinned copies): first on a fresh machine, and beside a slow run (docs/benchmarks/gpu.md).
  run_part probe 240 "$PY" -m bench.machine_probe --out "$WORK/probe" ${PROBE_ARGS:-}
  [[ -f "$WORK/probe/machine_probe.json" ]] && cp "$WORK/probe/machine_probe.json" "$OUT/machine_probe.json"
  cat "$OUT/probe.log" >>"$SUMMARY" 2>/dev/null
fi

if [[ ",$PARTS," == *",integrity,"* ]]; then
  if [[ "$SMOKE" == 1 ]]; then
    export COLOCGRPO_INTEGRITY_POLICIES=auto COLOCGRPO_INTEGRITY_SEEDS=11 COLOCGRPO_INTEGRITY_MAX_STEPS=3
    limit=170
  else
    limit=230
  fi
  export COLOCGRPO_RESULTS_DIR="$WORK/integrity" COLOCGRPO_REQUIRE_GPU="${COLOCGRPO_REQUIRE_GPU:-1}"
  export COLOCGRPO_INTEGRITY_TP="$TP"
  rm -rf "$WORK/integrity/ranks"  # the launcher adds a folder per run: only this run's ranks are read below
  mkdir -p "$COLOCGRPO_RESULTS_DIR"
  junit=(); (( NPROC == 1 )) && junit=(--junitxml="$WORK/integrity/junit.xml")  # one writer
  # --noconftest: the shared conftest wants the cluster tooling, absent on the GPU machine.
  run_part integrity "$limit" \
    "${PYTEST[@]}" -p no:cacheprovider --noconftest -m gpu -v -rA tests/gpu/test_weight_integrity.py "${junit[@]}"
  if (( NPROC > 1 )); then
    # Each rank's output in rank order (its last 80 lines): the launcher's rank directories are named by local rank.
    for dir in $(find "$WORK/integrity/ranks" -mindepth 3 -maxdepth 3 -type d 2>/dev/null | sort -V); do
      echo "--- rank ${dir##*/}"; tail -n 80 "$dir/stderr.log" "$dir/stdout.log" 2>/dev/null
    done >"$OUT/integrity-ranks.log"
    grep -E "^--- rank|^(PASSED|FAILED|ERROR|SKIPPED) |^=+ .*(passed|failed)" "$OUT/integrity-ranks.log" >>"$SUMMARY"
  else
    grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/integrity.log" | tail -8 >>"$SUMMARY"
  fi
fi
if [[ ",$PARTS," == *",push,"* ]]; then
  # The weight push's no-gather source equals DeepSpeed's gathered weights after real steps.
  export COLOCGRPO_RESULTS_DIR="$WORK/push" COLOCGRPO_REQUIRE_GPU="${COLOCGRPO_REQUIRE_GPU:-1}"
  mkdir -p "$COLOCGRPO_RESULTS_DIR"
  # Both ZeRO-3 layouts: every parameter resident (the operator's one-GPU render) and DeepSpeed's default.
  for layout in product plain; do
    COLOCGRPO_PUSH_ZERO3_LAYOUT=$layout run_part "push-$layout" 150 \
      "$PY" "${PYTEST_MODULE[@]}" -p no:cacheprovider --noconftest -m gpu -v -s -rA tests/gpu/test_push_path.py
    grep -E "zero3 layout|push source|PASSED|FAILED|ERROR|passed|failed" "$OUT/push-$layout.log" | tail -5 >>"$SUMMARY"
  done
fi
if [[ ",$PARTS," == *",learning,"* ]]; then
  if [[ "$SMOKE" == 1 ]]; then
    run_part learning 200 "$PY" tests/gpu/drivers/learning_run.py --out "$WORK/learning" --smoke --steps 6 \
      --startup-seconds 160 --seconds-per-step 3 "${SHAPE_ARGS[@]}" ${LEARN_ARGS:-}
  else
    # ~1.15 s/step measured under ZeRO-3; limits: startup 150 s + 2 s/step per run.
    run_part learning 470 "$PY" tests/gpu/drivers/learning_run.py --out "$WORK/learning" \
      --steps "${LEARN_STEPS:-80}" --reference-steps "${LEARN_REF_STEPS:-12}" --startup-seconds 150 --seconds-per-step 2 \
      "${SHAPE_ARGS[@]}" ${LEARN_ARGS:-}
  fi
  [[ -f "$WORK/learning/learning_run.json" ]] && "$PY" -c 'import json,sys; print("learning verdict:", json.dumps(json.load(open(sys.argv[1]))["verdict"]))' \
    "$WORK/learning/learning_run.json" >>"$SUMMARY" 2>&1
fi
if [[ ",$PARTS," == *",bench,"* ]]; then
  if [[ "$SMOKE" == 1 ]]; then
    run_part bench 230 "$PY" -m bench.grpo --out "$WORK/bench" --contenders "${BENCH_CONTENDERS:-ours-auto-offload}" \
      --warmup-steps 1 --measured-steps 1 --budget-seconds 170 --contender-timeout 150 "${SHAPE_ARGS[@]}" ${BENCH_ARGS:-}
  else
    # The budget is what the deadline leaves (other parts may have run first), less one contender.
    left=$(( DEADLINE_S - ($(date +%s) - T0) - 40 ))
    run_part bench $(( left + 20 )) "$PY" -m bench.grpo --out "$WORK/bench" \
      ${BENCH_CONTENDERS:+--contenders "$BENCH_CONTENDERS"} --budget-seconds $(( left < 480 ? left - 40 : 440 )) \
      --contender-timeout 170 "${SHAPE_ARGS[@]}" ${BENCH_ARGS:-}
  fi
  [[ -f "$WORK/bench/bench.md" ]] && cat "$WORK/bench/bench.md" >>"$SUMMARY"
fi

if [[ ",$PARTS," == *",zero3,"* ]]; then
  # The large size's training side alone, per DeepSpeed file (~1 min each; makes the model if absent).
  run_part zero3-model 300 "$PY" -m bench.grpo --out "$WORK/zero3-model" --make-model
  run_part zero3 "${ZERO3_LIMIT:-330}" "$PY" -m bench.zero3_train_step --model /tmp/models/random-large \
    --out "$WORK/zero3" ${ZERO3_ARGS:-}
  [[ -f "$WORK/zero3/zero3.md" ]] && cat "$WORK/zero3/zero3.md" >>"$SUMMARY"
fi

if [[ ",$PARTS," == *",zero3-variants,"* ]]; then
  # The training-side candidates against the baseline in one process (bench/zero3_train_step.py VARIANTS):
  # the model is loaded once under the one-GPU file; each variant 1 warm-up + ZERO3_MEASURED steps.
  run_part zero3-model 300 "$PY" -m bench.grpo --out "$WORK/zero3-model" --make-model
  left=$(( DEADLINE_S - ($(date +%s) - T0) - 30 ))
  run_part zero3-variants "$left" "$PY" -m bench.zero3_train_step --model /tmp/models/random-large \
    --out "$WORK/zero3-variants" --variants "${ZERO3_VARIANTS:-all}" --measured-steps "${ZERO3_MEASURED:-5}" \
    --timeout $(( left - 20 )) ${ZERO3_ARGS:-}
  [[ -f "$WORK/zero3-variants/variants.md" ]] && cat "$WORK/zero3-variants/variants.md" >>"$SUMMARY"
fi

if [[ ",$PARTS," == *",calibrate,"* ]]; then
  # The planner's activation formula against one forward + backward per shape and checkpointing (every layer, the
  # first half, none): bench/planner/calibrate_activations.py, models built from the planner's table.
  mkdir -p "$WORK/calibrate"
  run_part calibrate 240 "$PY" -m bench.planner.calibrate_activations --out "$WORK/calibrate/result.json"
fi

if [[ ",$PARTS," == *",seed-model,"* ]]; then
  # The seed size's random-init Qwen2 decoder (~7B on an H200), made once per machine and kept, so that a
  # seed-size pair in a later call has the whole call for its two contenders.
  run_part seed-model 300 "$PY" -m bench.grpo --out "$WORK/seed-model" --make-model --size seed
  [[ -f "$WORK/seed-model/model.json" ]] && cat "$WORK/seed-model/model.json" >>"$SUMMARY" && echo >>"$SUMMARY"
fi

if [[ ",$PARTS," == *",bench-large,"* ]]; then
  # The large size: a random-init decoder made here (~7B on an H200), the sleep-on pair first.
  left=$(( DEADLINE_S - ($(date +%s) - T0) - 40 ))
  run_part bench-large $(( left + 20 )) "$PY" -m bench.grpo --size large --out "$WORK/bench-large" \
    ${BENCH_LARGE_CONTENDERS:+--contenders "$BENCH_LARGE_CONTENDERS"} --budget-seconds $(( left - 200 )) \
    --contender-timeout "${BENCH_LARGE_TIMEOUT:-260}" ${BENCH_LARGE_ARGS:-}
  [[ -f "$WORK/bench-large/bench.md" ]] && cat "$WORK/bench-large/bench.md" >>"$SUMMARY"
fi

if [[ ",$PARTS," == *",pair,"* ]]; then
  # The headline pair: PAIR=A,B[,C] (ours and one or more TRL configurations) at SIZE (large, the default,
  # or seed), the list rotated left by PAIR_INDEX (a pair: even A first, odd B first); a contender skipped,
  # failed or timed out makes the part fail. bench/pair_table.py aggregates the bench.json of several such runs.
  # PAIR_MARGIN_S: no contender starts unless the last one's wall time would end this much before the
  # part's limit (three contenders at 7B take ~400 s of a fresh call's ~500; a seed-size contender ~3-4 min).
  left=$(( DEADLINE_S - ($(date +%s) - T0) - 40 ))
  pair_size="${SIZE:-large}"
  if [[ "$pair_size" == seed ]]; then margin=60 pair_timeout=330; else margin=200 pair_timeout=260; fi
  size_args=(--size "$pair_size")
  if [[ "$CPU" == 1 && "$pair_size" == seed ]]; then  # the CPU sizes; the seed size's tiny model made under $WORK
    size_args=(--cpu --size seed-cpu --model-dir "$WORK/models/seed-cpu")
  elif [[ "$CPU" == 1 ]]; then
    size_args=(--cpu --size cpu)
  fi
  run_part pair $(( left + 20 )) "$PY" -m bench.grpo "${size_args[@]}" --out "$WORK/pair" \
    --pair "${PAIR:-ours-auto,trl-sleep}" --pair-index "${PAIR_INDEX:-0}" --budget-seconds $(( left - ${PAIR_MARGIN_S:-$margin} )) \
    --contender-timeout "${PAIR_TIMEOUT:-$pair_timeout}" "${SHAPE_ARGS[@]}" ${PAIR_ARGS:-}
  [[ -f "$WORK/pair/bench.md" ]] && cat "$WORK/pair/bench.md" >>"$SUMMARY"
  [[ -f "$WORK/pair/bench.json" ]] && cp "$WORK/pair/bench.json" "$OUT/pair-${PAIR_INDEX:-0}.json"
fi
if [[ ",$PARTS," == *",gen-compare,"* ]]; then
  # Generate-only at the large size: one generation batch (128 sequences) through each trainer's engine 1 + GEN_REPS
  # times, no training (explains generate-time differences between the trainers' runs).
  left=$(( DEADLINE_S - ($(date +%s) - T0) - 40 ))
  large=(--size large); [[ "$CPU" == 1 ]] && large=(--cpu --size cpu)
  run_part gen-compare $(( left + 20 )) "$PY" -m bench.grpo "${large[@]}" --out "$WORK/gen-compare" \
    --contenders "${GEN_CONTENDERS:-ours-auto,trl-sleep}" --generate-only "${GEN_REPS:-8}" \
    --budget-seconds $(( left - 150 )) --contender-timeout "${GEN_TIMEOUT:-200}" "${SHAPE_ARGS[@]}" ${GEN_ARGS:-}
  [[ -f "$WORK/gen-compare/bench.md" ]] && cat "$WORK/gen-compare/bench.md" >>"$SUMMARY"
fi

if [[ ",$PARTS," == *",gen-profile,"* ]]; then
  # Where one short generate goes (bench/generate_profile.py): the trainer's engine on the large size's model (made
  # if absent, ~1 min), the pair bench's 128 sequences x 64 tokens with one thing taken out at a time, each against
  # the decode floor, and one profiled generate (~4 min on a fresh machine). No variant starts past its budget.
  left=$(( DEADLINE_S - ($(date +%s) - T0) - 20 ))
  limit=$(( left < ${GEN_PROFILE_LIMIT:-270} ? left : ${GEN_PROFILE_LIMIT:-270} ))
  profile_size=(--size large); [[ "$CPU" == 1 ]] && profile_size=(--cpu)
  run_part gen-profile "$limit" "$PY" -m bench.generate_profile "${profile_size[@]}" --out "$WORK/gen-profile" \
    --reps "${GEN_PROFILE_REPS:-5}" --budget-seconds $(( limit - 40 )) ${GEN_PROFILE_ARGS:-}
  [[ -f "$WORK/gen-profile/generate_profile.md" ]] && cat "$WORK/gen-profile/generate_profile.md" >>"$SUMMARY"
  for name in generate_profile.json generate_profile_ops.txt; do
    [[ -f "$WORK/gen-profile/$name" ]] && cp "$WORK/gen-profile/$name" "$OUT/$name"
  done
fi

# -- trainer-state offload and the ZeRO-3 gather path: one call each (each part fits 560 s alone) --
learning_verdict() {  # learning_verdict NAME: the learning run's verdict line into the summary
  [[ -f "$WORK/$1/learning_run.json" ]] && "$PY" -c 'import json,sys; print(sys.argv[2], "verdict:", json.dumps(json.load(open(sys.argv[1]))["verdict"]))' \
    "$WORK/$1/learning_run.json" "$1" >>"$SUMMARY" 2>&1
}
if [[ ",$PARTS," == *",offload,"* ]]; then
  # Bit-identical offload round trips with the rendered DeepSpeed AdamW (one inside gradient
  # accumulation), memory freed = the planner's credit, reads refused while offloaded (~3 min;
  # the first FusedAdam use JIT-compiles it).
  mkdir -p "$WORK/offload"
  COLOCGRPO_RESULTS_DIR="$WORK/offload" COLOCGRPO_REQUIRE_GPU="${COLOCGRPO_REQUIRE_GPU:-1}" run_part offload 420 \
    "$PY" "${PYTEST_MODULE[@]}" -p no:cacheprovider --noconftest -m gpu -v -rA tests/gpu/test_trainer_state_offload.py
  grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/offload.log" | tail -4 >>"$SUMMARY"
fi
if [[ ",$PARTS," == *",offload-memory,"* ]]; then
  # The large size (~7B on an H200, smaller if the host cannot pin its state): memory allocated and
  # free before / while / after the offload, the utilization it allows, against the plan (~4 min).
  run_part offload-memory 480 "$PY" -m bench.offload_memory --out "$WORK/offload-memory" ${OFFLOAD_MEMORY_ARGS:-}
  [[ -f "$WORK/offload-memory/offload_memory.md" ]] && cat "$WORK/offload-memory/offload_memory.md" >>"$SUMMARY"
fi
if [[ ",$PARTS," == *",offload-learning,"* ]]; then
  # 30 steps with the trainer state offloaded (auto) against a sleep-off reference under the same
  # deepspeed.json (DeepSpeed's AdamW): log-prob difference within 5 % of the reference's (~6 min).
  run_part offload-learning 520 "$PY" tests/gpu/drivers/learning_run.py --out "$WORK/offload-learning" \
    --policy auto --offload-trainer-state --steps 30 --reference-steps 30 --logp-only --logp-rel-tol 0.05 \
    --logp-abs-tol 0 --startup-seconds 230 --seconds-per-step 2.5 ${LEARN_ARGS:-}
  learning_verdict offload-learning
fi
if [[ ",$PARTS," == *",gather-integrity,"* ]]; then
  # The integrity suite on a ZeRO-3-partitioned trainer model (an 8-GPU job's layout) with every push
  # through GatheredParameters, the multi-GPU path, on one GPU (~3 min: two policies, two schedules).
  mkdir -p "$WORK/gather-integrity"
  COLOCGRPO_INTEGRITY_ZERO3=1 COLOCGRPO_PUSH_FORCE_GATHER=1 COLOCGRPO_RESULTS_DIR="$WORK/gather-integrity" \
    COLOCGRPO_INTEGRITY_POLICIES="${GATHER_POLICIES:-level2,auto}" COLOCGRPO_INTEGRITY_SEEDS="${GATHER_SEEDS:-11,12}" \
    COLOCGRPO_INTEGRITY_MAX_STEPS=5 COLOCGRPO_REQUIRE_GPU="${COLOCGRPO_REQUIRE_GPU:-1}" run_part gather-integrity 400 \
    "$PY" "${PYTEST_MODULE[@]}" -p no:cacheprovider --noconftest -m gpu -v -rA tests/gpu/test_weight_integrity.py
  grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/gather-integrity.log" | tail -6 >>"$SUMMARY"
fi
if [[ ",$PARTS," == *",gather-learning,"* ]]; then
  # 30 level-2 steps under the 8-GPU deepspeed.json on one GPU, every push gathered, against a
  # sleep-off reference (same file, same switch): log-prob difference within 5 % (~5 min).
  run_part gather-learning 500 "$PY" tests/gpu/drivers/learning_run.py --out "$WORK/gather-learning" \
    --policy level2 --render-gpus 8 --force-gather --steps 30 --reference-steps 30 --logp-only --logp-rel-tol 0.05 \
    --logp-abs-tol 0 --startup-seconds 170 --seconds-per-step 2.5 ${LEARN_ARGS:-}
  learning_verdict gather-learning
fi

# -- what comes back: one tarball of the small files, the summary, the part logs -------------
tar -C "$WORK" -czf "$OUT/results.tar.gz" \
  --exclude='global_step*' --exclude='*.safetensors' --exclude='*.pt' --exclude='*.pth' --exclude='*.bin' \
  --exclude='data.jsonl' --exclude='hf-datasets' --exclude='trainer' --exclude='tokenizer.json' . 2>/dev/null
say "results.tar.gz: $(du -h "$OUT/results.tar.gz" | cut -f1); total ${SECONDS}s; exit $status"
exit $status
