#!/usr/bin/env python3
"""Times kernels/cuda/flash_attn.cu under other key tiles (BN) per head dim, at the shapes of
one decision's passes (Qwen2.5-1.5B: 12/2 heads x 128; Qwen3.5-4B: 16/4 x 256), and checks each
variant against float32 attention."""
import math, os, re, statistics, subprocess, sys, tempfile
import cupy as cp
import torch

SRC = open(os.path.join(os.path.dirname(__file__), "..", "..", "kernels", "cuda", "flash_attn.cu")).read()
BM, PAD = 64, 8

def build(bn128, bn256):
    src = SRC.replace("FLASH_ATTN_KERNEL(128, 64)", f"FLASH_ATTN_KERNEL(128, {bn128})") \
             .replace("FLASH_ATTN_KERNEL(256, 32)", f"FLASH_ATTN_KERNEL(256, {bn256})")
    d = tempfile.mkdtemp()
    p = os.path.join(d, "f.cu"); open(p, "w").write(src)
    out = os.path.join(d, "f.cubin")
    r = subprocess.run(["nvcc", "-cubin", "-O3", "-std=c++17", "-arch=sm_90a", "-o", out, p], capture_output=True, text=True)
    if r.returncode: sys.exit(r.stderr)
    return cp.RawModule(path=out)

def launch(mod, bn, q, kn, vn, kp=None, vp=None):
    B, H, L, hd = q.shape; hkv = kn.shape[1]
    P = kp.shape[2] if kp is not None else 0; S = kp.shape[1] if kp is not None else 0
    out = torch.empty(B, L, H * hd, dtype=torch.bfloat16, device="cuda")
    f = mod.get_function(f"flash_attn_hd{hd}")
    sm = (BM + 4 * bn) * (hd + PAD) * 2
    f.max_dynamic_shared_size_bytes = sm
    g = H // hkv
    tiles = (g * L + BM - 1) // BM
    p = lambda t: 0 if t is None else t.data_ptr()
    f((tiles, hkv, B), (128,), (p(q), p(kn), p(vn), p(kp), p(vp), 0, 0, 0, cp.int32(0), 0, p(out),
       cp.int32(B), cp.int32(H), cp.int32(hkv), cp.int32(L), cp.int32(S), cp.int32(P),
       cp.float32(1.0 / math.sqrt(hd) * math.log2(math.e))), shared_mem=sm)
    return out

def timed(fn, reps=30):
    fn(); ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1000)
    return statistics.median(ts)

def reference(q, kn, vn, kp, vp):
    # one row: q (H, L, hd), kn (Hkv, L, hd), past (Hkv, P, hd)
    H, L, hd = q.shape; hkv = kn.shape[0]
    k = torch.cat([kp, kn], 1) if kp is not None else kn
    v = torch.cat([vp, vn], 1) if vp is not None else vn
    P = k.shape[1] - L
    k = k.repeat_interleave(H // hkv, 0).float(); v = v.repeat_interleave(H // hkv, 0).float()
    s = q.float() @ k.transpose(1, 2) / math.sqrt(hd)
    m = torch.ones(L, P + L, dtype=torch.bool, device="cuda"); m[:, P:] = torch.ones(L, L, dtype=torch.bool, device="cuda").tril()
    s = s.masked_fill(~m, float("-inf"))
    return (s.softmax(-1) @ v).transpose(0, 1).reshape(L, -1)

rnd = lambda *s: torch.randn(*s, device="cuda").bfloat16()
torch.manual_seed(0)
cases = [  # name, B, H, Hkv, L, hd, P
    ("1.5B extend", 1, 12, 2, 1250, 128, 300),
    ("1.5B score", 28, 12, 2, 5, 128, 1549),
    ("1.5B packed-ish 4k", 1, 12, 2, 4000, 128, 0),
    ("4B extend", 1, 16, 4, 780, 256, 300),
    ("4B score", 8, 16, 4, 4, 256, 1079),
]
variants = [(64, 32), (32, 32), (32, 16), (128, 64)]
mods = {}
for v in variants:
    try: mods[v] = build(*v)
    except SystemExit as e: print("build", v, "failed", str(e)[:300])
for name, B, H, hkv, L, hd, P in cases:
    q, kn, vn = rnd(B, H, L, hd), rnd(B, hkv, L, hd), rnd(B, hkv, L, hd)
    kp = rnd(hkv, 1, P, hd) if P else None; vp = rnd(hkv, 1, P, hd) if P else None
    want = reference(q[0], kn[0], vn[0], kp[:, 0] if P else None, vp[:, 0] if P else None)
    line = f"{name:20s}"
    for v, mod in mods.items():
        bn = v[0] if hd == 128 else v[1]
        try:
            out = launch(mod, bn, q, kn, vn, kp, vp)
            err = (out[0].float() - want).abs().max().item()
            t = timed(lambda: launch(mod, bn, q, kn, vn, kp, vp))
            line += f" | BN{bn}: {t:7.1f} us err {err:.3f}"
        except Exception as e:
            line += f" | BN{bn}: error {str(e)[:60]}"
    print(line, flush=True)
