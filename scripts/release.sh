#!/usr/bin/env bash
# Builds the prebuilt artefacts of one release into one folder (docs/install.md describes them):
#   forkscore-<version>-cp39-abi3-manylinux_2_34_x86_64.whl   (ZIG=1: manylinux_2_28) the Python package (maturin, release
#       profile, stripped; one abi3 wheel for every CPython >= 3.9, on glibc >= 2.34, ZIG=1: 2.28)
#   forkscore-<version>-x86_64-linux-cpu.tar.gz    the stripped `forkscore` binary (release profile,
#       CPU), README.md, LICENSE when the repository has one, docs/*.md, examples/
#   forkscore-<version>-x86_64-linux-cuda.tar.gz   only when a carry folder of scripts/build-cuda.sh
#       holds forkscore.xz (this script never runs the CUDA build)
#   SHA256SUMS                                     over all of the above (`sha256sum -c SHA256SUMS`)
#
# Usage: scripts/release.sh [OUTDIR]
# Env:   OUT            the output folder when OUTDIR is not given (default target/release-artifacts)
#        WHEEL_COMPAT   maturin's --compatibility (default manylinux_2_34, with ZIG=1 manylinux_2_28).
#                       maturin checks the glibc symbol versions the extension uses and refuses a
#                       tag they do not fit: linked on a newer glibc (Debian 12's 2.36) the
#                       extension needs GLIBC_2.34, so manylinux_2_28 is refused without zig.
#                       `linux` gives the native tag.
#        ZIG            1: link against the symbols of glibc $ZIG_GLIBC (default 2.28) with zig, so the
#                       artefacts run on older distributions (RHEL 8, Debian 11, Ubuntu 20.04): the
#                       wheel through `maturin --zig`, the binary through `cargo zigbuild`
#                       (ziglang and cargo-zigbuild are pip-installed into the venv). Each builds
#                       its dependencies apart from the host builds (cross target folder, other flags).
#        CARRY_DIR      the CUDA carry folder to package (default <repo>/carry)
#        NICE           niceness of the builds (default 10)
#        CARGO_TARGET_DIR, PYTHON, FORKSCORE_VENV  as for cargo and scripts/python-venv.sh
# The wheel and the binary come from ONE feature resolution: the binary is built with
# `-p forkscore-pipeline -p forkscore-python`, the package set maturin's build resolves, so the
# second build reuses every dependency the first compiled (building the pipeline alone would
# resolve other features for getrandom and recompile candle and the tokenizers).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
OUT_DIR=${1:-${OUT:-target/release-artifacts}}
ZIG=${ZIG:-0}
ZIG_GLIBC=${ZIG_GLIBC:-2.28}
if [ "$ZIG" = 1 ]; then
    WHEEL_COMPAT=${WHEEL_COMPAT:-manylinux_${ZIG_GLIBC/./_}}
else
    WHEEL_COMPAT=${WHEEL_COMPAT:-manylinux_2_34}
fi
CARRY_DIR=${CARRY_DIR:-$REPO/carry}
NICE=${NICE:-10}
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
step() { echo "==> $*"; }
# the newest glibc symbol version a binary needs (its oldest usable glibc)
glibc_needed() { objdump -T "$1" | grep -oE 'GLIBC_2\.[0-9]+' | sort -uV | tail -1 | sed 's/GLIBC_//'; }

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
    echo "error: the artefacts are named for Linux x86_64; this machine is $(uname -s) $(uname -m)" >&2
    exit 1
fi
VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
if [ -z "$VERSION" ]; then
    echo "error: no version in Cargo.toml's [workspace.package]" >&2
    exit 1
fi
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
# only this release's artefacts are replaced; anything else in the folder is left alone
rm -f "$OUT_DIR"/forkscore-*.whl "$OUT_DIR"/forkscore-*.tar.gz "$OUT_DIR"/SHA256SUMS
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
START=$(date +%s)
step "forkscore $VERSION -> $OUT_DIR (glibc $(ldd --version | head -1 | awk '{print $NF}'), $(nproc) cores)"

# (a) the wheel: maturin from the venv of the test scripts, never the system Python
source scripts/python-venv.sh
python_venv 'maturin>=1.9.4,<2'
ZIG_ARGS=()
if [ "$ZIG" = 1 ]; then
    python_venv ziglang
    [ -x "$(dirname "$PY")/cargo-zigbuild" ] \
        || "$PY" -m pip install --quiet --disable-pip-version-check cargo-zigbuild
    # (maturin runs zig as `python -m ziglang` with the python on PATH; cargo finds `cargo-zigbuild` there)
    export PATH="$(dirname "$PY"):$PATH"
    ZIG_ARGS=(--zig)
