#!/usr/bin/env bash
# Checks the artefacts scripts/release.sh made, as a newcomer would use them, outside the
# repository: the checksums; the CPU tarball's binary writes the demo checkpoint and scores the
# example schema; a fresh venv installs the wheel offline (`pip install --no-index`: the wheel
# needs nothing else) and `forkscore.Scorer` scores the same context, with the same labels and
# probabilities as the binary. Prints the time from creating the venv to the first Python score.
# Not run by CI (.ci/run): it needs the release build of scripts/release.sh (~20 min on 2 cores).
#
# Usage: scripts/release-check.sh [ARTEFACTS]   (default: $OUT or target/release-artifacts)
# Env:   PYTHON  the interpreter the venv is made from (default python3)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ART=${1:-${OUT:-$REPO/target/release-artifacts}}
ART=$(cd "$ART" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
fail() { echo "release-check: FAIL: $*" >&2; exit 1; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
CONTEXT="Our production payment service is completely down for every customer, and no one can complete a purchase."

echo "==> checksums ($ART/SHA256SUMS)"
(cd "$ART" && sha256sum -c SHA256SUMS) || fail "a checksum does not match"

shopt -s nullglob
tarballs=("$ART"/forkscore-*-x86_64-linux-cpu.tar.gz)
wheels=("$ART"/forkscore-*.whl)
[ ${#tarballs[@]} -eq 1 ] || fail "expected one CPU tarball in $ART, found ${#tarballs[@]}"
[ ${#wheels[@]} -eq 1 ] || fail "expected one wheel in $ART, found ${#wheels[@]}"

echo "==> binary: $(basename "${tarballs[0]}")"
tar -xzf "${tarballs[0]}"
PKG="$WORK/$(basename "${tarballs[0]}" .tar.gz)"
"$PKG/forkscore" --version
T0=$(now)
"$PKG/forkscore" demo-model "$WORK/demo"
"$PKG/forkscore" score --model "$WORK/demo" --schema-file "$PKG/examples/parallel_schema.json" \
    --context "$CONTEXT" > "$WORK/cli.json"
echo "    demo-model + score: $(secs "$T0" "$(now)") s"

echo "==> wheel: $(basename "${wheels[0]}") into a fresh venv"
T0=$(now)
"${PYTHON:-python3}" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index "${wheels[0]}"
T1=$(now)
"$WORK/venv/bin/python" - "$WORK/demo" "$PKG/examples/parallel_schema.json" "$CONTEXT" "$WORK/cli.json" <<'PY'
import json, math, sys, time

t0 = time.monotonic()
import forkscore

model, schema_file, context, cli_file = sys.argv[1:]
assert forkscore.__file__.find("/venv/") > 0, f"forkscore imported from {forkscore.__file__}"
scorer = forkscore.Scorer.load(model)
t1 = time.monotonic()
result = scorer.score(context, open(schema_file).read())
t2 = time.monotonic()
cli = json.load(open(cli_file))
schema_fields = set(json.load(open(schema_file)))  # the flat schema form: one key per field
assert result["output"] == cli["output"], (result["output"], cli["output"])
for name, field in result["fields"].items():
    scores = field["scores"]
    assert scores == cli["fields"][name]["scores"], f"{name}: Python {scores} != CLI {cli['fields'][name]['scores']}"
    assert math.isclose(sum(scores.values()), 1.0, abs_tol=1e-5), f"{name}: scores sum to {sum(scores.values())}"
assert set(result["fields"]) == schema_fields, (set(result["fields"]), schema_fields)
print(f"    import + load {t1 - t0:.1f} s, score {t2 - t1:.2f} s; output {json.dumps(result['output'])}")
print("    Python and the binary agree on every field's label and probabilities")
PY
T2=$(now)
echo "==> venv + pip install $(secs "$T0" "$T1") s, import + load + first score $(secs "$T1" "$T2") s:" \
    "wheel install to first score $(secs "$T0" "$T2") s"
echo "release-check: OK"
