#!/usr/bin/env python3
"""Merge one scripts/cpu-real/run.sh run into report.md and report.json.

    python3 scripts/cpu-real/report.py OUTDIR

Speed: forkscore (modes-*.json of the modes bench) beside transformers (peer*.json) and
llama.cpp (llama-*.json, llama-bench.jsonl) on the same token ids, ratios computed from figures
of the same run. FLOP floor: 2 x non-embedding parameters x tokens fed (prefix + every row's
suffix) / the f32 matmul rate measured in the same run (gemm_peak.json). Fidelity of a
quantized or bf16 run: per field, the argmax code and the softmax over the field's code logits
(temperature 1) against the f32 run's dump (scripts/quant_fidelity.py).
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


def by_fields(doc):
    return {c["fields"]: c.get("modes", c) for c in (doc or {}).get("cases", [])}


peer_by = by_fields(load("peer.json"))
peer_batched_by = by_fields(load("peer-batched.json"))
peer_ind_by = by_fields(load("peer-independent.json"))
llama_by = {t: by_fields(load(f"llama-{t}.json")) for t in ("f32", "q8_0")}
ind = load("modes-f32-independent.json")
dump_by = {c["fields"]: c for c in (dump or {}).get("cases", [])}


def ms(x):
    return f"{x:,.0f}" if isinstance(x, (int, float)) else "—"


def ratio(a, b):
    return f"{a / b:.2f}×" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "—"


def floor_ms(fields):
    c = dump_by.get(fields)
    if not c or not peak:
        return None
    tokens = c["prefix_tokens"] + sum(len(r["suffix_ids"]) for r in c["rows"])
    return 2 * NON_EMBED * tokens / (peak * 1e9) * 1e3


def mode_ms(modes, m):
    return (modes or {}).get(m, {}).get("ms")


def llama_best(t, f):
    modes = llama_by[t].get(f, {})
    best = [(mode_ms(modes, m), m) for m in ("cached_serial", "batched") if mode_ms(modes, m)]
    return min(best) if best else (None, None)


report = {"rows": [], "quantized": [], "gemm_peak_gflops": peak}
lines = ["# CPU bench: forkscore vs transformers and llama.cpp, seeded Qwen2.5-0.5B-Instruct shape (f32)", ""]
lines.append(f"f32 matmul rate measured in this run (torch, {(load('gemm_peak.json') or {}).get('threads')} threads): "
             f"{peak:.1f} GFLOP/s" if peak else "no gemm_peak.json")
lines += ["", "Per decision, ms (medians). transformers: `prefix batched` = one prefill, the cache repeated to every "
          "row, all suffixes in one padded batch; `batched` = every field's full prompt in one padded batch; "
          "llama.cpp (F32 GGUF, F32 K/V cache): its best of cached-serial (prompt cache copied per row) and "
          "batched (all rows in one decode over the shared prefix).", "",
          "| fields | prefix tokens | forkscore parallel | forkscore cached-serial | transformers prefix batched "
          "| transformers batched | transformers cached-serial | transformers prefill alone | llama.cpp best | "
          "vs transformers prefix batched | vs transformers batched | vs llama.cpp | cached-serial ÷ parallel | FLOP floor |",
          "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
for r in (f32 or {}).get("rows", []):
    f = r["fields"]
    p = peer_by.get(f, {})
    hb = mode_ms(peer_batched_by.get(f), "batched")
    stages = (r.get("stages_ms") or {}).get("parallel", {}) or {}
    lb, lmode = llama_best("f32", f)
    row = {"fields": f, "prefix_tokens": r["prefix_tokens"], "parallel_ms": r["parallel_ms"],
           "cached_serial_ms": r["cached_serial_ms"], "prefill_ms": stages.get("prefill"),
           "score_ms": stages.get("score"), "hf_prefix_batched_ms": mode_ms(p, "prefix_batched"),
           "hf_batched_ms": hb, "hf_cached_serial_ms": mode_ms(p, "cached_serial"),
           "hf_prefill_ms": mode_ms(p, "prefill"), "llama_f32_best_ms": lb, "llama_f32_best_mode": lmode,
           "llama_f32": llama_by["f32"].get(f), "floor_ms": floor_ms(f),
           "profile_parallel": r.get("profile_parallel")}
    report["rows"].append(row)
    lines.append(f"| {f} | {r['prefix_tokens']} | {ms(r['parallel_ms'])} | {ms(r['cached_serial_ms'])} "
                 f"| {ms(row['hf_prefix_batched_ms'])} | {ms(hb)} | {ms(row['hf_cached_serial_ms'])} | {ms(row['hf_prefill_ms'])} "
                 f"| {ms(lb)} | {ratio(row['hf_prefix_batched_ms'], r['parallel_ms'])} | {ratio(hb, r['parallel_ms'])} "
                 f"| {ratio(lb, r['parallel_ms'])} | {ratio(r['cached_serial_ms'], r['parallel_ms'])} | {ms(row['floor_ms'])} |")
lines += ["", "Ratios are the peer's time divided by forkscore parallel's (above 1: forkscore is faster)."]
if ind:
    for r in ind["rows"]:
        hf = mode_ms(peer_ind_by.get(r["fields"]), "independent")
        lines += ["", f"Independent (one full forward per field, {r['fields']} fields, one timed run each): "
                  f"forkscore {ms(r['independent_ms'])} ms, transformers {ms(hf)} ms ({ratio(hf, r['independent_ms'])} in forkscore's favour)."]
        report["independent"] = {"fields": r["fields"], "forkscore_ms": r["independent_ms"], "hf_ms": hf}

bench = []
if (out / "llama-bench.jsonl").exists():
    for line in (out / "llama-bench.jsonl").read_text().splitlines():
        try:
            bench.append(json.loads(line))
        except ValueError:
            pass
if bench:
    lines += ["", "llama-bench on the same GGUF files (same threads): tokens/s, mean ± sd.", "",
              "| file type | test | tokens/s |", "|---|---|---:|"]
    for b in bench:
        test = f"pp{b['n_prompt']}" if b.get("n_prompt") else f"tg{b.get('n_gen')}"
        lines.append(f"| {b.get('model_type', '?')} | {test} | {b.get('avg_ts', 0):,.1f} ± {b.get('stddev_ts', 0):,.1f} |")
    report["llama_bench"] = bench

lines += ["", "## Quantized and bf16 (in-memory, at load)", "",
          "| scheme | fields | forkscore parallel | vs f32 parallel | forkscore cached-serial | llama.cpp Q8_0 best | "
          "resident after load MiB (f32: {}) | load ms | linear weights | argmax agreement vs f32 | max abs Δp vs f32 |".format(
              ms((f32 or {}).get("rss_after_load_mib"))),
          "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
f32_rows = {r["fields"]: r for r in (f32 or {}).get("rows", [])}
# file name -> the row's label (`bf16w`: --quantize bf16; `bf16`: the whole model in bf16, --dtype bf16)
labels = {"q8_0": "q8_0", "q4k": "q4k", "bf16w": "bf16 weights", "bf16": "bf16 dtype"}
for scheme, label in labels.items():
    q = load(f"modes-{scheme}.json")
    if not q:
        continue
    qdump = {c["fields"]: c for c in (load(f"dump-{scheme}.json") or {}).get("cases", [])}
    for r in q["rows"]:
        f = r["fields"]
        fid = compare_case(dump_by.get(f), qdump.get(f)) or {"agree": 0, "rows": 0, "max_abs_dp": float("nan")}
        base = f32_rows.get(f, {}).get("parallel_ms")
        lq = llama_best("q8_0", f)[0] if scheme == "q8_0" else None
        weights = ", ".join(f"{k} {v}" for k, v in (q.get("linear_weights") or {}).items())
        report["quantized"].append({"scheme": scheme, "fields": f, "parallel_ms": r["parallel_ms"],
                                    "cached_serial_ms": r.get("cached_serial_ms"), "llama_q8_0_best_ms": lq,
                                    "rss_after_load_mib": q.get("rss_after_load_mib"), "load_ms": q.get("load_ms"),
                                    "linear_weights": q.get("linear_weights"), "fidelity": fid})
        lines.append(f"| {label} | {f} | {ms(r['parallel_ms'])} | {ratio(base, r['parallel_ms'])} | {ms(r.get('cached_serial_ms'))} "
                     f"| {ms(lq)} | {ms(q.get('rss_after_load_mib'))} | {ms(q.get('load_ms'))} | {weights} "
                     f"| {fid['agree']}/{fid['rows']} | {fid['max_abs_dp']:.4f} |")
lines += ["", "`vs f32 parallel`: forkscore's f32 parallel time divided by this one (below 1: slower). Resident memory "
          "is the process RSS right after loading (weights, tokenizer, allocator).", ""]
(out / "report.md").write_text("\n".join(lines) + "\n")
(out / "report.json").write_text(json.dumps(report, indent=1))
print("\n".join(lines))
