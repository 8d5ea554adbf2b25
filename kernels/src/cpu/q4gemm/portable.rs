//! The 4-, 5- and 6-bit kernels' arithmetic in plain Rust, one element at a time (the activations rounded
//! by [`super::super::qgemm::portable::quantize_block`]). Not dispatched to at run time: the
//! reference the x86 kernels are held to bit for bit, by the backends' tests.

use super::super::qgemm::portable::quantize_block;
use super::{PackedQ4, BLOCK};

/// The sums the kernels compute, `x (m, k) -> (m, n)` row-major, in plain Rust: the same
/// rounded activations, the same block order, the same f32 operations per block. `x` holds
/// `m` rows of `k` (a panic otherwise).
pub fn product(x: &[f32], m: usize, w: &PackedQ4) -> Vec<f32> {
    let (n, k) = (w.n, w.k);
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        let blocks: Vec<(f32, [i8; BLOCK])> = x[r * k..][..k]
            .chunks_exact(BLOCK)
            .map(quantize_block)
            .collect();
        for c in 0..n {
            let mut f = 0f32;
            for (blk, (dx, qx)) in blocks.iter().enumerate() {
                if w.format.split() {
                    // `Q6_K`: each half of 16 with its own `A` (`B = 32·A`), low half first
                    for half in 0..2 {
                        let (mut dot, mut sum) = (0i32, 0i32);
                        for (j, &v) in qx.iter().enumerate().skip(16 * half).take(16) {
                            dot += v as i32 * w.at(c, blk * BLOCK + j).0 as i32;
                            sum += v as i32;
                        }
                        let (_, a, _) = w.at(c, blk * BLOCK + 16 * half);
                        let x = dot as f32 - 32.0 * sum as f32;
                        f = (a * x).mul_add(*dx, f);
                    }
                    continue;
                }
                let (mut dot, mut sum) = (0i32, 0i32);
                for (j, &v) in qx.iter().enumerate() {
                    dot += v as i32 * w.at(c, blk * BLOCK + j).0 as i32;
                    sum += v as i32;
                }
                let (_, a, b) = w.at(c, blk * BLOCK);
                let t = (dot as f32).mul_add(a, -(b * sum as f32));
                f = t.mul_add(*dx, f);
            }
            y[r * n + c] = f;
        }
    }
    y
}
