set -uo pipefail
B=/tmp/forkscore-bin; mkdir -p $B; cp -f carry/run.sh $B/
python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' carry/forkscore.xz $B/forkscore; chmod +x $B/forkscore
timeout 100 python3 scripts/gpu-real/write_checkpoints.py /tmp/ck --models qwen35-4b,qwen25-1.5b --device cuda --dtype bfloat16 >/dev/null 2>&1
for m in qwen35-4b qwen25-1.5b; do
M=/tmp/ck/$m
timeout 100 python3 scripts/gpu-real/batch_case.py --forkscore "$B/run.sh $B/forkscore" --model $M --out $OUT/b-$m.json --contexts 48 --fields 8 --tokens 830 --work /tmp/w-$m --modes direct 2>&1 | grep batch
for extra in "--batch-mode grouped" "--batch-mode grouped --prefill-chunk 1300" "--batch-mode direct"; do
  n=$(echo $extra | tr -dc 'a-z0-9'); rm -f /tmp/w-$m/out-$n.jsonl
  echo "== $m $extra"
  FORKSCORE_PROFILE=1 $B/run.sh $B/forkscore batch --quiet --model $M --revision bench --device cuda --dtype bf16 --input /tmp/w-$m/in.jsonl --output /tmp/w-$m/out-$n.jsonl --schema-file /tmp/w-$m/schema.json $extra 2>&1 | grep -v "^\s*$" | tail -30
done
python3 scripts/gpu-real/batch_timings.py /tmp/w-$m/out-*.jsonl
done
