#!/usr/bin/env python3
"""Checks and times kernels/cuda/gdn_chunked.cu (the chunked gated delta rule) on the GPU
machine, next to the token-by-token kernel it replaces for prefill.

  python3 scripts/gpu-kernels/gdn_chunk_harness.py

1. compiles the very .cu sources with nvcc (sm_90a cubins) and loads them with CuPy;
2. correctness: against the float64 recurrence of gdn_harness.py on fresh random inputs (several
   shapes: partial last chunks, one token, slot gather, β = g = 0 padding, dk 32 / 64 / 128,
   dv a multiple of 16) — relative error of outputs and final state (TF32 products: bound
   TF32_REL), every element written;
3. timing (CUDA events around 20 back-to-back calls, median of 5 rounds): the Qwen3.5-4B layer shape (Hk 16, Hv 32, dk = dv = 128)
   at 1,000 / 1,547 / 2,048 / 4,096 tokens (B = 1): chunked (prep + scan) vs recurrent, and vs
   flash-linear-attention's chunk_gated_delta_rule on the same inputs when it is importable
   (FLA_PATH=folder of the unpacked fla-core / flash-linear-attention wheels).
"""
import os
import subprocess
import sys
import tempfile

import cupy as cp
import torch

sys.path.insert(0, os.path.dirname(__file__))
import gdn_harness as rec  # noqa: E402  (reference, inputs, launch, time_ms)

SRC = os.environ.get("GDN_CHUNKED_SRC") or os.path.join(os.path.dirname(__file__), "..", "..", "kernels", "cuda", "gdn_chunked.cu")
C, NT, TILE = 64, 256, 32


TILES = {}  # id(module) -> its scan tile (value columns per scan block)


def build(tile=TILE):
    out = os.path.join(tempfile.gettempdir(), f"gdn_chunked_{tile}.cubin")
    cmd = ["nvcc", "-cubin", "-O3", "-std=c++17", "-arch=sm_90a", "-lineinfo", f"-DGDN_SCAN_TILE={tile}",
           "-Xptxas", "-v", "-o", out, SRC]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    print("\n".join(l for l in r.stderr.splitlines() if "registers" in l or "spill" in l)[-400:])
    mod = cp.RawModule(path=out)
    TILES[id(mod)] = tile
    return mod


# TF32 tensor-core products (10 mantissa bits): relative error vs float64 of ~1e-4..1e-3.
TF32_REL = 5e-3


def prep_smem(dk, dv):
    tri = 2 * C * (C + 4)  # prep's regions are reused (see the kernel's layout)
    return 4 * (max(C * (dk + 8), tri) + C * (dk + 8) + max(C * (dv + 8), tri) + 5 * C)


def scan_smem(dk, tile=TILE):
    sld = tile + 8
    return 4 * (dk * sld + 3 * C * sld + 3 * C * (dk + 8) + C * (C + 8))


def ws_per_chunk(dk, dv):
    return (C * dk * 3 + C * dv + C * C + 1 + 7) // 8 * 8


_FUNCS = {}


def functions(mod, dk, dv):
    """The two kernels; the shared-memory opt-in is raised only when a launch needs more (the
    attribute belongs to the kernel, so it is not reset inside timed loops)."""
    key = (id(mod), dk)
    if key not in _FUNCS:
        _FUNCS[key] = [mod.get_function(f"gdn_chunk_prep_dk{dk}"),
                       mod.get_function(f"gdn_chunk_scan_dk{dk}"), 0, 0]
    f = _FUNCS[key]
    if prep_smem(dk, dv) > f[2]:
        f[2] = prep_smem(dk, dv)
        f[0].max_dynamic_shared_size_bytes = f[2]
    tile = TILES.get(id(mod), TILE)
    if scan_smem(dk, tile) > f[3]:
        f[3] = scan_smem(dk, tile)
        f[1].max_dynamic_shared_size_bytes = f[3]
    return f[0], f[1]


