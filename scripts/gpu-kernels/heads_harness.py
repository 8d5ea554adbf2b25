#!/usr/bin/env python3
"""Checks and times kernels/cuda/heads_norm_rope.cu (a projection's output into head-major heads
with the projection's bias, the per-head RMSNorm and the rotary embedding fused) on the GPU
machine.

  python3 scripts/gpu-kernels/heads_harness.py

1. compiles the very .cu source with nvcc (sm_90a cubin) and loads it with CuPy;
2. correctness against the same function in PyTorch (f32 math on the bf16 inputs, the normed
   value rounded to bf16 as candle's rmsnorm stores it, one final rounding) and against the
   candle-like bf16 sequence (norm, transpose, rope in bf16, concatenation): max |Δ| in bf16
   rounding steps at each case's largest magnitude, bound 2 (the fused kernel's rsqrt and fused
   multiply-adds may move a normed value by one step, which the rope carries);
3. timing (CUDA events, median of 5 rounds of 20 calls) at the Qwen3.5-4B attention shapes
   (q: 16 heads × 256 read through the q | gate interleave, k: 4 heads × 256, rotary 64) for a
   packed pass of 4,096 tokens and a scoring pass, against the PyTorch sequence of separate ops;
   and at the Qwen2.5-1.5B stacked q|k|v shape (12 + 2 + 2 heads × 128, biased, full rotation):
   the three fused launches (q and k rotated, v laid out, each adding its bias) against the bias
   add over the whole product followed by the same three launches without a bias.
"""
import os
import subprocess
import sys
import tempfile

import cupy as cp
import torch

sys.path.insert(0, os.path.dirname(__file__))
from gdn_chunk_harness import time_loop_ms as time_ms  # noqa: E402  (events around back-to-back calls)

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "kernels", "cuda", "heads_norm_rope.cu")
WARPS = 8


def build():
    out = os.path.join(tempfile.gettempdir(), "heads_norm_rope.cubin")
    r = subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90a", "-o", out, SRC], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    return cp.RawModule(path=out).get_function("heads_norm_rope_bf16")


def launch(f, x, tok_stride, head_stride, B, L, H, hd, w, cos, sin, rot, eps, out=None, bias=None):
    T = B * L
    if out is None:
        out = torch.full((B, H, L, hd), float("nan"), device="cuda", dtype=torch.bfloat16)
    ptr = lambda t: cp.uint64(t.data_ptr()) if t is not None else cp.uint64(0)
    grid = ((T * H + WARPS - 1) // WARPS,)
    f(grid, (WARPS * 32,), (ptr(x), ptr(bias), ptr(w), ptr(cos), ptr(sin), ptr(out), cp.int32(T), cp.int32(L),
                            cp.int32(H), cp.int32(hd), cp.int32(rot), cp.int64(tok_stride),
                            cp.int64(head_stride), cp.float32(eps)))
    return out


def reference(xv, w, cos, sin, rot, eps, candle_like=False, bias=None):
    """xv (B, L, H, hd) bf16 view (plus bias (H·hd), rounded to bf16 as a bf16 add) -> (B, H, L, hd) bf16."""
    if bias is not None:
        xv = (xv.float() + bias.float().view(xv.shape[2], xv.shape[3])).bfloat16()
    x = xv.float()
    if w is not None:
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()
        n = n.bfloat16()
    else:
        n = xv.bfloat16()
    n = n.transpose(1, 2).contiguous()  # (B, H, L, hd)
    if rot == 0:
        return n
    half = rot // 2
    B, H, L, hd = n.shape
    c = cos.reshape(B, 1, L, half)
    s = sin.reshape(B, 1, L, half)
    a, b2, rest = n[..., :half], n[..., half:rot], n[..., rot:]
    if candle_like:  # bf16 arithmetic, as candle's rope kernel on bf16
        y = torch.cat([a * c - b2 * s, b2 * c + a * s, rest], -1)
        return y
    a, b2, c, s = a.float(), b2.float(), c.float(), s.float()
    y = torch.cat([a * c - b2 * s, b2 * c + a * s, rest.float()], -1)
    return y.bfloat16()


def steps(a, b):
    """max |a − b| in bf16 rounding steps at the case's largest magnitude (2^-7 · max |b|): the
    rope's differences of products cancel, so an element-wise relative error says nothing near
    zero."""
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / (b.abs().max() * 2.0 ** -7)).item()


def case(f, B, L, H, hd, rot, gated, norm, gen, eps=1e-6):
    width = 2 * hd if gated else hd
    proj = torch.randn(B, L, H * width, device="cuda", generator=gen).bfloat16() * 3
    xv = proj.view(B, L, H, width)[..., :hd]
    w = (torch.rand(hd, device="cuda", generator=gen) + 0.5).bfloat16() if norm else None
    pos = torch.randint(0, 8192, (B * L,), device="cuda", generator=gen).float()
    inv = 1.0 / (1e7 ** (torch.arange(0, rot, 2, device="cuda").float() / rot)) if rot else None
    ang = pos[:, None] * inv[None, :] if rot else None
    cos = ang.cos().bfloat16().contiguous() if rot else None
    sin = ang.sin().bfloat16().contiguous() if rot else None
    out = launch(f, proj, H * width, width, B, L, H, hd, w, cos, sin, rot, eps)
    torch.cuda.synchronize()
    ref = reference(xv, w, cos, sin, rot, eps)
    like = reference(xv, w, cos, sin, rot, eps, candle_like=True)
    return out, ref, like, (proj, xv, w, cos, sin)


