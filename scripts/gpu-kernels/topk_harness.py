#!/usr/bin/env python3
"""Checks and times kernels/cuda/vocab_topk.cu on the GPU machine (issue 12: exact top-K).

  python3 scripts/gpu-kernels/topk_harness.py [--quick]

1. compiles the very .cu source with nvcc (sm_90a cubin) and loads it with CuPy;
2. correctness, bit for bit: the kernel's top K against the plain path on the same GPU — the full
   log-softmax (x − lse, with the kernel's own logsumexp) sorted by log-probability descending,
   ties by ascending id (a stable descending sort) — on random rows, rows with heavy ties, rows of
   −inf and partly −inf, K = 0, 1, 5, 128, 256, vocabularies 151,936 and 248,320 and a small one
   (K above the number of blocks); NaN / +inf rows must be refused with the lowest bad id; the
   logsumexp against float64 (in f32 ulps);
3. timing per 256-row chunk (CUDA events, median of 20): the kernel, the full path (log_softmax
   + full sort + cut), and torch.topk on the log-softmax (not tie-exact; a reference speed).
"""
import os
import statistics
import subprocess
import sys
import tempfile

import cupy as cp
import torch

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "kernels", "cuda", "vocab_topk.cu")
QUICK = "--quick" in sys.argv


def build():
    out = os.path.join(tempfile.gettempdir(), "vocab_topk.cubin")
    cmd = ["nvcc", "-cubin", "-O3", "-std=c++17", "-arch=sm_90a", "-Xptxas", "-v", "-o", out, SRC]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    print("\n".join(l for l in r.stderr.splitlines() if "registers" in l or "spill" in l))
    return cp.RawModule(path=out)


def launch(fn, x, k):
    rows, vocab = x.shape
    kk = max(k, 1)
    lse = torch.full((rows,), float("nan"), device="cuda")
    ids = torch.full((rows, kk), 0x7ABCDEF, dtype=torch.int32, device="cuda")
    lp = torch.full((rows, kk), 12345.0, device="cuda")
    status = torch.full((rows,), -7, dtype=torch.int32, device="cuda")
    fn((rows,), (1024,), (x.data_ptr(), cp.int32(rows), cp.int32(vocab), cp.int32(k),
                         lse.data_ptr(), ids.data_ptr(), lp.data_ptr(), status.data_ptr()))
    return lse, ids, lp, status


def reference(x, lse, k):
    lp = torch.where(x == float("-inf"), x, x - lse[:, None])
    vals, idx = torch.sort(lp, dim=1, descending=True, stable=True)
    return idx[:, :k].to(torch.int32), vals[:, :k]


def ulps(a, b):
    ai = a.view(torch.int32).to(torch.int64)
    bi = b.view(torch.int32).to(torch.int64)
    return (ai - bi).abs().max().item()


def rows_of(kind, rows, vocab, gen):
    x = torch.randn(rows, vocab, device="cuda", generator=gen) * 2.5
    if kind == "ties":
        x = (x * 2).round() / 2  # few distinct values: many ties at the top
    elif kind == "peaks":
        x[:, torch.randint(0, vocab, (8,), device="cuda", generator=gen)] += 12.0
    elif kind == "neg_inf":
        mask = torch.rand(rows, vocab, device="cuda", generator=gen) < 0.999
        x[mask] = float("-inf")
        x[0] = float("-inf")  # a row of only −inf
    elif kind == "equal":
        x[:] = 0.75  # every logit tied
    return x.contiguous()


def check(fn):
    gen = torch.Generator(device="cuda").manual_seed(7)
    failures = 0
    cases = [(v, kind) for v in (151_936, 248_320) for kind in ("normal", "peaks", "ties", "neg_inf", "equal")]
    cases.append((100, "normal"))
    cases.append((100, "neg_inf"))
    for vocab, kind in cases:
        rows = 16 if QUICK else 64
        x = rows_of(kind, rows, vocab, gen)
        want_lse = torch.logsumexp(x.double(), dim=1).float()
        for k in (0, 1, 5, 128, 256):
            lse, ids, lp, status = launch(fn, x, k)
            torch.cuda.synchronize()
            ok = bool((status == -1).all())
            finite = torch.isfinite(want_lse)
            lse_ulps = ulps(lse[finite], want_lse[finite]) if finite.any() else 0
            ok &= bool(torch.equal(torch.isinf(lse), torch.isinf(want_lse)))
            if k > 0:
                kk = min(k, vocab)
                rid, rlp = reference(x, lse, kk)
                ok &= torch.equal(ids[:, :kk], rid)
                ok &= torch.equal(lp[:, :kk].view(torch.int32), rlp.contiguous().view(torch.int32))
            print(f"[check] vocab {vocab:>7} {kind:>8} k {k:>3}: {'ok' if ok else 'FAIL'} (lse vs f64: {lse_ulps} ulp)")
            failures += 0 if ok else 1
    # refusals
    x = rows_of("normal", 4, 248_320, gen)
    x[1, 77] = float("nan")
    x[1, 9] = float("inf")
    x[3, 200_000] = float("inf")
    lse, ids, lp, status = launch(fn, x, 5)
    torch.cuda.synchronize()
    ok = status.tolist() == [-1, 9, -1, 200_000]
    print(f"[check] NaN / +inf refused with the lowest bad id: {'ok' if ok else 'FAIL'} {status.tolist()}")
    failures += 0 if ok else 1
    return failures


def timed(f, n=20):
    for _ in range(3):
        f()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        f()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def bench(fn):
    gen = torch.Generator(device="cuda").manual_seed(11)
    print("| vocab | K | kernel ms / 256 rows | full log-softmax + sort ms | full ÷ kernel | torch.topk ms | read floor ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for vocab in (151_936, 248_320):
        x = rows_of("peaks", 256, vocab, gen)
        floor = 2 * x.numel() * 4 / 4.3e12 * 1e3  # two streaming reads at the measured copy rate
        for k in (1, 5, 128):
            tk = timed(lambda: launch(fn, x, k))
            tf = timed(lambda: torch.sort(torch.log_softmax(x, dim=1), dim=1, descending=True, stable=True)[0][:, :k].contiguous())
            tt = timed(lambda: torch.topk(torch.log_softmax(x, dim=1), k, dim=1))
            print(f"| {vocab:,} | {k} | {tk:.3f} | {tf:.3f} | {tf / tk:.1f}× | {tt:.3f} | {floor:.3f} |")


def main():
    mod = build()
    fn = mod.get_function("vocab_topk_f32")
    failures = check(fn)
    bench(fn)
    print(f"[topk] {'PASS' if failures == 0 else f'{failures} FAILURES'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
