#!/usr/bin/env bash
# Materialises the patched candle crates that scripts/build-cuda.sh builds against:
# candle-kernels compiled to fat binaries (machine code for sm_80 / sm_90 — FORKSCORE_CUDA_ARCHS —
# plus PTX of the highest architecture for newer GPUs) instead of PTX text, and candle-core
# loading those images. Without the patch a fresh process JIT-compiles candle's PTX at first use
# (seconds per module). CPU builds use the crates.io versions unchanged.
#
# In:  $1 = destination folder; the crates.io sources of candle-kernels / candle-core at the
#      version in Cargo.lock (fetched by `cargo fetch` if absent).
# Out: $1/candle-kernels, $1/candle-core (patched copies); prints cargo's `--config` arguments,
#      one per line.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="$1"
VERSION="$(awk '/^name = "candle-core"$/ {getline; gsub(/"/, "", $3); print $3; exit}' "$REPO/Cargo.lock")"
[ "$VERSION" = "0.11.1" ] || { echo "candle-fatbin.patch is for candle 0.11.1, Cargo.lock has $VERSION" >&2; exit 1; }
(cd "$REPO" && cargo fetch --quiet)
REG="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/candle-core-"$VERSION" | head -1)"
REG="$(dirname "$REG")"
# Patch a fresh copy, then move into $DEST only the files whose content changed: an unchanged
# file keeps its mtime, so candle-kernels' build script (which recompiles a kernel whose source
# is newer than its image: ~20 minutes for all of them on 2 cores) does not run again.
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
cp -r "$REG/candle-kernels-$VERSION" "$STAGE/candle-kernels"
cp -r "$REG/candle-core-$VERSION" "$STAGE/candle-core"
patch --quiet -d "$STAGE" -p1 < "$REPO/scripts/cuda-patches/candle-fatbin.patch"
mkdir -p "$DEST"
for crate in candle-kernels candle-core; do
  (cd "$STAGE/$crate" && find . -type f) | while read -r f; do
    if ! cmp -s "$STAGE/$crate/$f" "$DEST/$crate/$f" 2>/dev/null; then
      mkdir -p "$(dirname "$DEST/$crate/$f")"
      cp -f "$STAGE/$crate/$f" "$DEST/$crate/$f"
    fi
  done
  # files the patched copy no longer has
  (cd "$DEST/$crate" && find . -type f) | while read -r f; do
    [ -e "$STAGE/$crate/$f" ] || rm -f "$DEST/$crate/$f"
  done
done
for crate in candle-kernels candle-core; do
  printf -- '--config\npatch.crates-io.%s.path="%s"\n' "$crate" "$DEST/$crate"
done
