mkdir -p carry && cp carry-tests/* carry/
echo "== heads harness"; timeout 120 python3 scripts/gpu-kernels/heads_harness.py 2>&1 | tail -30
echo "== flash tile probe"; timeout 200 python3 scripts/gpu-kernels/flash_tile_probe.py 2>&1 | tail -12
COMMIT=b35e8c0 OUT=$OUT SKIP_BENCH=1 SKIP_SERVE=1 MODELS=qwen25-1.5b,qwen35-4b SIDES=new TESTS_TIMEOUT=330 bash scripts/gpu-real/forms_ab.sh 2>&1 | tail -25
grep -E "biased heads|^test .*(biased|fused_heads)" /tmp/forms-ab/gpu-tests.log | head -20
cp /tmp/forms-ab/gpu-tests.log $OUT/ 2>/dev/null
