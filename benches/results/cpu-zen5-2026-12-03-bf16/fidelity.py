"""Labels and max |Δp| of each bf16 / q8_0 run against the first f32 run, per field count
(scripts/quant_fidelity.py's compare_case), and the per-round times:
    python3 fidelity.py  (from this folder)"""
import json, sys
from pathlib import Path
here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[2] / "scripts"))
from quant_fidelity import compare_case  # noqa: E402
load = lambda n: json.loads((here / n).read_text())
cases = lambda d: {c["fields"]: c for c in d["cases"]}
base = cases(load("dump-f32-1.json"))
for name in ["f32-2", "bf16w-1", "bf16w-2", "q8_0-1", "q8_0-2"]:
    got = cases(load(f"dump-{name}.json"))
    for f in sorted(base):
        r = compare_case(base[f], got[f])
        print(f"{name:8} {f:3} fields: labels {r['agree']}/{r['rows']}, max |dp| {r['max_abs_dp']:.4f}")
for name in ["f32-1", "bf16w-1", "q8_0-1", "q8_0-2", "bf16w-2", "f32-2"]:
    m = load(f"{name}/modes.json")
    print(name, [(r["fields"], round(r["parallel_ms"])) for r in m["rows"]], "rss", m.get("rss_after_load_mib"))
