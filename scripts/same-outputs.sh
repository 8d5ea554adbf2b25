#!/usr/bin/env bash
# Do two `forkscore` binaries write the same results? Runs `score` (code, literal, with the
# prompt and the allowed mass), `batch` (grouped, direct, serial, shared, `--format openai`, with
# error lines) and `generate` on the demo model with both, and compares their outputs byte for
# byte after replacing only what changes from run to run: `provenance.forkscore_commit`, the
# timings (`timings_ms`, `*_ms`, `*_per_s`, `speedup`) and the OpenAI lines' `created` / ids.
# Also compares every subcommand's `--help`. For a change that must not change behaviour
# (build the base commit's binary, e.g. from `git archive BASE | tar -x -C DIR`, then this one).
#
# usage: scripts/same-outputs.sh OLD_FORKSCORE NEW_FORKSCORE
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: $0 OLD_FORKSCORE NEW_FORKSCORE" >&2; exit 2; }
OLD=$(realpath "$1") NEW=$(realpath "$2")
cd "$(dirname "$0")/.."
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
M=$WORK/demo
"$NEW" demo-model "$M" >/dev/null 2>&1 || { echo "error: cannot write the demo model" >&2; exit 1; }
S=fixtures/examples/parallel_schema.json
printf '{"id":1,"question":"Is it urgent?"}\n{"id":2,"schema_file":"%s"}\n{"id":3}\n{"id":3}\nnot json\n' \
    "$PWD/$S" > "$WORK/shared.jsonl"
printf '%s\n' \
    '{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"Refund please"}],"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"urgent":{"type":"boolean"}}}}}}}' \
    '{"custom_id":"b","method":"GET"}' > "$WORK/openai.jsonl"

norm() {
    python3 -c '
import re, sys
t = sys.stdin.read()
t = re.sub(r"(\"forkscore_commit\":\s*)\"[^\"]*\"", r"\1\"<commit>\"", t)
t = re.sub(r"(\"timings_ms\":\s*)\{[^}]*\}", r"\1<run>", t)
t = re.sub(r"(\"(?:[a-z_]+_ms|[a-z_]+_per_s|speedup|created)\":\s*)[-0-9.e+]+", r"\1<run>", t)
t = re.sub(r"\"(chatcmpl-|batch_req_)[^\"]*\"", r"\"\1<run>\"", t)
sys.stdout.write(t)
'
}

failed=0
# run NAME ARGS...: OUTFILE in ARGS is a per-binary output file, appended to what stdout shows
run() {
    local name=$1 side bin a
    shift
    for side in old new; do
        bin=$OLD
        [ "$side" = new ] && bin=$NEW
        local out=$WORK/$side.jsonl args=()
        rm -f "$out"
        for a in "$@"; do
            [ "$a" = OUTFILE ] && a=$out
            args+=("$a")
        done
        { "$bin" "${args[@]}" 2>/dev/null | sed "s#$out#OUTFILE#g"; [ -f "$out" ] && cat "$out"; } \
            | norm > "$WORK/$name.$side"
    done
    if [ -s "$WORK/$name.new" ] && cmp -s "$WORK/$name.old" "$WORK/$name.new"; then
        echo "same  $name ($(wc -c < "$WORK/$name.new") bytes)"
    else
        echo "DIFF  $name"
        diff "$WORK/$name.old" "$WORK/$name.new" | head -20
        failed=1
    fi
}

run score score --model "$M" --revision demo --schema-file $S --context "Our production payment service is down."
run score_prompt_mass score --model "$M" --revision demo --schema-file $S --context "A typo on the pricing page." \
    --include-prompt --allowed-mass --top-k 3 --mode cached-serial
run score_literal score --model "$M" --revision demo --schema-file fixtures/examples/support_triage.json \
    --scoring literal --context "Please refund my order."
for mode in grouped direct serial; do
    run "batch_$mode" batch --model "$M" --revision demo --schema-file $S \
        --input fixtures/examples/decisions.jsonl --output OUTFILE --batch-mode $mode --quiet
done
run batch_shared batch --model "$M" --revision demo --input "$WORK/shared.jsonl" --output OUTFILE \
    --batch-mode shared --context "The payment service is down." --schema-file $S --quiet
run batch_openai batch --model "$M" --revision demo --format openai --input "$WORK/openai.jsonl" \
    --output OUTFILE --quiet
run generate generate --model "$M" --revision demo --schema-file $S \
    --context "Our production payment service is down." --max-new-tokens 8

for c in "" score batch merge logprobs generate eval calibrate serve demo-model; do
    a=$("$OLD" $c --help 2>&1 | sed "s#$(basename "$OLD")#forkscore#")
    b=$("$NEW" $c --help 2>&1 | sed "s#$(basename "$NEW")#forkscore#")
    if [ "$a" = "$b" ]; then echo "same  ${c:-forkscore} --help"; else echo "DIFF  ${c:-forkscore} --help"; failed=1; fi
done
exit $failed
