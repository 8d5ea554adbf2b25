#!/usr/bin/env python3
"""Checks and times kernels/cuda/flash_attn.cu's two batched forms on the GPU machine:

1. varlen prefill (`seg_off`): segments packed back to back in one launch — each segment's
   output bit-identical to a solo launch of that segment, and close to float32 attention;
2. the per-slot past table (`slot_past`): scoring rows over several separately stored pasts in
   one launch — each slot's rows (up to the slot's own length) bit-identical to a solo launch
   over that slot's stacked past, and close to float32 attention;
3. timing (CUDA events, median of 20): one varlen launch vs one launch per segment at the
   Qwen2.5-1.5B shape (12 / 2 heads, head dim 128) and the Qwen3.5-4B shape (16 / 4, 256);
   one table launch vs one launch per slot for a scoring pass.

  python3 scripts/gpu-kernels/flash_varlen_harness.py
Prints ALL OK or FAILED (exit 1).
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
    out = os.path.join(tempfile.gettempdir(), "flash_attn_varlen.cubin")
    cmd = ["nvcc", "-cubin", "-O3", "-std=c++17", "-arch=sm_90a", "-o", out, SRC]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    return cp.RawModule(path=out)


MOD = build()


def smem(hd):
    return (BM + 4 * BN[hd]) * (hd + PAD) * 2


def ptr(t):
    return 0 if t is None else t.data_ptr()


def launch(q, kn, vn, kp=None, vp=None, seg_off=None, table=None, S=0):
    """q (B, H, L, hd); kn, vn (B, Hkv, L, hd); kp, vp (Hkv, S, P, hd) or a slot table."""
    B, H, L, hd = q.shape
    hkv = kn.shape[1]
    P = kp.shape[2] if kp is not None else 0
    if kp is not None:
        S = kp.shape[1]
    out = torch.empty(B, L, H * hd, dtype=torch.bfloat16, device="cuda")
    f = MOD.get_function(f"flash_attn_hd{hd}")
    f.max_dynamic_shared_size_bytes = smem(hd)
    g = H // hkv
    if seg_off is not None:
        lens = (seg_off[1:] - seg_off[:-1]).tolist()
        tiles = sum((g * n + BM - 1) // BM for n in lens)
        n_seg = len(lens)
    else:
        tiles, n_seg = (g * L + BM - 1) // BM, 0
    f((tiles, hkv, B), (128,),
      (ptr(q), ptr(kn), ptr(vn), ptr(kp), ptr(vp), 0, 0, ptr(seg_off), cp.int32(n_seg), ptr(table),
       ptr(out), cp.int32(B), cp.int32(H), cp.int32(hkv), cp.int32(L), cp.int32(S), cp.int32(P),
       cp.float32(1.0 / math.sqrt(hd) * math.log2(math.e))),
      shared_mem=smem(hd))
    return out


def reference(q, k, v, mask):
    """q (H, Lq, hd), k / v (Hkv, Lk, hd), mask (Lq, Lk) -> (Lq, H*hd) in float32."""
    h, hkv = q.shape[0], k.shape[0]
    k = k.repeat_interleave(h // hkv, 0).float()
    v = v.repeat_interleave(h // hkv, 0).float()
    s = (q.float() @ k.transpose(1, 2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask, float("-inf"))
    return (s.softmax(-1) @ v).transpose(0, 1).reshape(q.shape[1], -1)


def timed(fn, reps=20):
    fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def rnd(*shape):
    return torch.randn(*shape, device="cuda").bfloat16()


def main():
    torch.manual_seed(0)
    ok = True
    for hd, h, hkv in [(128, 12, 2), (256, 16, 4), (64, 8, 8)]:
        lens = [100, 37, 250, 1, 64, 129, 0, 5]
        t = sum(lens)
        q, k, v = rnd(1, h, t, hd), rnd(1, hkv, t, hd), rnd(1, hkv, t, hd)
        offs = [0]
        for n in lens:
            offs.append(offs[-1] + n)
        seg_off = torch.tensor(offs, dtype=torch.int32, device="cuda")
        out = launch(q, k, v, seg_off=seg_off)
        err, ident = 0.0, True
        for s, n in enumerate(lens):
            if n == 0:
                continue
            o = offs[s]
            sl = slice(o, o + n)
            solo = launch(q[:, :, sl].contiguous(), k[:, :, sl].contiguous(), v[:, :, sl].contiguous())
            ident &= torch.equal(solo[0], out[0, sl])
            m = torch.ones(n, n, dtype=torch.bool, device="cuda").tril()
            want = reference(q[0, :, sl], k[0, :, sl], v[0, :, sl], m)
            err = max(err, (out[0, sl].float() - want).abs().max().item())
        print(f"hd {hd}: varlen prefill of {len(lens)} segments: max |err| {err:.4f}, "
              f"bit-identical to solo launches: {ident}")
        ok &= err < 0.03 and ident

        # slot table: S slots of R rows, L new tokens; slot s's own rows use only its first n_s
        S, R, L = 3, 4, 9
        ps, ns = [150, 600, 17], [9, 4, 6]
        # each slot's K/V a view into a longer buffer (head stride != P * hd)
        bk = [rnd(hkv, p + 40, hd) for p in ps]
        bv = [rnd(hkv, p + 40, hd) for p in ps]
        table = torch.tensor(
            [[bk[i].data_ptr(), bv[i].data_ptr(), ps[i], bk[i].stride(0), bv[i].stride(0)]
             for i in range(S)], dtype=torch.int64, device="cuda")
        q, kn, vn = rnd(S * R, h, L, hd), rnd(S * R, hkv, L, hd), rnd(S * R, hkv, L, hd)
        out = launch(q, kn, vn, table=table, S=S)
        err, ident = 0.0, True
        for s in range(S):
            p, n = ps[s], ns[s]
            rows = slice(s * R, (s + 1) * R)
            kp = bk[s][:, :p].unsqueeze(1).contiguous()  # (Hkv, 1, P, hd)
            vp = bv[s][:, :p].unsqueeze(1).contiguous()
            solo = launch(q[rows, :, :n].contiguous(), kn[rows, :, :n].contiguous(),
                          vn[rows, :, :n].contiguous(), kp=kp, vp=vp)
            ident &= torch.equal(solo, out[rows, :n])
            for b in range(s * R, (s + 1) * R):
                kk = torch.cat([bk[s][:, :p], kn[b, :, :n]], 1)
                vv = torch.cat([bv[s][:, :p], vn[b, :, :n]], 1)
                m = torch.ones(n, p + n, dtype=torch.bool, device="cuda")
                m[:, p:] = torch.ones(n, n, dtype=torch.bool, device="cuda").tril()
                err = max(err, (out[b, :n].float() - reference(q[b, :, :n], kk, vv, m)).abs().max().item())
        print(f"hd {hd}: slot table of {S} slots: max |err| {err:.4f}, "
              f"bit-identical to per-slot launches: {ident}")
        ok &= err < 0.03 and ident

    for name, h, hkv, hd, n, segs in [("1.5B", 12, 2, 128, 600, 59), ("4B", 16, 4, 256, 1200, 6)]:
        t = n * segs
        q, k, v = rnd(1, h, t, hd), rnd(1, hkv, t, hd), rnd(1, hkv, t, hd)
        seg_off = torch.arange(0, t + 1, n, dtype=torch.int32, device="cuda")
        parts = [(q[:, :, i * n:(i + 1) * n].contiguous(), k[:, :, i * n:(i + 1) * n].contiguous(),
                  v[:, :, i * n:(i + 1) * n].contiguous()) for i in range(segs)]
        one = timed(lambda: launch(q, k, v, seg_off=seg_off))
        each = timed(lambda: [launch(*p) for p in parts])
        print(f"{name} prefill, {segs} x {n} tokens: one varlen launch {one:.3f} ms, "
              f"per-segment launches {each:.3f} ms")
        # scoring pass: segs slots of 8 rows x 12 tokens over pasts of n tokens
        S, R, L = segs, 8, 12
        bk = [rnd(hkv, 1, n, hd) for _ in range(S)]
        bv = [rnd(hkv, 1, n, hd) for _ in range(S)]
        table = torch.tensor([[bk[i].data_ptr(), bv[i].data_ptr(), n, bk[i].stride(0), bv[i].stride(0)]
                              for i in range(S)], dtype=torch.int64, device="cuda")
        q, kn, vn = rnd(S * R, h, L, hd), rnd(S * R, hkv, L, hd), rnd(S * R, hkv, L, hd)
        rows = [(q[i * R:(i + 1) * R].contiguous(), kn[i * R:(i + 1) * R].contiguous(),
                 vn[i * R:(i + 1) * R].contiguous(), bk[i], bv[i]) for i in range(S)]
        one = timed(lambda: launch(q, kn, vn, table=table, S=S))
        each = timed(lambda: [launch(a, b, c, kp=d, vp=e) for a, b, c, d, e in rows])
        print(f"{name} scoring, {S} slots x {R} rows x {L} tokens over {n}: one table launch "
              f"{one:.3f} ms, per-slot launches {each:.3f} ms")
    print("ALL OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