def main():
    f = build()
    gen = torch.Generator(device="cuda").manual_seed(5)
    worst = 0.0
    print("== correctness (max error in bf16 rounding steps at the largest magnitude)")
    for B, L, H, hd, rot, gated, norm in [
        (1, 4096, 16, 256, 64, True, True), (1, 4096, 4, 256, 64, False, True),
        (3, 37, 8, 128, 128, False, True), (2, 5, 2, 64, 0, False, False), (1, 9, 4, 256, 64, False, False),
        (28, 12, 16, 256, 64, True, True), (1, 1, 1, 512, 32, False, True),
    ]:
        out, ref, like, _ = case(f, B, L, H, hd, rot, gated, norm, gen)
        e, el = steps(out, ref), steps(out, like)
        written = not torch.isnan(out.float()).any().item()
        print(f"  B {B} L {L} H {H} hd {hd} rot {rot} gated {gated} norm {norm}: vs f32 form {e:.2f}, "
              f"vs candle-like bf16 form {el:.2f}, {'all written' if written else 'UNWRITTEN'}")
        worst = max(worst, e if written else 99)
    print("== timing (ms, median): fused vs the PyTorch sequence (norm, transpose, rope, cat)")
    print("| shape | fused | separate ops | separate ÷ fused |")
    print("|---|---:|---:|---:|")
    for name, (B, L, H, gated) in {"q, packed pass 4,096 tokens": (1, 4096, 16, True),
                                   "k, packed pass 4,096 tokens": (1, 4096, 4, False),
                                   "q, scoring 28 rows × 24": (28, 24, 16, True)}.items():
        out, ref, like, (proj, xv, w, cos, sin) = case(f, B, L, H, 256, 64, gated, True, gen)
        width = 512 if gated else 256
        tf = time_ms(lambda: launch(f, proj, H * width, width, B, L, H, 256, w, cos, sin, 64, 1e-6, out))
        ts = time_ms(lambda: reference(xv, w, cos, sin, 64, 1e-6, candle_like=True))
        print(f"| {name} | {tf:.4f} | {ts:.4f} | {ts / tf:.1f}× |")
    print("== the stacked q|k|v of Qwen2.5-1.5B with its bias (12 + 2 + 2 heads × 128, full rotation)")
    for B, L in [(1, 1250), (28, 5)]:
        H, Hkv, hd = 12, 2, 128
        n = H + 2 * Hkv
        proj = torch.randn(B, L, n * hd, device="cuda", generator=gen).bfloat16() * 3
        bias = (torch.randn(n * hd, device="cuda", generator=gen) * 2).bfloat16()
        pos = torch.randint(0, 8192, (B * L,), device="cuda", generator=gen).float()
        inv = 1.0 / (1e6 ** (torch.arange(0, hd, 2, device="cuda").float() / hd))
        ang = pos[:, None] * inv[None, :]
        cos, sin = ang.cos().bfloat16().contiguous(), ang.sin().bfloat16().contiguous()
        view = proj.view(B, L, n, hd)
        parts = [(0, H, hd), (H, Hkv, hd), (H + Hkv, Hkv, 0)]  # (first head, heads, rotary dims)

        def fused():
            return [launch(f, proj[..., h0 * hd:], n * hd, hd, B, L, nh, hd, None, cos if r else None,
                           sin if r else None, r, 0.0, bias=bias[h0 * hd:(h0 + nh) * hd])
                    for h0, nh, r in parts]

        def apart():
            biased = proj + bias  # the bias add over the whole product, bf16
            return [launch(f, biased[..., h0 * hd:], n * hd, hd, B, L, nh, hd, None, cos if r else None,
                           sin if r else None, r, 0.0) for h0, nh, r in parts]

        outs, outs_apart = fused(), apart()
        torch.cuda.synchronize()
        for (h0, nh, r), o, oa in zip(parts, outs, outs_apart):
            ref = reference(view[:, :, h0:h0 + nh], None, cos, sin, r, 0.0, bias=bias[h0 * hd:(h0 + nh) * hd])
            e = steps(o, ref)
            same = torch.equal(o, oa)
            print(f"  B {B} L {L} heads {h0}..{h0 + nh} rot {r}: vs f32 form {e:.2f}, "
                  f"bit-identical to the bias add then the kernel: {same}")
            worst = max(worst, e if same else 99)
        tf, ta = time_ms(fused), time_ms(apart)
        print(f"| q|k|v ({B} × {L}) | {tf:.4f} | {ta:.4f} | {ta / tf:.1f}× |")
    ok = worst <= 2.0
    print(f"[heads] {'PASS' if ok else 'FAIL'} (worst {worst:.2f} bf16 steps, bound 2)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
