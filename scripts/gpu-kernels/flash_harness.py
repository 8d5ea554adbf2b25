#!/usr/bin/env python3
"""Checks and times kernels/cuda/flash_attn.cu on the GPU machine, before (and after) it is
wired into the Rust build.

  python3 scripts/gpu-kernels/flash_harness.py

1. compiles the very .cu source with nvcc (sm_90a cubin), loads it with CuPy;
2. correctness: against attention computed in float32 by PyTorch from the same bf16 inputs
   (explicit masks: left-padded slot pasts, causal new keys, GQA), for prefill, chunked prefill
   over a past, and forked scoring rows over one or several slots — max |diff| and every output
   written;
3. timing (CUDA events, median of 20): the Qwen3.5-4B attention shape (16 q heads, 4 KV heads,
   head dim 256) for a 2,000-token prefill, the Qwen2.5-1.5B shape (12 / 2, head dim 128) for a
   1,549-token prefill and a 28-row scoring pass (20 tokens over that prefix), next to PyTorch's
   scaled_dot_product_attention (flash backend for prefill) on the same inputs.
"""
import math
import os
import statistics
import subprocess
import sys
import tempfile

import cupy as cp
import torch

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "kernels", "cuda", "flash_attn.cu")
BM, PAD = 64, 8
BN = {64: 64, 128: 64, 256: 32}


def build():
    out = os.path.join(tempfile.gettempdir(), "flash_attn.cubin")
    cmd = ["nvcc", "-cubin", "-O3", "-std=c++17", "-arch=sm_90a", "-Xptxas", "-v", "-o", out, SRC]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    print("\n".join(l for l in r.stderr.splitlines() if "registers" in l or "spill" in l))
    return cp.RawModule(path=out)


def smem_bytes(hd):
    return (BM + 4 * BN[hd]) * (hd + PAD) * 2


