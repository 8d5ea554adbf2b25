#!/usr/bin/env python3
"""The machine's f32 matmul rate, measured in the same run as the bench, for the FLOP floor:
torch (oneDNN/MKL) on the 0.5B model's largest linear shape, (441 x 896) x (896 x 4864), and
its transpose, median of 7 after a warm-up, with torch's default thread count.

    python3 scripts/cpu-real/gemm_peak.py --out gemm_peak.json
"""
import argparse, json, statistics, time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
args = ap.parse_args()
rates = {}
for m, k, n in [(441, 896, 4864), (441, 4864, 896)]:
    a, b = torch.randn(m, k), torch.randn(n, k)
    a @ b.t()
    ts = []
    for _ in range(7):
        t = time.perf_counter(); a @ b.t(); ts.append(time.perf_counter() - t)
    rates[f"{m}x{k}x{n}"] = 2 * m * k * n / statistics.median(ts) / 1e9
out = {"gflops": rates, "peak_gflops": max(rates.values()), "threads": torch.get_num_threads(),
       "torch": torch.__version__}
open(args.out, "w").write(json.dumps(out, indent=1))
print(json.dumps(out))