def launch(mod, qkv, beta, g, s0, slot, Hk, Hv, dk, dv, scale, ws=None, out=None, s1=None,
           parts=("prep", "scan")):
    B, L, _ = qkv.shape
    nc = (L + C - 1) // C
    if out is None:
        out = torch.full((B, L, Hv, dv), float("nan"), device="cuda")
        s1 = torch.full((B, Hv, dk, dv), float("nan"), device="cuda")
    if ws is None:
        ws = torch.empty(B * Hv * max(nc, 1) * ws_per_chunk(dk, dv), device="cuda")
    ptr = lambda t: cp.uint64(t.data_ptr()) if t is not None else cp.uint64(0)
    prep, scan = functions(mod, dk, dv)
    if nc > 0 and "prep" in parts:
        prep((nc, Hv, B), (NT,), (ptr(qkv), ptr(beta), ptr(g), ptr(ws), cp.int32(L), cp.int32(Hk),
                                  cp.int32(Hv), cp.int32(dv), cp.float32(scale), cp.float32(rec.L2_EPS)),
             shared_mem=prep_smem(dk, dv))
    if "scan" in parts:
        tile = TILES.get(id(mod), TILE)
        scan_nt = 32 * (C // 16) * (tile // 16)
        scan(((dv + tile - 1) // tile, Hv, B), (scan_nt,), (ptr(ws), ptr(s0), ptr(slot), ptr(out), ptr(s1),
                                                            cp.int32(L), cp.int32(Hv), cp.int32(dv), cp.int32(nc)),
             shared_mem=scan_smem(dk, tile))
    return out, s1


def time_loop_ms(fn, reps=20, rounds=5):
    """GPU time per call: `reps` calls back to back between two events (so the host's launch
    overhead hides behind the GPU work), median over `rounds`."""
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / reps)
    return sorted(ts)[len(ts) // 2]


def fla_chunk():
    """flash-linear-attention's chunked gated delta rule when it is importable (FLA_PATH or the
    environment), else None."""
    if os.environ.get("FLA_PATH"):
        sys.path.insert(0, os.environ["FLA_PATH"])
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:  # noqa: BLE001
        print(f"  (flash-linear-attention not importable: {type(e).__name__}: {e})")
        return None
    return chunk_gated_delta_rule


def fla_time(fla, qkv, beta, g, s0, Hk, Hv, dk, dv):
    """GPU time of one flash-linear-attention call on the same layer, as transformers makes it
    for Qwen3.5: bf16 q/k/v with the key heads repeated to the value heads, q/k L2-normalised in
    the kernel, f32 initial state, final state returned."""
    B, L, _ = qkv.shape
    q = qkv[..., : Hk * dk].reshape(B, L, Hk, dk).repeat_interleave(Hv // Hk, dim=2).bfloat16()
    k = qkv[..., Hk * dk: 2 * Hk * dk].reshape(B, L, Hk, dk).repeat_interleave(Hv // Hk, dim=2).bfloat16()
    v = qkv[..., 2 * Hk * dk:].reshape(B, L, Hv, dv).bfloat16()
    b16 = beta.bfloat16()
    st = s0[:B].contiguous()
    call = lambda: fla(q, k, v, g=g, beta=b16, scale=dk ** -0.5, initial_state=st,
                       output_final_state=True, use_qk_l2norm_in_kernel=True)
    for _ in range(2):  # Triton compiles / autotunes per shape
        call()
    torch.cuda.synchronize()
    return time_loop_ms(call)


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(3)
    mod = build()
    mod16 = build(16)
    if "--once" in sys.argv:  # one 2,048-token call of the 4B layer shape, for a profiler
        qkv, beta, g, s0, slot = rec.inputs(1, 2048, 16, 32, 128, 128, 1, 0, gen)
        launch(mod, qkv, beta, g, s0, slot, 16, 32, 128, 128, 128 ** -0.5)
        torch.cuda.synchronize()
        return
    rmod, _ = rec.build(2, 4)
    print("== correctness (rel err vs float64; every element written)")
    worst = 0.0
    shapes = [  # B, L, Hk, Hv, dk, dv, slots, pad_tail
        (1, 130, 2, 4, 128, 128, 1, 0), (3, 37, 2, 2, 64, 48, 2, 5), (2, 64, 1, 3, 32, 32, 2, 0),
        (2, 200, 2, 4, 128, 96, 2, 7), (1, 1, 2, 4, 128, 128, 1, 0), (1, 513, 4, 8, 128, 128, 1, 0),
        (2, 65, 2, 4, 64, 64, 1, 0),
    ]
    for shape in shapes:
        B, L, Hk, Hv, dk, dv, slots, pad = shape
        qkv, beta, g, s0, slot = rec.inputs(B, L, Hk, Hv, dk, dv, slots, pad, gen)
        scale = dk ** -0.5
        ro, rs = rec.reference(qkv, beta, g, s0, slot, Hk, Hv, dk, dv, scale)
        o, s = launch(mod, qkv, beta, g, s0, slot, Hk, Hv, dk, dv, scale)
        o16, s16 = launch(mod16, qkv, beta, g, s0, slot, Hk, Hv, dk, dv, scale)
        torch.cuda.synchronize()
        same16 = torch.equal(o16, o) and torch.equal(s16, s)
        print(f"  scan tile 16 bit-identical to tile 32: {same16}")
        worst = max(worst, 0 if same16 else 1)
        ok_written = not torch.isnan(s).any().item() and not torch.isnan(o).any().item()
        eo = ((o.double() - ro).norm() / ro.norm().clamp_min(1e-30)).item() if L else 0.0
        es = ((s.double() - rs).norm() / rs.norm()).item()
        ro2, _ = rec.launch(rmod, 2, 4, qkv, beta, g, s0, slot, Hk, Hv, dk, dv, scale)
        erec = ((o - ro2).abs().max()).item() if L else 0.0
        worst = max(worst, eo, es)
        print(f"  shape {shape}: out {eo:.2e}, state {es:.2e}, max|chunked − recurrent| {erec:.2e}, "
              f"{'all written' if ok_written else 'UNWRITTEN'}")
        worst = max(worst, 0 if ok_written else 1)
    print(f"  worst relative error {worst:.2e}")
    print("== timing, Qwen3.5-4B layer (Hk 16, Hv 32, dk = dv = 128), B = 1 (ms, median)")
    fla = fla_chunk()
    print("| tokens | recurrent | chunked | prep | scan | scan, tile 16 | recurrent ÷ chunked | fla chunk (bf16 in) | fla ÷ chunked |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for L in (1000, 1547, 2048, 4096):
        qkv, beta, g, s0, slot = rec.inputs(1, L, 16, 32, 128, 128, 1, 0, gen)
        nc = (L + C - 1) // C
        ws = torch.empty(32 * nc * ws_per_chunk(128, 128), device="cuda")
        out = torch.empty(1, L, 32, 128, device="cuda")
        s1 = torch.empty(1, 32, 128, 128, device="cuda")
        args = (qkv, beta, g, s0, slot, 16, 32, 128, 128, 128 ** -0.5)
        tr = time_loop_ms(lambda: rec.launch(rmod, 2, 4, *args, out, s1))
        tc = time_loop_ms(lambda: launch(mod, *args, ws, out, s1))
        tp = time_loop_ms(lambda: launch(mod, *args, ws, out, s1, parts=("prep",)))
        ts = time_loop_ms(lambda: launch(mod, *args, ws, out, s1, parts=("scan",)))
        t16 = time_loop_ms(lambda: launch(mod16, *args, ws, out, s1, parts=("scan",)))
        tf = fla_time(fla, qkv, beta, g, s0, 16, 32, 128, 128) if fla else None
        peer = f"{tf:.3f} | {tf / tc:.2f}×" if tf else "– | –"
        print(f"| {L:,} | {tr:.3f} | {tc:.3f} | {tp:.3f} | {ts:.3f} | {t16:.3f} | {tr / tc:.1f}× | {peer} |")
    packed = os.environ.get("GDN_PACKED", "3x1365,4x1024,6x683")
    tiles = [int(t) for t in os.environ.get("GDN_TILES", "16,32,64").split(",")]
    mods = {32: mod, 16: mod16}
    for t in tiles:
        if t not in mods:
            mods[t] = build(t)
    print("== packed prefill passes (B prefixes of L tokens from zero state, the shape of a packed")
    print("   pass after right-padding), Qwen3.5-4B layer shape (ms, median); scan per value tile")
    print("| B × L | prep | " + " | ".join(f"scan, tile {t}" for t in tiles) + " | fla chunk (bf16 in) |")
    print("|---|---:|" + "---:|" * len(tiles) + "---:|")
    for spec in packed.split(","):
        B, L = (int(x) for x in spec.split("x"))
        qkv, beta, g, s0, slot = rec.inputs(B, L, 16, 32, 128, 128, B, 0, gen)
        nc = (L + C - 1) // C
        ws = torch.empty(B * 32 * nc * ws_per_chunk(128, 128), device="cuda")
        out = torch.empty(B, L, 32, 128, device="cuda")
        s1 = torch.empty(B, 32, 128, 128, device="cuda")
        args = (qkv, beta, g, s0, None, 16, 32, 128, 128, 128 ** -0.5)
        tp = time_loop_ms(lambda: launch(mod, *args, ws, out, s1, parts=("prep",)))
        ref_o, ref_s = launch(mods[tiles[0]], *args, None, None, None)
        scans = []
        for t in tiles:
            scans.append(time_loop_ms(lambda: launch(mods[t], *args, ws, out, s1, parts=("scan",))))
            o, st = launch(mods[t], *args, None, None, None)
            torch.cuda.synchronize()
            if not (torch.equal(o, ref_o) and torch.equal(st, ref_s)):
                print(f"  tile {t} NOT bit-identical to tile {tiles[0]} at {spec}")
                worst = 1.0
        tf = fla_time(fla, qkv, beta, g, s0, 16, 32, 128, 128) if fla else None
        peer = f"{tf:.3f}" if tf else "–"
        print(f"| {B} × {L:,} | {tp:.3f} | " + " | ".join(f"{x:.3f}" for x in scans) + f" | {peer} |")
    print("== short calls from one forked state (a scoring pass: B rows of L tokens, every row")
    print("   starting from slot 0 through slot_of_row), Qwen3.5-4B layer shape (ms, median)")
    print("| rows | tokens | recurrent | chunked | prep | scan | recurrent ÷ chunked |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for B, L in ((8, 12), (8, 24), (28, 12), (28, 24), (28, 48), (64, 24)):
        qkv, beta, g, s0, slot = rec.inputs(B, L, 16, 32, 128, 128, 1, 0, gen)
        nc = (L + C - 1) // C
        ws = torch.empty(B * 32 * nc * ws_per_chunk(128, 128), device="cuda")
        out = torch.empty(B, L, 32, 128, device="cuda")
        s1 = torch.empty(B, 32, 128, 128, device="cuda")
        args = (qkv, beta, g, s0, slot, 16, 32, 128, 128, 128 ** -0.5)
        tr = time_loop_ms(lambda: rec.launch(rmod, 2, 4, *args, out, s1))
        tc = time_loop_ms(lambda: launch(mod, *args, ws, out, s1))
        tp = time_loop_ms(lambda: launch(mod, *args, ws, out, s1, parts=("prep",)))
        ts = time_loop_ms(lambda: launch(mod, *args, ws, out, s1, parts=("scan",)))
        print(f"| {B} | {L} | {tr:.3f} | {tc:.3f} | {tp:.3f} | {ts:.3f} | {tr / tc:.1f}× |")
    print(f"[gdn-chunk] {'PASS' if worst < TF32_REL else 'FAIL'} (TF32 bound {TF32_REL:g})")
    sys.exit(0 if worst < TF32_REL else 1)


if __name__ == "__main__":
    main()
