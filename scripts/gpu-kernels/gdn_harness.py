#!/usr/bin/env python3
"""Checks and times kernels/cuda/gdn_recurrent.cu on the GPU machine, before it is wired into
the Rust build.

  python3 scripts/gpu-kernels/gdn_harness.py [--fla]

1. compiles the very .cu source with nvcc (sm_90a cubin) for several (columns per lane, warps)
   variants, loads it with CuPy;
2. correctness: against a float64 PyTorch recurrence on fresh random inputs (several shapes,
   ragged column tiles, slot gather, β = g = 0 padding) — relative error and every output written;
3. timing (CUDA events, median): the Qwen3.5-4B layer shape (Hk 16, Hv 32, dk = dv = 128) for a
   2,000-token prefill (B = 1) and a 28-row scoring pass (8 tokens from one slot), next to
   flash-linear-attention's chunked kernel on the same inputs when --fla and it imports.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

import cupy as cp
import torch

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "kernels", "cuda", "gdn_recurrent.cu")
L2_EPS = 1e-6


def build(cpl, warps):
    out = os.path.join(tempfile.gettempdir(), f"gdn_{cpl}_{warps}.cubin")
    cmd = ["nvcc", "-cubin", "-O3", "-arch=sm_90a", f"-DGDN_CPL={cpl}", f"-DGDN_WARPS={warps}",
           "-Xptxas", "-v", "-o", out, SRC]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    regs = [l for l in r.stderr.splitlines() if "dk128" in l or "registers" in l]
    return cp.RawModule(path=out), "\n".join(regs[-4:])


def reference(qkv, beta, g, s0, slot, Hk, Hv, dk, dv, scale):
    """float64 recurrence, the plain definition."""
    B, L, _ = qkv.shape
    x = qkv.double()
    q = x[..., : Hk * dk].reshape(B, L, Hk, dk)
    k = x[..., Hk * dk: 2 * Hk * dk].reshape(B, L, Hk, dk)
    v = x[..., 2 * Hk * dk:].reshape(B, L, Hv, dv)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + L2_EPS) * scale
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + L2_EPS)
    r = Hv // Hk
    q = q.repeat_interleave(r, dim=2)
    k = k.repeat_interleave(r, dim=2)
    S = s0.double()[slot.long()].clone()  # (B, Hv, dk, dv)
    out = torch.empty(B, L, Hv, dv, dtype=torch.float64, device=qkv.device)
    for t in range(L):
        S = S * torch.exp(g[:, t].double())[:, :, None, None]
        kt, qt, vt = k[:, t], q[:, t], v[:, t]
        err = (vt - torch.einsum("bhk,bhkv->bhv", kt, S)) * beta[:, t].double()[:, :, None]
        S = S + kt[..., None] * err[:, :, None, :]
        out[:, t] = torch.einsum("bhk,bhkv->bhv", qt, S)
    return out, S


def inputs(B, L, Hk, Hv, dk, dv, slots, pad_tail=0, gen=None):
    dev = "cuda"
    Cc = 2 * Hk * dk + Hv * dv
    qkv = torch.randn(B, L, Cc, device=dev, generator=gen)
    beta = torch.rand(B, L, Hv, device=dev, generator=gen)
    g = -torch.rand(B, L, Hv, device=dev, generator=gen) * 0.5
    if pad_tail:
        beta[:, L - pad_tail:] = 0
        g[:, L - pad_tail:] = 0
    s0 = torch.randn(slots, Hv, dk, dv, device=dev, generator=gen) * 0.1
    slot = torch.randint(0, slots, (B,), device=dev, dtype=torch.int32, generator=gen)
    return qkv, beta, g, s0, slot


def launch(mod, cpl, warps, qkv, beta, g, s0, slot, Hk, Hv, dk, dv, scale, out=None, s1=None):
    B, L, _ = qkv.shape
    if out is None:
        out = torch.full((B, L, Hv, dv), float("nan"), device="cuda")
        s1 = torch.full((B, Hv, dk, dv), float("nan"), device="cuda")
    f = mod.get_function(f"gdn_recurrent_dk{dk}")
    cols = 4 * cpl * warps  # value columns per block
    grid = (B * Hv, (dv + cols - 1) // cols)
    ptr = lambda t: cp.uint64(t.data_ptr()) if t is not None else cp.uint64(0)
    f(grid, (32 * warps,), (ptr(qkv), ptr(beta), ptr(g), ptr(s0), ptr(slot), ptr(out), ptr(s1),
                            cp.int32(L), cp.int32(Hk), cp.int32(Hv), cp.int32(dv),
                            cp.float32(scale), cp.float32(L2_EPS)))
    return out, s1


def time_ms(fn, reps=30):
    for _ in range(3):
        fn()
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
    ap = argparse.ArgumentParser()
    ap.add_argument("--fla", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(1)
    variants = [(2, 4), (1, 4), (2, 2), (1, 8)]
    mods = {}
    for v in variants:
        mods[v], regs = build(*v)
        print(f"variant cpl={v[0]} warps={v[1]}: {regs.splitlines()[-1] if regs else ''}")

    print("== correctness (rel err vs float64; every element written)")
    worst = 0.0
    shapes = [  # B, L, Hk, Hv, dk, dv, slots, pad_tail
        (1, 130, 2, 4, 128, 128, 1, 0), (3, 37, 2, 2, 64, 40, 2, 5), (2, 64, 1, 3, 32, 24, 2, 0),
        (2, 20, 4, 8, 256, 64, 1, 3), (5, 1, 2, 4, 128, 128, 2, 0), (1, 0, 2, 4, 128, 128, 1, 0),
    ]
    for shape in shapes:
        B, L, Hk, Hv, dk, dv, slots, pad = shape
        qkv, beta, g, s0, slot = inputs(B, L, Hk, Hv, dk, dv, slots, pad, gen)
        scale = dk ** -0.5
        ro, rs = reference(qkv, beta, g, s0, slot, Hk, Hv, dk, dv, scale)
        for v, mod in mods.items():
            o, s = launch(mod, *v, qkv, beta, g, s0, slot, Hk, Hv, dk, dv, scale)
            torch.cuda.synchronize()
            assert not torch.isnan(s).any(), f"unwritten state {shape} {v}"
            assert not torch.isnan(o).any(), f"unwritten output {shape} {v}"
            eo = ((o.double() - ro).norm() / ro.norm().clamp_min(1e-30)).item() if L else 0.0
            es = ((s.double() - rs).norm() / rs.norm()).item()
            worst = max(worst, eo, es)
        if pad:  # state after padded steps == state after the real ones
            ro2, rs2 = reference(qkv[:, : L - pad], beta[:, : L - pad], g[:, : L - pad], s0, slot, Hk, Hv, dk, dv, scale)
            o, s = launch(mods[(2, 4)], 2, 4, qkv, beta, g, s0, slot, Hk, Hv, dk, dv, scale)
            es = ((s.double() - rs2).norm() / rs2.norm()).item()
            worst = max(worst, es)
        print(f"  shape {shape}: ok")
    print(f"  worst relative error {worst:.2e}")
    assert worst < 1e-5, worst

    print("== causal conv + SiLU (kernel gdn_causal_conv_silu) vs float64")
    conv_f = mods[variants[0]].get_function("gdn_causal_conv_silu")
    ptr = lambda t: cp.uint64(t.data_ptr()) if t is not None else cp.uint64(0)
    def conv_launch(p, st, w, lens, out, ns):
        B, L, Cc = p.shape
        Kc = w.shape[1]
        rows = B * L + B * (Kc - 1)  # one thread per channel, runs of 16 rows per row block
        conv_f(((Cc + 255) // 256, max(1, min((rows + 15) // 16, 65535))), (256,), (ptr(p), ptr(st), ptr(w), ptr(lens), ptr(out), ptr(ns),
                                             cp.int32(B), cp.int32(L), cp.int32(Cc), cp.int32(Kc)))
    for B, L, Cc, Kc, ragged in [(2, 37, 40, 4, True), (1, 300, 96, 4, False), (3, 2, 16, 4, True), (2, 5, 8, 2, False)]:
        p = torch.randn(B, L, Cc, device="cuda", generator=gen)
        st = torch.randn(B, Kc - 1, Cc, device="cuda", generator=gen)
        w = torch.randn(Cc, Kc, device="cuda", generator=gen) * 0.5
        lens = torch.tensor([max(1, L - 3 * i) if ragged else L for i in range(B)], device="cuda", dtype=torch.int32)
        x = torch.cat([st, p], 1).double()
        ref = torch.zeros(B, L, Cc, dtype=torch.float64, device="cuda")
        for j in range(Kc):
            ref += x[:, j:j + L] * w[:, j].double()
        ref = ref * torch.sigmoid(ref)
        ref_state = torch.stack([x[b, int(lens[b]):int(lens[b]) + Kc - 1] for b in range(B)])
        out = torch.full_like(p, float("nan"))
        ns = torch.full_like(st, float("nan"))
        conv_launch(p, st, w, lens if ragged else None, out, ns)
        torch.cuda.synchronize()
        for b in range(B):
            n = int(lens[b])
            e = ((out[b, :n].double() - ref[b, :n]).norm() / ref[b, :n].norm()).item()
            assert e < 1e-6 and not torch.isnan(out[b, :n]).any(), (B, L, Cc, e)
        assert torch.equal(ns.double(), ref_state), "conv state differs"
    qkv_like = torch.randn(1, 2000, 8192, device="cuda", generator=gen)
    st = torch.randn(1, 3, 8192, device="cuda", generator=gen)
    w = torch.randn(8192, 4, device="cuda", generator=gen)
    out = torch.empty_like(qkv_like); ns = torch.empty_like(st)
    print(f"  ok; 2000 tokens x 8192 channels: {time_ms(lambda: conv_launch(qkv_like, st, w, None, out, ns)):.3f} ms")

    print("== timing, Qwen3.5-4B linear-attention layer shape (Hk 16, Hv 32, dk = dv = 128)")
    Hk, Hv, dk, dv = 16, 32, 128, 128
    rows = []
    for label, B, L, slots in [("prefill 2000 tok", 1, 2000, 1), ("prefill 1000 tok", 1, 1000, 1),
                               ("4 ctx x 1000 tok", 4, 1000, 4), ("score 28 rows x 8", 28, 8, 1)]:
        qkv, beta, g, s0, slot = inputs(B, L, Hk, Hv, dk, dv, slots, 0, gen)
        out = torch.empty(B, L, Hv, dv, device="cuda")
        s1 = torch.empty(B, Hv, dk, dv, device="cuda")
        res = {}
        for v, mod in mods.items():
            res[v] = time_ms(lambda: launch(mod, *v, qkv, beta, g, s0, slot, Hk, Hv, dk, dv, dk ** -0.5, out, s1))
        fla_ms = None
        if args.fla:
            try:
                from fla.ops.gated_delta_rule import chunk_gated_delta_rule
                q = qkv[..., : Hk * dk].reshape(B, L, Hk, dk).repeat_interleave(Hv // Hk, 2).to(torch.bfloat16)
                k = qkv[..., Hk * dk: 2 * Hk * dk].reshape(B, L, Hk, dk).repeat_interleave(Hv // Hk, 2).to(torch.bfloat16)
                vv = qkv[..., 2 * Hk * dk:].reshape(B, L, Hv, dv).to(torch.bfloat16)
                st = s0[slot.long()].contiguous()
                fn = lambda: chunk_gated_delta_rule(q, k, vv, g=g, beta=beta, initial_state=st,
                                                    output_final_state=True, use_qk_l2norm_in_kernel=True)
                fla_ms = time_ms(fn)
            except Exception as e:  # noqa: BLE001
                fla_ms = f"unavailable: {type(e).__name__}: {e}"[:120]
        rows.append((label, res, fla_ms))
    for label, res, fla_ms in rows:
        cells = "  ".join(f"cpl{v[0]}w{v[1]} {t:.3f}" for v, t in res.items())
        print(f"  {label:18s} {cells}  | fla chunk (bf16) {fla_ms if isinstance(fla_ms, str) or fla_ms is None else f'{fla_ms:.3f}'} ms")


if __name__ == "__main__":
    main()
