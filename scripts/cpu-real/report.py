#!/usr/bin/env python3
"""Merge one scripts/cpu-real/run.sh run into report.md and report.json.

    python3 scripts/cpu-real/report.py OUTDIR

Speed: forkscore (modes-*.json of the modes bench) beside transformers (peer*.json) on the same
token ids, ratios computed from figures of the same run. FLOP floor: 2 x non-embedding
parameters x tokens fed (prefix + every row's suffix) / the f32 matmul rate measured in the same
run (gemm_peak.json). Fidelity of a quantized run: per field, the argmax code and the softmax
over the field's code logits (temperature 1) against the f32 run's dump.
"""
import json, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quant_fidelity import compare_case  # noqa: E402

out = Path(sys.argv[1])
load = lambda name: json.loads((out / name).read_text()) if (out / name).exists() else None
NON_EMBED = 494_032_768 - 151_936 * 896  # Qwen2.5-0.5B: all parameters minus the tied embedding

peak = (load("gemm_peak.json") or {}).get("peak_gflops")
f32 = load("modes-f32.json")
dump = load("dump-f32.json")
peer = load("peer.json") or {"cases": []}
ind = load("modes-f32-independent.json")
peer_ind = load("peer-independent.json") or {"cases": []}
peer_by = {c["fields"]: c["modes"] for c in peer["cases"]}
peer_ind_by = {c["fields"]: c["modes"] for c in peer_ind["cases"]}
dump_by = {c["fields"]: c for c in (dump or {}).get("cases", [])}


def ms(x):
    return f"{x:,.0f}" if isinstance(x, (int, float)) else "—"


def ratio(a, b):
    return f"{a / b:.2f}x" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "—"


def floor_ms(fields):
    c = dump_by.get(fields)
    if not c or not peak:
        return None
    tokens = c["prefix_tokens"] + sum(len(r["suffix_ids"]) for r in c["rows"])
    return 2 * NON_EMBED * tokens / (peak * 1e9) * 1e3


lines = ["# CPU bench: forkscore vs transformers, seeded Qwen2.5-0.5B-Instruct shape (f32)", ""]
lines.append(f"f32 matmul rate measured in this run (torch, {(load('gemm_peak.json') or {}).get('threads')} threads): "
             f"{peak:.1f} GFLOP/s" if peak else "no gemm_peak.json")
lines += ["", "| fields | prefix tokens | forkscore parallel ms | forkscore cached-serial ms | forkscore prefill ms (in parallel) "
          "| transformers batched ms | transformers cached-serial ms | transformers prefill ms | parallel vs transformers batched "
          "| cached-serial / parallel | FLOP floor ms |", "|---|---|---|---|---|---|---|---|---|---|---|"]
report = {"rows": [], "quantized": []}
for r in (f32 or {}).get("rows", []):
    f = r["fields"]
    p = peer_by.get(f, {})
    pm = lambda m: p.get(m, {}).get("ms")
    prefill = (r.get("stages_ms") or {}).get("parallel", {}) or {}
    row = {"fields": f, "prefix_tokens": r["prefix_tokens"], "parallel_ms": r["parallel_ms"],
           "cached_serial_ms": r["cached_serial_ms"], "prefill_ms": prefill.get("prefill"),
           "score_ms": prefill.get("score"),
           "hf_batched_ms": pm("batched"), "hf_cached_serial_ms": pm("cached_serial"), "hf_prefill_ms": pm("prefill"),
           "floor_ms": floor_ms(f), "profile_parallel": r.get("profile_parallel")}
    report["rows"].append(row)
    lines.append(f"| {f} | {r['prefix_tokens']} | {ms(r['parallel_ms'])} | {ms(r['cached_serial_ms'])} | {ms(row['prefill_ms'])} "
                 f"| {ms(pm('batched'))} | {ms(pm('cached_serial'))} | {ms(pm('prefill'))} "
                 f"| {ratio(pm('batched'), r['parallel_ms'])} | {ratio(r['cached_serial_ms'], r['parallel_ms'])} | {ms(row['floor_ms'])} |")
if ind:
    for r in ind["rows"]:
        hf = peer_ind_by.get(r["fields"], {}).get("independent", {}).get("ms")
        lines += ["", f"Independent (one full forward per field, {r['fields']} fields, one timed run each): "
                  f"forkscore {ms(r['independent_ms'])} ms, transformers {ms(hf)} ms ({ratio(hf, r['independent_ms'])} in forkscore's favour)."]
        report["independent"] = {"fields": r["fields"], "forkscore_ms": r["independent_ms"], "hf_ms": hf}

lines += ["", "## Quantized (in-memory, at load)", "",
          "| scheme | fields | parallel ms | vs f32 parallel | cached-serial ms | resident after load MiB (f32: {}) | load ms | linear weights | argmax agreement vs f32 | max abs Δp vs f32 |".format(
              ms((f32 or {}).get("rss_after_load_mib"))),
          "|---|---|---|---|---|---|---|---|---|---|"]
f32_rows = {r["fields"]: r for r in (f32 or {}).get("rows", [])}
for scheme in ("q8_0", "q4k"):
    q = load(f"modes-{scheme}.json")
    qd = load(f"dump-{scheme}.json")
    if not q:
        continue
    qdump = {c["fields"]: c for c in (qd or {}).get("cases", [])}
    for r in q["rows"]:
        f = r["fields"]
        fid = compare_case(dump_by.get(f), qdump.get(f)) or {"agree": 0, "rows": 0, "max_abs_dp": float("nan")}
        agree, total, dp = fid["agree"], fid["rows"], fid["max_abs_dp"]
        base = f32_rows.get(f, {}).get("parallel_ms")
        weights = ", ".join(f"{k} {v}" for k, v in (q.get("linear_weights") or {}).items())
        report["quantized"].append({"scheme": scheme, "fields": f, "parallel_ms": r["parallel_ms"], "cached_serial_ms": r["cached_serial_ms"],
                                    "rss_after_load_mib": q.get("rss_after_load_mib"), "load_ms": q.get("load_ms"),
                                    "linear_weights": q.get("linear_weights"), "argmax_agree": agree, "rows": total, "max_abs_dp": dp})
        lines.append(f"| {scheme} | {f} | {ms(r['parallel_ms'])} | {ratio(base, r['parallel_ms'])} faster | {ms(r['cached_serial_ms'])} "
                     f"| {ms(q.get('rss_after_load_mib'))} | {ms(q.get('load_ms'))} | {weights} | {agree}/{total} | {dp:.4f} |")
lines += ["", "Resident memory is the process RSS right after loading (weights, tokenizer, allocator), "
          "f32 run: {} MiB.".format(ms((f32 or {}).get("rss_after_load_mib"))), ""]
(out / "report.md").write_text("\n".join(lines) + "\n")
(out / "report.json").write_text(json.dumps(report, indent=1))
print("\n".join(lines))
