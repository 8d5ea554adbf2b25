#!/usr/bin/env python3
"""Checks and times the causal conv + SiLU kernel of kernels/cuda/gdn_recurrent.cu
(`gdn_causal_conv_silu_bf16`) on the GPU machine.

  python3 scripts/gpu-kernels/conv_harness.py

1. compiles the very .cu source with nvcc (sm_90a cubin) and loads it with CuPy;
2. correctness against torch's depthwise conv1d + SiLU in float64 (state rows first, then p;
   the new state = the Kc−1 inputs ending at each row's last real token), with and without
   right padding;
   The paired kernel (`gdn_conv_pairs_bf16`) must equal the per-channel one bit for bit, and
   reading a one-slot state through slot_of_row must equal gathering it first;
3. timing (CUDA events around 20 back-to-back calls, median of 5 rounds) at the Qwen3.5-4B
   layer shape (Cc = 8,192, Kc = 4): a 2,402-token prefill and a 28 × 24 scoring pass, next to
   the memory bound of the same bytes (torch's bf16 → f32 copy of p, which reads and writes
   what the kernel must).
"""
import os
import subprocess
import sys
import tempfile

import cupy as cp
import torch

sys.path.insert(0, os.path.dirname(__file__))
from gdn_chunk_harness import time_loop_ms as time_ms  # noqa: E402  (events around back-to-back calls)

SRC = os.environ.get("GDN_SRC") or os.path.join(os.path.dirname(__file__), "..", "..", "kernels", "cuda", "gdn_recurrent.cu")
ROWS = 16  # CONV_ROWS of the kernel source (and of the Rust launcher)


def build():
    out = os.path.join(tempfile.gettempdir(), "gdn_conv.cubin")
    cmd = ["nvcc", "-cubin", "-O3", "-arch=sm_90a", "-o", out, SRC]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    return cp.RawModule(path=out)


