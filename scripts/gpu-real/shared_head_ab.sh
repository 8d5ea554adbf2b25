#!/usr/bin/env bash
# The shared prompt head (engine::head) and the fields-first layout on the GPU machine, side by
# side on the same seeded checkpoints and inputs. One call runs the VARIANTS named (each ~3.5
# minutes: the 4B batch grouped vs direct, then `serve` under load on every model of MODELS):
#   default        the head on, --layout context-first (what a user gets without flags)
#   fields-first   the head on, --layout fields-first (batch flag; serve requests' options)
#   fields-nohead  --layout fields-first with FORKSCORE_SHARED_HEAD=off (the same prompt, every
#                  context prefilled whole: the head's own share)
#   nohead         FORKSCORE_SHARED_HEAD=off, context-first (the behaviour before the head)
# and first, unless SKIP_GPU_TESTS=1, the GPU tests of the shared past, the packed prefill and
# bf16 batch invariance (carry/gpu-tests.xz).
# Run from the repository root with OUT set; needs carry/{forkscore.xz,gpu-tests.xz,run.sh}
# from scripts/build-cuda.sh. Env: VARIANTS (default,fields-first), BATCH_CONTEXTS (256),
# CLIENTS (1,64), LOAD_S (8), MODELS (qwen35-4b,qwen25-1.5b), COMMIT.
# Output: $OUT/<variant>/{run.log,batch-*.json,load-*.json}, $OUT/gpu-tests.log.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
OUT="${OUT:?set OUT to a results folder}"
S=scripts/gpu-real
B=/tmp/forkscore-bin
export BATCH_CONTEXTS="${BATCH_CONTEXTS:-256}" CLIENTS="${CLIENTS:-1,64}" LOAD_S="${LOAD_S:-8}"
mkdir -p "$OUT" "$B"
if [[ -f carry/gpu-tests.xz && -z "${SKIP_GPU_TESTS:-}" ]]; then
  echo "== gpu tests"
  python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' \
    carry/gpu-tests.xz "$B/gpu-tests"
  chmod +x "$B/gpu-tests"
  for t in cuda_extend_many cuda_packed_prefill cuda_bf16_deterministic; do
    timeout 100 carry/run.sh "$B/gpu-tests" "$t" --test-threads 1 >> "$OUT/gpu-tests.log" 2>&1
  done
  grep -E "^test |test result|panicked|SUMMARY" "$OUT/gpu-tests.log" | head -30
fi
IFS=, read -ra VL <<<"${VARIANTS:-default,fields-first}"
for v in "${VL[@]}"; do
  envs=() batch_extra="" load_options=""
  case "$v" in
    default) ;;
    fields-first) batch_extra="--layout fields-first" load_options='{"layout": "fields-first"}' ;;
    fields-nohead) envs=(FORKSCORE_SHARED_HEAD=off) batch_extra="--layout fields-first" load_options='{"layout": "fields-first"}' ;;
    nohead) envs=(FORKSCORE_SHARED_HEAD=off) ;;
    *) echo "unknown variant $v"; continue ;;
  esac
  echo "== $v ${envs[*]} ${batch_extra}"
  mkdir -p "$OUT/$v"
  env "${envs[@]}" OUT="$OUT/$v" BATCH_EXTRA="$batch_extra" LOAD_OPTIONS="$load_options" \
    timeout 330 bash $S/throughput.sh > /dev/null 2>&1
  grep -E "first decision|clients|LOAD|exit" "$OUT/$v/run.log" | cut -c1-400 | head -20
  for f in "$OUT/$v"/batch-*.json; do
    [[ -f "$f" ]] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], {m: (round(e.get("prefix_tokens_per_s_job") or 0), e.get("job_s"), e.get("values_differing_from_first_mode")) for m, e in r["modes"].items()})' "$f"
  done
done
