#!/usr/bin/env bash
# Where a bf16 decision comes to depend on its neighbours, and what the packed pass's token
# budget buys, in ONE call on the GPU machine (~4 minutes): the seeded Qwen3.5-4B, `batch`
# grouped vs direct with one component at a time switched to its reference form (GDN candle
# path, candle attention, recurrent delta rule, no packing via a prefill chunk below the prefix
# lengths), then --deterministic (expected: no value differs), then grouped at several
# --prefill-chunk budgets.
# Run from the repository root with OUT set; needs carry/{forkscore.xz,run.sh}.
# Env: CONTEXTS (64), CHUNKS (4096,8192,16384), SWEEP_CONTEXTS (256).
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
OUT="${OUT:?set OUT to a results folder}"
B=/tmp/forkscore-bin
CK=/tmp/gpu-tput/ckpt
S=scripts/gpu-real
mkdir -p "$B" "$CK"
cp -f carry/run.sh "$B/"
python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' \
  carry/forkscore.xz "$B/forkscore" && chmod +x "$B/forkscore"
timeout 120 python3 $S/write_checkpoints.py $CK --models qwen35-4b --device cuda --dtype bfloat16 > /dev/null 2>&1 \
  || echo "write_checkpoints FAILED"
RUN="$B/run.sh $B/forkscore"
case_() { # name, env, extra flags, contexts, modes
  local name=$1 envs=$2 extra=$3 n=$4 modes=$5
  env $envs timeout 150 python3 $S/batch_case.py --forkscore "$RUN" --model $CK/qwen35-4b \
    --out "$OUT/inv-$name.json" --contexts "$n" --fields 8 --tokens 830 --timeout-s 120 \
    --work "/tmp/inv-$name" --modes "$modes" --extra="$extra" > /dev/null 2>&1
  python3 - "$OUT/inv-$name.json" "$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["modes"]
d = r.get("direct", {})
print(sys.argv[2], {m: e.get("prefix_tokens_per_s_job") for m, e in r.items()},
      "differ:", d.get("values_differing_from_first_mode"), "max|dp|:", d.get("max_abs_prob_diff_vs_first_mode"))
PY
}
N=${CONTEXTS:-64}
case_ default "" "" $N grouped,direct
case_ gdn-candle "FORKSCORE_GDN=candle" "" $N grouped,direct
case_ attn-candle "FORKSCORE_ATTENTION=candle" "" $N grouped,direct
case_ recurrent "FORKSCORE_GDN_PREFILL=recurrent" "" $N grouped,direct
case_ unpacked "" "--prefill-chunk 512" $N grouped,direct
case_ deterministic "" "--deterministic" $N grouped,direct
IFS=, read -ra CL <<<"${CHUNKS:-4096,8192,16384}"
for c in "${CL[@]}"; do
  case_ chunk$c "" "--prefill-chunk $c" ${SWEEP_CONTEXTS:-256} grouped
done
echo "== done"
