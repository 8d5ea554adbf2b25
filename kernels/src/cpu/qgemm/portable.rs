//! The `Q8_0` kernels' arithmetic in plain Rust, one element at a time: the block rounding of
//! the activations and the products' sums, in the kernels' order. Not dispatched to at run
//! time (where no x86 kernel runs, the layers keep candle's matmul): the reference the x86
//! kernels are held to bit for bit, by this crate's tests and the backends'.

use super::{PackedQ8, BLOCK};

/// One block of 32 activations rounded as `Q8_0` rounds: `(d, q)` with `x ≈ d · q` (`q` to the
/// nearest integer, ties to even: what the vector form's conversion does), one element at a
/// time (the kernels' rounding, `x86::quantize_units`, is held to it).
pub fn quantize_block(xs: &[f32]) -> (f32, [i8; BLOCK]) {
    let amax = xs.iter().fold(0f32, |a, x| a.max(x.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i8; BLOCK];
    for (q, &x) in q.iter_mut().zip(xs) {
        *q = (x * id).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    (d, q)
}

/// The sums the kernels compute, `x (m, k) -> (m, n)` row-major, in plain Rust: the same
/// rounded activations, the same block order, one `mul_add` per block. `x` holds `m` rows of
/// `k` (a panic otherwise).
pub fn product(x: &[f32], m: usize, w: &PackedQ8) -> Vec<f32> {
    let (n, k) = (w.n, w.k);
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        let blocks: Vec<(f32, [i8; BLOCK])> = x[r * k..][..k]
            .chunks_exact(BLOCK)
            .map(quantize_block)
            .collect();
        for c in 0..n {
            let mut f = 0f32;
            for (b, (dx, qx)) in blocks.iter().enumerate() {
                let mut dot = 0i32;
                for (j, &v) in qx.iter().enumerate() {
                    dot += v as i32 * w.at(c, b * BLOCK + j).0 as i32;
                }
                let dw = w.at(c, b * BLOCK).1;
                f = (dot as f32).mul_add(dx * dw, f);
            }
            y[r * n + c] = f;
        }
    }
    y
}