def launch(mod, q, kn, vn, kp, vp, start):
    B, H, L, hd = q.shape
    hkv = kn.shape[1]
    S, P = (kp.shape[1], kp.shape[2]) if kp is not None else (0, 0)
    out = torch.empty(B, L, H * hd, dtype=torch.bfloat16, device="cuda")
    f = mod.get_function(f"flash_attn_hd{hd}")
    f.max_dynamic_shared_size_bytes = smem_bytes(hd)
    g = H // hkv
    grid = ((g * L + BM - 1) // BM, hkv, B)
    ptr = lambda t: t.data_ptr() if t is not None else 0
    # tree, seg_off, slot_past = nullptr: causal new keys over a stacked past (the tree-mask form
    # is checked by the GPU tests, the varlen and slot-table forms by flash_varlen_harness.py)
    f(grid, (128,), (ptr(q), ptr(kn), ptr(vn), ptr(kp), ptr(vp), ptr(start), 0, 0, cp.int32(0), 0, ptr(out),
                     cp.int32(B), cp.int32(H), cp.int32(hkv), cp.int32(L), cp.int32(S), cp.int32(P),
                     cp.float32(1.0 / math.sqrt(hd) * math.log2(math.e))),
      shared_mem=smem_bytes(hd))
    return out


def reference(q, kn, vn, kp, vp, start):
    """float32 attention with explicit masks, the plain definition."""
    B, H, L, hd = q.shape
    hkv = kn.shape[1]
    g = H // hkv
    qf = q.float()
    outs = []
    for b in range(B):
        keys, vals, mask = [], [], []
        if kp is not None:
            S, P = kp.shape[1], kp.shape[2]
            s = b // (B // S)
            keys.append(kp[:, s].float())
            vals.append(vp[:, s].float())
            st = int(start[b]) if start is not None else 0
            m = torch.zeros(L, P, device="cuda", dtype=torch.bool)
            m[:, st:] = True
            mask.append(m)
        keys.append(kn[b].float())
        vals.append(vn[b].float())
        mask.append(torch.ones(L, L, device="cuda", dtype=torch.bool).tril())
        k = torch.cat(keys, 1).repeat_interleave(g, 0)  # (H, K, hd)
        v = torch.cat(vals, 1).repeat_interleave(g, 0)
        m = torch.cat(mask, 1)
        sc = qf[b] @ k.transpose(1, 2) / math.sqrt(hd)
        sc = sc.masked_fill(~m, float("-inf"))
        o = torch.softmax(sc, -1) @ v  # (H, L, hd)
        outs.append(o.transpose(0, 1).reshape(L, H * hd))
    return torch.stack(outs)


def case(B, H, hkv, L, hd, S=0, P=0, ragged=False, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: (torch.randn(*s, generator=gen, device="cuda") * 1.5).to(torch.bfloat16)
    q, kn, vn = r(B, H, L, hd), r(B, hkv, L, hd), r(B, hkv, L, hd)
    kp = vp = start = None
    if P > 0:
        kp, vp = r(hkv, S, P, hd), r(hkv, S, P, hd)
        if ragged:
            start = torch.randint(0, P, (B,), generator=gen, device="cuda", dtype=torch.int32)
            start[0] = 0
    return q, kn, vn, kp, vp, start


def timed(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def main():
    mod = build()
    checks = [
        ("prefill 4B-shape", dict(B=1, H=16, hkv=4, L=700, hd=256)),
        ("prefill 1.5B-shape", dict(B=1, H=12, hkv=2, L=777, hd=128)),
        ("prefill hd64 odd", dict(B=2, H=6, hkv=3, L=45, hd=64)),
        ("chunk over past", dict(B=1, H=12, hkv=2, L=300, hd=128, S=1, P=413)),
        ("28 rows over one prefix", dict(B=28, H=12, hkv=2, L=20, hd=128, S=1, P=1549)),
        ("slot-merged ragged", dict(B=6, H=16, hkv=4, L=17, hd=256, S=2, P=301, ragged=True)),
        ("one token rows", dict(B=5, H=16, hkv=4, L=1, hd=256, S=5, P=90, ragged=True)),
    ]
    worst_all = 0.0
    for name, kw in checks:
        ins = case(**kw)
        got = launch(mod, *ins).float()
        want = reference(*ins)
        err = (got - want).abs().max().item()
        finite = bool(torch.isfinite(got).all())
        # bf16 output rounding of |o| <= ~4: half an ulp is ~0.008
        print(f"{name:28s} max|diff| {err:.3e} finite {finite}")
        worst_all = max(worst_all, err if finite else float("inf"))
    print(f"worst {worst_all:.3e}")

    print("\ntiming (ms, median of 20)")
    for name, kw in [
        ("4B prefill 2000 tok", dict(B=1, H=16, hkv=4, L=2000, hd=256)),
        ("1.5B prefill 1549 tok", dict(B=1, H=12, hkv=2, L=1549, hd=128)),
        ("1.5B 28 rows x 20 over 1549", dict(B=28, H=12, hkv=2, L=20, hd=128, S=1, P=1549)),
        ("4B 8 rows x 20 over 1898", dict(B=8, H=16, hkv=4, L=20, hd=256, S=1, P=1898)),
    ]:
        q, kn, vn, kp, vp, start = case(**kw)
        ours = timed(lambda: launch(mod, q, kn, vn, kp, vp, start))
        B, H, L, hd = q.shape
        g = H // kn.shape[1]
        if kp is None:
            k, v = kn.repeat_interleave(g, 1), vn.repeat_interleave(g, 1)
            peer = timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
            pname = "sdpa causal"
        else:
            # peer: the same keys per row (past expanded per row + new), explicit bool mask
            P = kp.shape[2]
            k = torch.cat([kp[:, 0].unsqueeze(0).expand(B, -1, -1, -1), kn], 2).repeat_interleave(g, 1)
            v = torch.cat([vp[:, 0].unsqueeze(0).expand(B, -1, -1, -1), vn], 2).repeat_interleave(g, 1)
            m = torch.cat([torch.ones(L, P, dtype=torch.bool, device="cuda"),
                           torch.ones(L, L, dtype=torch.bool, device="cuda").tril()], 1)
            peer = timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m))
            pname = "sdpa masked"
        keys = L * (L + 1) / 2 if kp is None else L * (kp.shape[2] + (L + 1) / 2)
        flops = 4 * B * H * keys * hd
        print(f"{name:30s} ours {ours:7.3f}  {pname} {peer:7.3f}  ratio {peer / ours:5.2f}x  "
              f"ours {flops / ours / 1e9:6.1f} TFLOP/s")


if __name__ == "__main__":
    main()
