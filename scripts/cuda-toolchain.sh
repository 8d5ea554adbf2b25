#!/usr/bin/env bash
# Installs a CUDA 13.0 build toolchain from PyPI wheels into a venv OUTSIDE the
# repository (no system CUDA, no GPU needed), shaped as a CUDA_HOME:
#   $CUDA_VENV/lib/python3*/site-packages/nvidia/cu13/{bin,include,lib,lib64,nvvm}
# plus unversioned .so links and a link-time stub libcuda.so generated from
# cudarc's driver symbol list. Idempotent: re-running only fills what is missing.
#
# Env: CUDA_VENV (default /work/cuda-venv). Prints the CUDA_HOME path last.
# Pins: CUDA 13.0 (the GPU machine's driver is 580.x = CUDA 13.0; PTX from a newer
# nvcc may not load there). See docs/GPU.md.
set -euo pipefail

CUDA_VENV="${CUDA_VENV:-/work/cuda-venv}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

PINS=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
  nvidia-cuda-nvrtc==13.0.88
  nvidia-cublas==13.0.2.14
  nvidia-curand==10.4.0.35
)

if [[ ! -x "$CUDA_VENV/bin/python" ]]; then
  python3 -m venv "$CUDA_VENV"
fi
# pip skips already-satisfied pins, so this is cheap on re-runs.
"$CUDA_VENV/bin/python" -m pip install -q --disable-pip-version-check "${PINS[@]}" >&2

SITE="$("$CUDA_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
CUDA_HOME="$SITE/nvidia/cu13"
[[ -x "$CUDA_HOME/bin/nvcc" ]] || { echo "nvcc missing under $CUDA_HOME" >&2; exit 1; }

# lib64 -> lib (candle/cudarc build scripts look in both).
[[ -e "$CUDA_HOME/lib64" ]] || ln -s lib "$CUDA_HOME/lib64"

# Unversioned links the linker needs (-lcudart -lcublas -lcublasLt -lnvrtc -lcurand).
link_unversioned() { # name soname
  local lib="$CUDA_HOME/lib"
  [[ -e "$lib/$2" ]] || { echo "missing $lib/$2" >&2; exit 1; }
  [[ -e "$lib/$1" ]] || ln -s "$2" "$lib/$1"
}
link_unversioned libcudart.so   libcudart.so.13
link_unversioned libcublas.so   libcublas.so.13
link_unversioned libcublasLt.so libcublasLt.so.13
link_unversioned libnvrtc.so    libnvrtc.so.13
link_unversioned libcurand.so   libcurand.so.10

# Link-time stub libcuda.so (SONAME libcuda.so.1): one empty function per cu*
# symbol declared in cudarc's driver bindings. The real driver is used at run time.
STUB_DIR="$CUDA_HOME/lib/stubs"
if [[ ! -e "$STUB_DIR/libcuda.so" ]]; then
  (cd "$REPO" && cargo fetch -q) >&2
  CUDARC_VER="$(awk '/^name = "cudarc"/{getline; gsub(/[" ]/,"",$0); sub("version=","",$0); print; exit}' "$REPO/Cargo.lock")"
  SYS_DIR="$(ls -d "$HOME"/.cargo/registry/src/*/cudarc-"$CUDARC_VER"/src/driver/sys 2>/dev/null | head -n1)"
  [[ -d "$SYS_DIR" ]] || { echo "cudarc $CUDARC_VER sources not found" >&2; exit 1; }
  mkdir -p "$STUB_DIR"
  grep -rhoE 'pub unsafe fn cu[A-Za-z0-9_]+' "$SYS_DIR" \
    | awk '{print $4}' | sort -u \
    | awk 'BEGIN{print "/* generated link-time stub of libcuda; never executed */"} {print "void " $1 "(void) {}"}' \
    > "$STUB_DIR/libcuda_stub.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$STUB_DIR/libcuda.so" "$STUB_DIR/libcuda_stub.c"
  ln -sf libcuda.so "$STUB_DIR/libcuda.so.1"
  echo "stub libcuda.so: $(wc -l < "$STUB_DIR/libcuda_stub.c") symbols from $SYS_DIR" >&2
fi

echo "$CUDA_HOME"
