#!/usr/bin/env python3
"""The machine's f32 matmul rate, measured in the same run as the bench, for the FLOP floor:
torch (oneDNN/MKL) on the 0.5B model's largest linear shape, (441 x 896) x (896 x 4864), and
its transpose, median of 7 after a warm-up, with torch's default thread count; `--dtype bfloat16`
gives the bf16 rate (the floor of the bf16 and 8-bit rows).

    python3 scripts/cpu-real/gemm_peak.py --out gemm_peak.json

With --rows and --shapes it times torch's linear (x @ W.T) at the shapes the `cpu_linear` bench
times ours, side by side (the same names: `name:OUTxIN`), and reports every (rows, layer).
"""
import argparse, json, statistics, time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rows", help="row counts, e.g. 512,160,40")
ap.add_argument("--shapes", help="layers name:OUTxIN, e.g. qkv:1152x896,down:896x4864")
ap.add_argument("--repeats", type=int, default=7)
ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                help="operand dtype (bfloat16: oneDNN's AMX / AVX-512 BF16 path where the CPU has one)")
args = ap.parse_args()
if bool(args.rows) != bool(args.shapes):
    ap.error("--rows and --shapes go together")


def rate(m, k, n):
    dt = getattr(torch, args.dtype)
    a, b = torch.randn(m, k).to(dt), torch.randn(n, k).to(dt)
    a @ b.t()
    ts = []
    for _ in range(args.repeats):
        t = time.perf_counter(); a @ b.t(); ts.append(time.perf_counter() - t)
    ms = statistics.median(ts) * 1e3
    return ms, 2 * m * k * n / ms / 1e6


rates, layers = {}, []
if args.rows:
    for m in [int(r) for r in args.rows.split(",")]:
        for part in args.shapes.split(","):
            name, dims = part.split(":")
            n, k = (int(d) for d in dims.split("x"))
            ms, g = rate(m, k, n)
            layers.append({"rows": m, "layer": name, "out": n, "in": k, "ms": ms, "gflops": g})
            print(f"rows {m:>5} {name:>8} {n:>5}x{k:<5} torch {ms:8.3f} ms {g:7.1f} GFLOP/s")
else:
    for m, k, n in [(441, 896, 4864), (441, 4864, 896)]:
        rates[f"{m}x{k}x{n}"] = rate(m, k, n)[1]
out = {"threads": torch.get_num_threads(), "torch": torch.__version__, "dtype": args.dtype}
if rates:
    out.update(gflops=rates, peak_gflops=max(rates.values()))
if layers:
    out["layers"] = layers
open(args.out, "w").write(json.dumps(out, indent=1))
if rates:
    print(json.dumps(out))
