#!/usr/bin/env python3
"""Per-kernel GPU time from an Nsight Compute CSV (`ncu --csv --print-units base --metrics
gpu__time_duration.sum`), as a markdown table: the kernels that take the most time per decision.

  python3 kernel_table.py NCU.csv --passes N [--wall-ms W] [--top 30]

`--passes`: how many decisions the profiled process made (the table divides by it);
`--wall-ms`: the decision's wall time measured WITHOUT the profiler, to show how much of it the
GPU spent idle between kernels (launch-bound gaps).
"""
import argparse
import collections
import csv
import re


def family(name):
    n = name.lower()
    if re.search(r"gemm|cutlass|xmma|sm90_|cublas|nvjet", n):
        return "matmul (cuBLAS)"
    if "flash_attn" in n:
        return "flash attention (ours)"
    if n.startswith("gdn_") or "gdn" in n:
        return "gated deltanet (ours)"
    if "copy" in n:
        return "copies (candle)"
    if "cast" in n:
        return "casts (candle)"
    if re.search(r"reduce|rmsnorm|softmax|sum|max|min", n):
        return "reductions / norms (candle)"
    if re.search(r"^b(add|sub|mul|div|minimum|maximum)|^u|affine|silu|exp|neg|sqr|sqrt|recip|where|fill|const|index|gather|scatter", n):
        return "element-wise / indexing (candle)"
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--passes", type=float, default=1.0)
    ap.add_argument("--wall-ms", type=float, default=None)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    lines = open(a.csv, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        raise SystemExit(f"{a.csv}: no ncu CSV header found")
    per = collections.defaultdict(lambda: [0, 0.0])
    for row in csv.DictReader(lines[start:]):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = row.get("Metric Unit", "ns")
        v = float(row["Metric Value"].replace(",", ""))
        ns = v * {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit, 1)
        name = re.sub(r"\(.*", "", row["Kernel Name"])[:70]
        per[name][0] += 1
        per[name][1] += ns
    total = sum(v[1] for v in per.values()) / 1e6 / a.passes
    launches = sum(v[0] for v in per.values()) / a.passes
    fam = collections.defaultdict(lambda: [0, 0.0])
    for name, (c, ns) in per.items():
        fam[family(name)][0] += c
        fam[family(name)][1] += ns
    print(f"GPU kernel time per decision: {total:.2f} ms over {launches:.0f} launches", end="")
    if a.wall_ms:
        print(f"; wall {a.wall_ms:.2f} ms, so the GPU idles {max(a.wall_ms - total, 0):.2f} ms between kernels")
    else:
        print()
    print("\n| family | launches | ms | share |\n|---|---:|---:|---:|")
    for f, (c, ns) in sorted(fam.items(), key=lambda kv: -kv[1][1]):
        ms = ns / 1e6 / a.passes
        print(f"| {f} | {c / a.passes:.0f} | {ms:.2f} | {100 * ms / total:.0f}% |")
    print("\n| kernel | launches | ms | mean µs | share |\n|---|---:|---:|---:|---:|")
    for name, (c, ns) in sorted(per.items(), key=lambda kv: -kv[1][1])[: a.top]:
        ms = ns / 1e6 / a.passes
        print(f"| `{name}` | {c / a.passes:.0f} | {ms:.2f} | {ns / c / 1e3:.1f} | {100 * ms / total:.1f}% |")


if __name__ == "__main__":
    main()
