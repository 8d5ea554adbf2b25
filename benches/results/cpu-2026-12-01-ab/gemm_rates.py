# numpy (OpenBLAS) and torch f32 GEMM rates at the prefill's shapes, 2 threads, median of 15:
#   OPENBLAS_NUM_THREADS=2 /path/to/python-with-torch gemm_rates.py
import time

import numpy as np
import torch

SHAPES = [(306, 896, 4864), (306, 4864, 896), (964, 896, 4864), (964, 4864, 896), (60, 896, 4864)]
torch.set_num_threads(2)
for name, mk in (("numpy", lambda m, k, n: (np.random.rand(m, k).astype(np.float32), np.random.rand(n, k).astype(np.float32))),
                 ("torch", lambda m, k, n: (torch.rand(m, k), torch.rand(n, k)))):
    for m, k, n in SHAPES:
        x, w = mk(m, k, n)
        ts = []
        for _ in range(15):
            t = time.perf_counter()
            x @ w.T
            ts.append(time.perf_counter() - t)
        ts.sort()
        f = 2 * m * n * k
        print(m, k, n, f"{name} median {f / ts[7] / 1e9:.1f} best {f / ts[0] / 1e9:.1f} GF/s")