def launch(mod, p, state, w, lens, out=None, ns=None):
    B, L, Cc = p.shape
    Kc = w.shape[1]
    if out is None:  # NaN-filled, so an unwritten element shows
        out = torch.full((B, L, Cc), float("nan"), device="cuda")
        ns = torch.full((B, Kc - 1, Cc), float("nan"), device="cuda")
    rows = B * L + B * (Kc - 1)
    f = mod.get_function("gdn_causal_conv_silu_bf16")
    ptr = lambda t: cp.uint64(t.data_ptr()) if t is not None else cp.uint64(0)
    grid = ((Cc + 255) // 256, max(1, min(65535, (rows + ROWS - 1) // ROWS)))
    f(grid, (256,), (ptr(p), ptr(state), ptr(w), ptr(lens), ptr(out), ptr(ns), cp.int32(B),
                     cp.int32(L), cp.int32(Cc), cp.int32(Kc)))
    return out, ns


RUN = 16  # CONV_RUN: tokens per thread of the paired kernel


def launch_pairs(mod, p, state, w, lens, slots=None, out=None, ns=None, row_start=None, batch=None):
    """gdn_conv_pairs_bf16: two channels per thread, a register window; row b reads state row
    slots[b] when slots is given, and its tokens from row row_start[b] of a packed (1, T, Cc) p
    when row_start is given (batch = (B, L) then)."""
    B, L, Cc = p.shape if batch is None else (batch[0], batch[1], p.shape[-1])
    Kc = w.shape[1]
    if out is None:
        out = torch.full((B, L, Cc), float("nan"), device="cuda")
        ns = torch.full((B, Kc - 1, Cc), float("nan"), device="cuda")
    f = mod.get_function("gdn_conv_pairs_bf16")
    ptr = lambda t: cp.uint64(t.data_ptr()) if t is not None else cp.uint64(0)
    grid = ((Cc // 2 + 127) // 128, (L + RUN - 1) // RUN + 1, B)
    f(grid, (128,), (ptr(p), ptr(state), ptr(w), ptr(lens), ptr(slots), ptr(row_start), ptr(out), ptr(ns),
                     cp.int32(L), cp.int32(Cc), cp.int32(Kc)))
    return out, ns


def reference(p, state, w, lens):
    B, L, Cc = p.shape
    Kc = w.shape[1]
    x = torch.cat([state.double(), p.double()], dim=1)  # (B, Kc−1+L, Cc)
    y = torch.nn.functional.conv1d(x.transpose(1, 2), w.double().unsqueeze(1), groups=Cc)
    out = torch.nn.functional.silu(y).transpose(1, 2)  # (B, L, Cc)
    ns = torch.stack([x[b, int(lens[b]) if lens is not None else L: (int(lens[b]) if lens is not None else L) + Kc - 1]
                      for b in range(B)])
    return out, ns


def main():
    mod = build()
    gen = torch.Generator(device="cuda").manual_seed(5)
    worst = 0.0
    print("== correctness (max |Δ| vs float64)")
    for B, L, Cc, Kc, padded in ((1, 37, 96, 4, False), (3, 20, 256, 4, True), (2, 5, 64, 2, True),
                                 (1, 300, 8192, 4, False), (4, 1, 160, 4, False), (2, 40, 300, 6, True),
                                 (3, 17, 8192, 3, True)):
        p = torch.randn(B, L, Cc, device="cuda", generator=gen).bfloat16()
        state = torch.randn(B, Kc - 1, Cc, device="cuda", generator=gen)
        w = torch.randn(Cc, Kc, device="cuda", generator=gen) * 0.5
        lens = torch.randint(1, L + 1, (B,), device="cuda", dtype=torch.int32, generator=gen) if padded else None
        out, ns = launch(mod, p, state, w, lens)
        torch.cuda.synchronize()
        ro, rs = reference(p, state, w, lens)
        valid = torch.ones(B, L, dtype=torch.bool, device="cuda")
        if lens is not None:
            valid = torch.arange(L, device="cuda")[None, :] < lens[:, None].long()
        eo = (out.double() - ro).abs()[valid].max().item()
        es = (ns.double() - rs).abs().max().item()
        worst = max(worst, eo, es)
        po, ps = launch_pairs(mod, p, state, w, lens)
        torch.cuda.synchronize()
        same = torch.equal(po[valid], out[valid]) and torch.equal(ps, ns)
        # slots: every row starts from state row 0 of a one-slot state
        sl = torch.zeros(B, dtype=torch.int32, device="cuda")
        so, ss = launch_pairs(mod, p, state[:1].contiguous(), w, lens, sl)
        go, gs = launch(mod, p, state[:1].expand(B, -1, -1).contiguous(), w, lens)
        torch.cuda.synchronize()
        same_slots = torch.equal(so[valid], go[valid]) and torch.equal(ss, gs)
        # packed: the rows' real tokens back to back in one (1, T, Cc) input, read through
        # row_start, against the zero-padded batch (the same function, bit for bit)
        ls = lens.tolist() if lens is not None else [L] * B
        zp = p.clone()
        for b, n in enumerate(ls):
            zp[b, n:] = 0
        zo, zs = launch_pairs(mod, zp, state, w, lens)
        packed = torch.cat([p[b, :n] for b, n in enumerate(ls)], 0)[None].contiguous()
        starts = torch.tensor([sum(ls[:b]) for b in range(B)], dtype=torch.int32, device="cuda")
        plens = torch.tensor(ls, dtype=torch.int32, device="cuda")
        ko, ks = launch_pairs(mod, packed, state, w, plens, row_start=starts, batch=(B, L))
        torch.cuda.synchronize()
        same_packed = torch.equal(ko, zo) and torch.equal(ks, zs)
        worst = max(worst, 0 if same and same_slots and same_packed else 1)
        print(f"  B {B} L {L} Cc {Cc} Kc {Kc} padded {padded}: out {eo:.2e}, state {es:.2e}; "
              f"pairs kernel bit-identical {same}, with slots = gathered state {same_slots}, "
              f"packed input = zero-padded batch {same_packed}")
    print("== timing, Cc 8,192, Kc 4 (ms, median)")
    print("| rows × tokens | per-channel kernel | pairs kernel | bf16 → f32 copy of p (bound) | pairs ÷ bound |")
    print("|---|---:|---:|---:|---:|")
    for B, L in ((1, 2402), (1, 1079), (28, 24), (8, 24)):
        p = torch.randn(B, L, 8192, device="cuda", generator=gen).bfloat16()
        state = torch.randn(B, 3, 8192, device="cuda", generator=gen)
        w = torch.randn(8192, 4, device="cuda", generator=gen)
        out, ns = torch.empty(B, L, 8192, device="cuda"), torch.empty(B, 3, 8192, device="cuda")
        tk = time_ms(lambda: launch(mod, p, state, w, None, out, ns))
        tq = time_ms(lambda: launch_pairs(mod, p, state, w, None, None, out, ns))
        tb = time_ms(lambda: p.float())
        print(f"| {B} × {L} | {tk:.4f} | {tq:.4f} | {tb:.4f} | {tq / tb:.1f}× |")
    ok = worst < 1e-4
    print(f"[conv] {'PASS' if ok else 'FAIL'} (worst {worst:.2e})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
