#!/usr/bin/env python3
"""Where a batch job's time went: per output file, the stage timings of its groups (each group's
prefill_ms / score_ms counted once, from its first member), group sizes and the job's totals.

    python3 scripts/gpu-real/batch_timings.py OUT.jsonl [OUT2.jsonl ...]
"""
import json
import sys

for path in sys.argv[1:]:
    recs = [json.loads(l) for l in open(path)]
    ok = [r for r in recs if "error" not in r]
    groups = {}
    for r in ok:
        t = r["telemetry"]
        g = t.get("group") or {}
        if g.get("slot", 0) == 0:
            groups[len(groups)] = (g.get("size", 1), t["timings_ms"])
    pre = sum(tm.get("prefill", 0) for _, tm in groups.values())
    sco = sum(tm.get("score", 0) for _, tm in groups.values())
    tot = sum(tm.get("total", 0) for _, tm in groups.values())
    sizes = sorted({s for s, _ in groups.values()})
    print(f"{path}: {len(ok)} decisions, {len(groups)} groups (sizes {sizes[:5]}{'...' if len(sizes) > 5 else ''}); "
          f"prefill {pre:.0f} ms, score {sco:.0f} ms, group totals {tot:.0f} ms; "
          f"per decision prefill {pre / max(len(ok), 1):.2f} ms, score {sco / max(len(ok), 1):.2f} ms")
