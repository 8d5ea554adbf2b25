#!/usr/bin/env bash
# Build the fuzz targets with coverage instrumentation on a stable toolchain and run each for
# SECONDS (default 600) with libFuzzer, one after the other. See README.md.
set -euo pipefail
cd "$(dirname "$0")"
SECONDS_PER_TARGET="${1:-600}"
shift || true
TARGETS=("${@:-schema jsonl_record safetensors config prompt_split}")
export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares"
cargo build --release --bins --target x86_64-unknown-linux-gnu
for t in ${TARGETS[@]}; do
  mkdir -p "work/$t" "artifacts/$t"
  ./target/x86_64-unknown-linux-gnu/release/"$t" "work/$t" "corpus/$t" \
    -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=4096 -timeout=20 \
    -artifact_prefix="artifacts/$t/" -print_final_stats=1 2>&1 | tee "work/$t.log" | grep -E "^(#[0-9]+ +(INITED|DONE|pulse))|stat::|SUMMARY|panicked" || true
done
