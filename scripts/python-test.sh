#!/usr/bin/env bash
# The Python package's tests (python/tests, pytest), run by the README's test command after
# `cargo test --workspace`: in a virtual environment (scripts/python-venv.sh: $FORKSCORE_VENV,
# default target/py-venv; the system Python is never installed into) it installs pytest,
# maturin, pandas, tqdm and the openai client when absent, builds the package with maturin (dev
# profile: it reuses the dependencies `cargo test` compiled), installs the wheel and runs pytest
# against the `forkscore` binary `cargo test` built (FORKSCORE_BIN to use another).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${CARGO_TARGET_DIR:-target}
source scripts/python-venv.sh
python_venv pytest 'maturin>=1.9.4,<2' pandas tqdm openai
# the CLI the tests compare with, from this tree (after `cargo test --workspace` this is a no-op:
# the python crate's dependencies resolve the same features, see python/Cargo.toml)
cargo build -q -p forkscore-pipeline -p forkscore-python
WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT
"$PY" -m maturin build --quiet --profile dev --manifest-path python/Cargo.toml --interpreter "$PY" --out "$WHEELS"
"$PY" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$WHEELS"/forkscore-*.whl
export FORKSCORE_BIN=${FORKSCORE_BIN:-$(realpath "$TARGET/debug/forkscore")}
# run from the tests' folder, so `import forkscore` is the installed package
cd python/tests
"$PY" -m pytest -q "$@"
