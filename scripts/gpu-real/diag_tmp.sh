set -uo pipefail
B=/tmp/forkscore-bin; mkdir -p $B; cp -f carry/run.sh $B/
python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' carry/forkscore.xz $B/forkscore; chmod +x $B/forkscore
timeout 100 python3 scripts/gpu-real/write_checkpoints.py /tmp/ck --models qwen35-4b --device cuda --dtype bfloat16 >/dev/null 2>&1
M=/tmp/ck/qwen35-4b
timeout 200 python3 scripts/gpu-real/batch_case.py --forkscore "$B/run.sh $B/forkscore" --model $M --out $OUT/b64.json --contexts 96 --fields 8 --tokens 830 --work /tmp/w 2>&1 | grep batch
for extra in "--prefill-chunk 1300" "--group-max-rows 64"; do
  n=$(echo $extra | tr -dc 'a-z0-9'); rm -f /tmp/w/out-$n.jsonl
  /usr/bin/time -f "%e s wall" $B/run.sh $B/forkscore batch --quiet --model $M --revision bench --device cuda --dtype bf16 --input /tmp/w/in.jsonl --output /tmp/w/out-$n.jsonl --schema-file /tmp/w/schema.json --batch-mode grouped $extra 2>&1 | tail -2
done
python3 scripts/gpu-real/batch_timings.py /tmp/w/out-*.jsonl
FORKSCORE_PROFILE=1 $B/run.sh $B/forkscore score --model $M --revision bench --device cuda --dtype bf16 --schema-file /tmp/w/schema.json --context "$(head -1 /tmp/w/in.jsonl | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["context"])')" 2>&1 | grep -i "prefill\|score\|profile" | head -5
