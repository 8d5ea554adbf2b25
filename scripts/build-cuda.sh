#!/usr/bin/env bash
# Builds forkscore with the candle `cuda` feature on a machine WITHOUT a GPU or a
# system CUDA, using the toolchain from scripts/cuda-toolchain.sh, and stages
# stripped binaries plus a run wrapper into a carry folder for the GPU machine.
#
# In:  the repository; env CUDA_VENV (default /work/cuda-venv),
#      CARGO_TARGET_DIR (default /work/cuda-target, kept apart from CPU builds
#      because the features differ), CARRY_DIR (default <repo>/carry),
#      CUDA_COMPUTE_CAP (default 90 = H100/H200: forkscore's kernels), FORKSCORE_CUDA_ARCHS
#      (default 80,90: machine code of candle's kernels, see scripts/cuda-patches/), NICE (default 10).
# Out: $CARRY_DIR/{forkscore,modes-bench,gpu-tests}.xz, run.sh, gpu-device-run.sh,
#      parallel_schema.json
#      run.sh sets LD_LIBRARY_PATH for the GPU machine (driver libcuda.so.1 in
#      /usr/local/nvidia/lib64, cuBLAS/cuRAND/cudart 13 in the torch venv).
# All three targets are built by ONE cargo invocation in the release profile: separate
# `cargo build -p …` / `cargo bench` / `cargo test --release` runs resolve features for
# different package sets and profiles, which changes candle-kernels' hash and recompiles
# the CUDA kernels (~25 minutes on 2 cores) once per combination.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CUDA_HOME="$("$REPO/scripts/cuda-toolchain.sh")"
export CUDA_HOME
export PATH="$CUDA_HOME/bin:$PATH"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
export CUDARC_CUDA_VERSION=13000
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/cuda-target}"
CARRY_DIR="${CARRY_DIR:-$REPO/carry}"
NICE="${NICE:-10}"

mkdir -p "$CARRY_DIR"
cd "$REPO"

# Runs a cargo build and prints the executable paths it produced (JSON messages).
cargo_exes() {
  nice -n "$NICE" cargo "$@" --message-format=json-render-diagnostics \
    | jq -r 'select(.reason == "compiler-artifact" and .executable != null) | "\(.target.kind[0]) \(.target.name) \(.executable)"'
}

# Strip and xz-compress one executable into the carry folder as <name>.xz (a stripped
# binary is ~58 MB, mostly embedded PTX/cubins; xz brings it to ~14 MB, so three fit the
# device tool's 64 MiB carry limit). The device script unpacks them.
stage() { # src name
  local tmp="$CARRY_DIR/.$2.tmp"
  cp -f "$1" "$tmp"
  strip "$tmp"
  nice -n "$NICE" xz -9 -T2 -c "$tmp" > "$CARRY_DIR/$2.xz.tmp"
  rm -f "$tmp" "$CARRY_DIR/$2"
  mv -f "$CARRY_DIR/$2.xz.tmp" "$CARRY_DIR/$2.xz"
  echo "staged $CARRY_DIR/$2.xz ($(du -h "$CARRY_DIR/$2.xz" | cut -f1))" >&2
}

# candle with its kernels as fat binaries (machine code, no JIT at first use): patched copies
# under the target folder, passed as `[patch]` tables on the command line; cargo records the
# patch in Cargo.lock, which is restored afterwards (CPU builds use the registry crates).
PATCHED="$CARGO_TARGET_DIR/patched-candle"
mapfile -t PATCH_ARGS < <("$REPO/scripts/cuda-patches/apply.sh" "$PATCHED")
cp -f Cargo.lock "$CARGO_TARGET_DIR/Cargo.lock.orig"
trap 'cp -f "$CARGO_TARGET_DIR/Cargo.lock.orig" "$REPO/Cargo.lock"' EXIT
export FORKSCORE_CUDA_ARCHS="${FORKSCORE_CUDA_ARCHS:-80,90}"

# bin forkscore, bench modes (harness = false: a plain main) and the GPU test binary.
exes="$(cargo_exes build --profile release "${PATCH_ARGS[@]}" \
  -p forkscore-pipeline -p forkscore-benches -p forkscore-backends \
  --features forkscore-backends/cuda --bin forkscore --bench modes --test gpu)"
pick() { awk -v k="$1" -v n="$2" '$1 == k && $2 == n {print $3}' <<<"$exes"; }
stage "$(pick bin forkscore)" forkscore
stage "$(pick bench modes)" modes-bench
stage "$(pick test gpu)" gpu-tests

cat > "$CARRY_DIR/run.sh" <<'WRAP'
#!/usr/bin/env bash
# Runs a carried CUDA binary on the GPU machine: run.sh <binary> [args...]
# (no RUNPATH in the binaries, so the CUDA user-space libraries come from here).
export LD_LIBRARY_PATH="/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$@"
WRAP
chmod +x "$CARRY_DIR/run.sh"
# The one-call device script and the schema it scores with.
cp -f "$REPO/scripts/gpu-device-run.sh" "$CARRY_DIR/"
cp -f "$REPO/fixtures/examples/parallel_schema.json" "$CARRY_DIR/"
du -sh "$CARRY_DIR" >&2
