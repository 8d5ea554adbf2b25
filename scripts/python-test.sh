#!/usr/bin/env bash
# The Python package's tests (python/tests, pytest), run by the README's test command after
# `cargo test --workspace`: installs maturin and pytest when absent, builds the package with
# maturin (dev profile: it reuses the dependencies `cargo test` compiled), installs the wheel
# and runs pytest against the `forkscore` binary `cargo test` built.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TARGET=${CARGO_TARGET_DIR:-target}
pip_install() {
    # (a Debian system Python refuses plain pip installs: PEP 668)
    "$PY" -m pip install --quiet --disable-pip-version-check --no-cache-dir "$@" \
        || "$PY" -m pip install --quiet --disable-pip-version-check --break-system-packages "$@"
}
"$PY" -c 'import pytest' 2>/dev/null || pip_install pytest
command -v maturin >/dev/null || "$PY" -c 'import maturin' 2>/dev/null || pip_install 'maturin>=1.9.4,<2'
MATURIN=(maturin)
command -v maturin >/dev/null || MATURIN=("$PY" -m maturin)
# the CLI the tests compare with, from this tree (after `cargo test --workspace` this is a no-op:
# the python crate's dependencies resolve the same features, see python/Cargo.toml)
cargo build -q -p forkscore-pipeline -p forkscore-python
WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT
"${MATURIN[@]}" build --quiet --profile dev --manifest-path python/Cargo.toml --interpreter "$PY" --out "$WHEELS"
pip_install --force-reinstall --no-deps "$WHEELS"/forkscore-*.whl
export FORKSCORE_BIN=${FORKSCORE_BIN:-$(realpath "$TARGET/debug/forkscore")}
# run from the tests' folder, so `import forkscore` is the installed package
cd python/tests
"$PY" -m pytest -q
