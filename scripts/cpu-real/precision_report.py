#!/usr/bin/env python3
"""Merge one scripts/cpu-real/precision.sh run into precision.md and precision.json.

    python3 scripts/cpu-real/precision_report.py OUTDIR

Per fields case: forkscore's decision (the modes bench's parallel mode, median) in f32,
`--quantize bf16`, `--dtype bf16`, `--quantize q8_0` and `--quantize int8`, transformers' prefill alone and its
prefix-batched decision in f32 and bf16, on the same token ids. Ratios are transformers'
prefix-batched decision in the precision named ÷ forkscore's (above 1: forkscore faster). Labels
and max |Δp| (softmax over each field's code logits) of every forkscore scheme against forkscore
f32. Peak RSS: the whole bench process (load and every decision), GNU time's maximum resident
set. FLOP floor: 2 × non-embedding parameters × tokens fed ÷ torch's matmul rate in that
precision measured in the same run (peak-*.json).
"""
import json, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quant_fidelity import compare_case  # noqa: E402

out = Path(sys.argv[1])
load = lambda name: json.loads((out / name).read_text()) if (out / name).exists() else None
NON_EMBED = 494_032_768 - 151_936 * 896  # Qwen2.5-0.5B: all parameters minus the tied embedding
SCHEMES = [("f32", "f32"), ("bf16", "`--quantize bf16`"), ("dtype-bf16", "`--dtype bf16`"),
           ("q8_0", "`--quantize q8_0`"), ("int8", "`--quantize int8`")]


def rows_by_fields(doc):
    return {r["fields"]: r for r in (doc or {}).get("rows", [])}


def cases_by_fields(doc):
    return {c["fields"]: c for c in (doc or {}).get("cases", [])}


modes = {s: rows_by_fields(load(f"modes-{s}.json")) for s, _ in SCHEMES}
dumps = {s: cases_by_fields(load(f"dump-{s}.json")) for s, _ in SCHEMES}
peers = {dt: cases_by_fields(load(f"peer-{dt}.json")) for dt in ("float32", "bfloat16")}
peaks = {dt: (load(f"peak-{dt}.json") or {}).get("peak_gflops") for dt in ("float32", "bfloat16")}
rss = {}
for s, _ in SCHEMES:
    f = out / f"rss-{s}.txt"
    if f.exists():
        kib = [int(x) for x in f.read_text().split() if x.isdigit()]
        rss[s] = kib[-1] * 1024 / 2**20 if kib else None
fields_list = sorted({f for m in modes.values() for f in m})


def fmt(x, spec="{:,.0f}"):
    return spec.format(x) if isinstance(x, (int, float)) else "—"


def ratio(a, b):
    return f"{a / b:.2f}×" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "—"


def peer_ms(dt, f, mode):
    return peers[dt].get(f, {}).get("modes", {}).get(mode, {}).get("ms")


def floor_ms(f, dt):
    c = dumps["f32"].get(f)
    if not c or not peaks.get(dt):
        return None
    tokens = c["prefix_tokens"] + sum(len(r["suffix_ids"]) for r in c["rows"])
    return 2 * NON_EMBED * tokens / (peaks[dt] * 1e9) * 1e3


first = (out / "run.log").read_text().splitlines()[0] if (out / "run.log").exists() else ""
report = {"run": first, "cases": [], "peak_gflops": peaks, "peak_rss_mib": rss,
          "rss_after_load_mib": {s: (load(f"modes-{s}.json") or {}).get("rss_after_load_mib") for s, _ in SCHEMES}}
head = "| ms per decision | " + " | ".join(f"{f} fields ({fmt(dumps['f32'].get(f, {}).get('prefix_tokens'))} tokens)" for f in fields_list) + " |"
lines = [head, "|---|" + "---:|" * len(fields_list)]
for s, label in SCHEMES:
    cells = []
    for f in fields_list:
        ms = modes[s].get(f, {}).get("parallel_ms")
        peer_dt = "float32" if s == "f32" else "bfloat16"
        cells.append(f"{fmt(ms)} ({ratio(peer_ms(peer_dt, f, 'prefix_batched'), ms)})")
    lines.append(f"| forkscore {label} (× transformers {'f32' if s == 'f32' else 'bf16'} prefix-batched) | " + " | ".join(cells) + " |")
for dt, label in (("float32", "f32"), ("bfloat16", "bf16")):
    cells = [f"{fmt(peer_ms(dt, f, 'prefill'))} / {fmt(peer_ms(dt, f, 'prefix_batched'))}" for f in fields_list]
    lines.append(f"| transformers {label}: prefill alone / prefix-batched decision | " + " | ".join(cells) + " |")
for dt, label in (("float32", "f32"), ("bfloat16", "bf16")):
    cells = [fmt(floor_ms(f, dt)) for f in fields_list]
    lines.append(f"| FLOP floor at torch's {label} matmul rate ({fmt(peaks.get(dt))} GFLOP/s) | " + " | ".join(cells) + " |")
# the best of each side at each case: forkscore's fastest scheme against transformers' fastest
# precision (where bf16 is emulated, transformers' best is f32)
cells = []
for f in fields_list:
    ours = [(modes[s].get(f, {}).get("parallel_ms"), label) for s, label in SCHEMES]
    ours = [o for o in ours if isinstance(o[0], (int, float))]
    theirs = [(peer_ms(dt, f, "prefix_batched"), lab) for dt, lab in (("float32", "f32"), ("bfloat16", "bf16"))]
    theirs = [t for t in theirs if isinstance(t[0], (int, float))]
    if ours and theirs:
        o, t = min(ours), min(theirs)
        cells.append(f"{fmt(o[0])} ({o[1]}) vs {fmt(t[0])} ({t[1]}): {ratio(t[0], o[0])}")
    else:
        cells.append("—")
lines.append("| best against best: forkscore's fastest scheme vs transformers' fastest precision | " + " | ".join(cells) + " |")
fid = ["", "| scheme | labels equal to f32 | max \\|Δp\\| | peak RSS (MiB) | resident after load (MiB) |", "|---|---:|---:|---:|---:|"]
for s, label in SCHEMES:
    agree = rows = 0
    dp = None
    for f in fields_list:
        c = compare_case(dumps["f32"].get(f), dumps[s].get(f))
        if c:
            agree += c["agree"]; rows += c["rows"]; dp = max(dp or 0.0, c["max_abs_dp"])
        report["cases"].append({"scheme": s, "fields": f, "ms": modes[s].get(f, {}).get("parallel_ms"), "fidelity": c})
    fid.append(f"| {label} | {agree}/{rows} | {fmt(dp, '{:.4f}')} | {fmt(rss.get(s))} | {fmt(report['rss_after_load_mib'].get(s))} |")
for dt in ("float32", "bfloat16"):
    for f in fields_list:
        report["cases"].append({"peer": dt, "fields": f, "prefill_ms": peer_ms(dt, f, "prefill"),
                                "prefix_batched_ms": peer_ms(dt, f, "prefix_batched")})
md = "\n".join([first, ""] + lines + fid) + "\n"
(out / "precision.md").write_text(md)
(out / "precision.json").write_text(json.dumps(report, indent=1))
print(md)
