T0=$(date +%s); el(){ echo $(( $(date +%s)-T0 )); }; export COMMIT=c3f1112; mkdir -p $OUT/tput $OUT/modes; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; ls -l /usr/bin/time
CLIENTS=1,16,64 LOAD_S=8 BATCH_CONTEXTS=512 LOAD_OPTIONS='{"layout": "fields-first"}' BATCH_EXTRA="--layout fields-first" OUT=$OUT/tput timeout 400 bash scripts/gpu-real/throughput.sh; echo "TPUT rc $? at $(el)s"
L=$(( 545 - $(el) )); echo "left for modes: $L s"
if (( L > 90 )); then
 rm -rf /tmp/gr
 (for i in $(seq 600); do if [ -d /tmp/gr/ckpt ]; then for m in qwen35-4b qwen25-1.5b; do [ -f /tmp/gpu-tput/ckpt/$m/.done ] && ln -s /tmp/gpu-tput/ckpt/$m /tmp/gr/ckpt/$m && echo "LINKED $m"; done; break; fi; sleep 0.05; done) &
 WORK=/tmp/gr TOTAL_S=$((L-10)) SKIP_PEER=1 SKIP_BATCH=1 BENCH_FIELDS=8,28 BENCH_WORDS=600 BENCH_MODES_qwen35_4b=parallel BENCH_MODES_qwen25_1_5b=parallel OUT=$OUT/modes timeout $L bash scripts/gpu-real/run.sh; echo "MODES rc $? at $(el)s"
 cat /tmp/gr/checkpoints.jsonl
 (cd $OUT/modes && f=$(ls bench-*.log report.md peer.log batch.log 2>/dev/null) && [ -n "$f" ] && tar czf extra.tar.gz $f && rm -f $f)
fi
find $OUT -type f | xargs ls -l; echo "END at $(el)s"
