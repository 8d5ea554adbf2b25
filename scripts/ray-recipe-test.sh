#!/usr/bin/env bash
# The Ray Data recipe (README "Scale-out with Ray") on a local CPU Ray cluster: installs
# ray[data] when absent, builds and installs the forkscore package (scripts/python-test.sh does
# the same in CI), and checks the recipe's records against `forkscore batch` on the demo model.
# CI runs it last (.ci/run); ray[data] is a large install (see the README).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TARGET=${CARGO_TARGET_DIR:-target}
pip_install() {
    "$PY" -m pip install --quiet --disable-pip-version-check --no-cache-dir "$@" \
        || "$PY" -m pip install --quiet --disable-pip-version-check --break-system-packages "$@"
}
"$PY" -c 'import ray.data' 2>/dev/null || pip_install 'ray[data]'
"$PY" -c 'import maturin' 2>/dev/null || command -v maturin >/dev/null || pip_install 'maturin>=1.9.4,<2'
# the CLI the tests compare with, from this tree (after `cargo test --workspace` this is a no-op:
# the python crate's dependencies resolve the same features, see python/Cargo.toml)
cargo build -q -p forkscore-pipeline -p forkscore-python
BIN=$(realpath "$TARGET/debug/forkscore")
REPO=$(pwd)
MATURIN=(maturin)
command -v maturin >/dev/null || MATURIN=("$PY" -m maturin)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"${MATURIN[@]}" build --quiet --profile dev --manifest-path python/Cargo.toml --interpreter "$PY" --out "$WORK/wheels"
pip_install --force-reinstall --no-deps "$WORK"/wheels/forkscore-*.whl
# from outside the repository, so `import forkscore` is the installed package
cd "$WORK"
"$PY" "$REPO/scripts/ray/recipe_check.py" "$BIN" "$WORK/run"
