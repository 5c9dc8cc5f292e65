#!/usr/bin/env bash
# Issue 7 + 8 on the GPU machine, after the wheel set is installed (shared/gpu/README.md):
#   source /tmp/site/env.sh && bash tests/gpu/run_on_device.sh
# Runs (1) the weight-integrity suite, (2) the learning run, (3) the step-time benchmark;
# everything lands in $OUT (default ./gpu-out). Each part runs even if an earlier one fails;
# the exit status is non-zero if any failed. PARTS=integrity,learning,bench selects parts.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out}"
PARTS="${PARTS:-integrity,learning,bench}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/operator:$PWD/training:${PYTHONPATH:-}"
export COLOCGRPO_TEST_MODEL="${COLOCGRPO_TEST_MODEL:-/tmp/models/smollm2-135m-instruct}"
export COLOCGRPO_RESULTS_DIR="$OUT"
export VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY="${PYTHON:-python3}"
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1 || true

if [[ ",$PARTS," == *",integrity,"* ]]; then
  echo "== weight integrity"; t=$(date +%s)
  # --noconftest: the shared conftest wants the cluster tooling, absent on the GPU machine.
  "$PY" -m pytest -p no:cacheprovider --noconftest -m gpu -x -q tests/gpu/test_weight_integrity.py \
    --junitxml="$OUT/integrity.xml" 2>&1 | tee "$OUT/integrity.log" | tail -20
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  echo "integrity: $(( $(date +%s) - t )) s"
fi
if [[ ",$PARTS," == *",learning,"* ]]; then
  echo "== learning run"; t=$(date +%s)
  "$PY" tests/gpu/learning_run.py --out "$OUT/learning" --steps "${LEARN_STEPS:-100}" \
    --reference-steps "${LEARN_REF_STEPS:-20}" 2>&1 | tee "$OUT/learning.log" | tail -20
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  echo "learning: $(( $(date +%s) - t )) s"
fi
if [[ ",$PARTS," == *",bench,"* ]]; then
  echo "== benchmark"; t=$(date +%s)
  "$PY" bench/grpo_step.py --out "$OUT/bench" ${BENCH_CONTENDERS:+--contenders "$BENCH_CONTENDERS"} 2>&1 \
    | tee "$OUT/bench.log" | tail -20
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  echo "bench: $(( $(date +%s) - t )) s"
fi
# Keep the returned files small: drop model/optimizer checkpoints, keep logs and JSON.
find "$OUT" -type d -name 'global_step*' -prune -exec rm -rf {} + 2>/dev/null
find "$OUT" \( -name '*.safetensors' -o -name '*.pt' -o -name '*.bin' \) -delete 2>/dev/null
exit $status