fi
step "wheel: maturin build --release --compatibility $WHEEL_COMPAT ${ZIG_ARGS[*]}"
nice -n "$NICE" "$PY" -m maturin build --release --strip --compatibility "$WHEEL_COMPAT" "${ZIG_ARGS[@]}" \
    --manifest-path python/Cargo.toml --interpreter "$PY" --out "$OUT_DIR"
step "wheel built ($(( $(date +%s) - START )) s so far)"

# (b) the CPU binary tarball
if [ "$ZIG" = 1 ]; then
    step "binary: cargo zigbuild --release --target x86_64-unknown-linux-gnu.$ZIG_GLIBC (forkscore)"
    nice -n "$NICE" cargo zigbuild --release --target "x86_64-unknown-linux-gnu.$ZIG_GLIBC" \
        -p forkscore-pipeline -p forkscore-python --bin forkscore
    CPU_BIN=$TARGET/x86_64-unknown-linux-gnu/release/forkscore
else
    step "binary: cargo build --release (forkscore)"
    nice -n "$NICE" cargo build --release -p forkscore-pipeline -p forkscore-python --bin forkscore
    CPU_BIN=$TARGET/release/forkscore
fi
# Stages one tarball: the binary (stripped), README, LICENSE, docs and the example schemas.
package() { # variant binary-source notes
    local name="forkscore-$VERSION-x86_64-linux-$1" dir
    dir="$STAGE/$name"
    mkdir -p "$dir/docs"
    cp "$2" "$dir/forkscore"
    chmod 755 "$dir/forkscore"
    strip "$dir/forkscore"
    cp README.md "$dir/"
    for f in LICENSE LICENSE-MIT LICENSE.md LICENSE.txt; do
        if [ -f "$f" ]; then cp "$f" "$dir/"; fi
    done
    cp docs/*.md "$dir/docs/"
    cp -r fixtures/examples "$dir/examples"
    printf '%s\nNeeds glibc >= %s (Linux x86_64).\n' "$3" "$(glibc_needed "$dir/forkscore")" > "$dir/RELEASE.txt"
    # (sorted names, no owner, gzip without a timestamp: the same inputs give the same bytes)
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}" \
        -C "$STAGE" -cf - "$name" | gzip -9 -n > "$OUT_DIR/$name.tar.gz"
    step "packaged $name.tar.gz ($(du -h "$OUT_DIR/$name.tar.gz" | cut -f1); the binary needs glibc >= $(glibc_needed "$dir/forkscore"))"
}
COMMIT=$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo " with uncommitted changes")
package cpu "$CPU_BIN" "forkscore $VERSION ($COMMIT), Linux x86_64, CPU build (release profile).
Start: ./forkscore demo-model demo && ./forkscore score --model demo --schema-file examples/parallel_schema.json --context \"...\"
The example schemas are in examples/ (README.md's fixtures/examples); the documentation is README.md and docs/."

# (c) the CUDA binary, only from an existing carry folder of scripts/build-cuda.sh
if [ -f "$CARRY_DIR/forkscore.xz" ]; then
    step "cuda: packaging $CARRY_DIR/forkscore.xz (built $(date -u -r "$CARRY_DIR/forkscore.xz" '+%F %H:%M UTC'); not rebuilt)"
    xz -dc "$CARRY_DIR/forkscore.xz" > "$STAGE/forkscore-cuda"
    package cuda "$STAGE/forkscore-cuda" "forkscore $VERSION, Linux x86_64, CUDA build: the binary of scripts/build-cuda.sh's carry folder
(built from the source tree of that run, $(date -u -r "$CARRY_DIR/forkscore.xz" '+%F %H:%M UTC'); this tarball was packaged at $COMMIT).
Kernels for the compute capability that build used (CUDA_COMPUTE_CAP, default 90 = H100/H200).
Needs the NVIDIA driver (libcuda.so.1) and the CUDA 13 user-space libraries (cuBLAS, cuRAND,
cudart) on LD_LIBRARY_PATH; run with --device cuda. See docs/GPU.md."
else
    step "cuda: skipped ($CARRY_DIR/forkscore.xz does not exist: run scripts/build-cuda.sh first to package it)"
fi

# (d) checksums over everything
(cd "$OUT_DIR" && sha256sum forkscore-*.whl forkscore-*.tar.gz > SHA256SUMS)
step "done in $(( $(date +%s) - START )) s:"
(cd "$OUT_DIR" && ls -l forkscore-*.whl forkscore-*.tar.gz SHA256SUMS && cat SHA256SUMS)
