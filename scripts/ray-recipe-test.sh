#!/usr/bin/env bash
# The Ray Data recipe (README "Scale-out with Ray") on a local CPU Ray cluster: in the virtual
# environment of scripts/python-venv.sh (never the system Python) it installs ray[data] and
# maturin when absent, builds and installs the forkscore package (scripts/python-test.sh does
# the same in CI), and checks the recipe's records against `forkscore batch` on the demo model.
# CI runs it last (.ci/run); ray[data] is a large install (see docs/python.md).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${CARGO_TARGET_DIR:-target}
source scripts/python-venv.sh
python_venv 'ray.data:ray[data]' 'maturin>=1.9.4,<2'
# the CLI the tests compare with, from this tree (after `cargo test --workspace` this is a no-op:
# the python crate's dependencies resolve the same features, see python/Cargo.toml)
cargo build -q -p forkscore-pipeline -p forkscore-python
BIN=$(realpath "$TARGET/debug/forkscore")
REPO=$(pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PY" -m maturin build --quiet --profile dev --manifest-path python/Cargo.toml --interpreter "$PY" --out "$WORK/wheels"
"$PY" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$WORK"/wheels/forkscore-*.whl
# from outside the repository, so `import forkscore` is the installed package
cd "$WORK"
"$PY" "$REPO/scripts/ray/recipe_check.py" "$BIN" "$WORK/run"
