#!/usr/bin/env python3
"""Does a row of a cuBLAS bf16 GEMM depend on the other rows of the call? The question behind
batch invariance on CUDA: a context's hidden states are the rows of every linear layer's GEMM,
and a packed pass puts other contexts' rows beside them.

  python3 scripts/gpu-kernels/gemm_invariance_probe.py

For the linear layers of Qwen2.5-1.5B and Qwen3.5-4B (bf16 weights, f32 accumulation, through
torch.matmul = cuBLAS), a context of 1,079 rows is multiplied alone and inside calls of 4,096
and 8,192 rows at several offsets; and for fixed call sizes C, a block of rows at offset 0 and
at other offsets of the same C-row call. Prints, per case, how many of the context's rows are
not bit-identical to its solo product.
"""
import torch

SHAPES = {  # name: (K, N)
    "1.5B qkv": (1536, 2048), "1.5B o": (1536, 1536), "1.5B gate|up": (1536, 2 * 8960),
    "1.5B down": (8960, 1536), "4B attn q|gate|k|v": (2560, 2 * 4096 + 2 * 1024),
    "4B gate|up": (2560, 2 * 9216), "4B down": (9216, 2560),
}


def main():
    torch.manual_seed(0)
    dev = "cuda"
    n = 1079
    for name, (k, nout) in SHAPES.items():
        w = (torch.randn(nout, k, device=dev) / k ** 0.5).bfloat16()
        x = torch.randn(8192, k, device=dev).bfloat16()
        ctx = x[:n].clone()
        solo = ctx @ w.t()
        cells = []
        for m, off in [(4096, 0), (4096, 1500), (4096, 3000), (8192, 4000), (n + 1, 1)]:
            big = x[:m].clone()
            big[off:off + n] = ctx
            y = big @ w.t()
            diff = (y[off:off + n] != solo).any(dim=1).sum().item()
            cells.append(f"M={m}@{off}: {diff}")
        for c in (256, 512, 1024):
            blk = x[:c].clone()
            y0 = blk @ w.t()
            rolled = torch.roll(blk, 37, 0) @ w.t()
            diff = (torch.roll(y0, 37, 0) != rolled).any(dim=1).sum().item()
            cells.append(f"C={c} rows moved by 37: {diff}")
        print(f"{name} (K={k}, N={nout}): rows differing from solo — " + "; ".join(cells))


if __name__ == "__main__":
    main()
