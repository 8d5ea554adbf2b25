//! The two normalisations of a Gated DeltaNet layer, both over the last dim and in f32.
//!
//! - [`l2_normalize`]: `x · rsqrt(Σ x² + 1e-6)` — the epsilon is added to the **sum** of squares
//!   and is hard-coded ([`L2_EPS`]); it is not `rms_norm_eps` (as in transformers' and flash-linear-attention's `l2norm`).
//! - [`gated_rms_norm`]: `(w · x · rsqrt(mean(x²) + eps)) · SiLU(z)` — norm first, then the gate;
//!   `w` is the **plain** weight (`Qwen3_5RMSNormGated`, initialised to ones), not `1 + w`
//!   (transformers initialises it to ones; the other norms of the model store `w` for `1 + w`).
//!
//! Inputs are expected in f32; outputs keep the input shape.

use candle_core::{Result, Tensor, D};

/// Epsilon added to the sum of squares in the q/k L2 normalisation (HF / FLA `l2norm`).
pub const L2_EPS: f64 = 1e-6;

/// `x · rsqrt(Σ_last x² + 1e-6)`. `(…, d) -> (…, d)`.
pub fn l2_normalize(x: &Tensor) -> Result<Tensor> {
    // (…, d) -> (…, 1)
    let sum_sq = x.sqr()?.sum_keepdim(D::Minus1)?;
    let inv = (sum_sq + L2_EPS)?.sqrt()?.recip()?;
    x.broadcast_mul(&inv)
}

/// Gated RMSNorm over the last dim: `(w · x · rsqrt(mean(x²) + eps)) · SiLU(z)`.
///
/// `x`, `z`: `(…, dv)` f32; `w`: `(dv,)` f32 (plain convention).
pub fn gated_rms_norm(x: &Tensor, z: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    // (…, dv) -> (…, 1)
    let mean_sq = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv = (mean_sq + eps)?.sqrt()?.recip()?;
    let normed = x.broadcast_mul(&inv)?.broadcast_mul(w)?;
    normed.mul(&z.silu()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn l2_epsilon_is_on_the_sum() -> Result<()> {
        // A small-norm vector: an eps on the mean (dk·1e-6 on the sum) would shift it visibly.
        let d = 128usize;
        let vals: Vec<f32> = (0..d).map(|i| 1e-3 * ((i % 7) as f32 - 3.0)).collect();
        let x = Tensor::from_slice(&vals, (1, d), &Device::Cpu)?;
        let y: Vec<f32> = l2_normalize(&x)?.flatten_all()?.to_vec1()?;
        let sum_sq: f64 = vals.iter().map(|v| (*v as f64) * (*v as f64)).sum();
        let inv = 1.0 / (sum_sq + 1e-6).sqrt();
        for (a, v) in y.iter().zip(&vals) {
            assert!(
                (*a as f64 - *v as f64 * inv).abs() < 1e-6,
                "{a} vs {}",
                *v as f64 * inv
            );
        }
        Ok(())
    }

    #[test]
    fn gated_norm_uses_plain_weight_and_gates_after_norm() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::from_slice(&[1.0f32, -2.0, 3.0, 0.5], (1, 4), &dev)?;
        let z = Tensor::from_slice(&[0.3f32, -1.0, 2.0, 0.0], (1, 4), &dev)?;
        let w = Tensor::from_slice(&[0.5f32, 1.5, -1.0, 2.0], (4,), &dev)?;
        let got: Vec<f32> = gated_rms_norm(&x, &z, &w, 1e-6)?.flatten_all()?.to_vec1()?;
        let xs = [1.0f64, -2.0, 3.0, 0.5];
        let zs = [0.3f64, -1.0, 2.0, 0.0];
        let ws = [0.5f64, 1.5, -1.0, 2.0];
        let ms = xs.iter().map(|v| v * v).sum::<f64>() / 4.0;
        let inv = 1.0 / (ms + 1e-6).sqrt();
        for i in 0..4 {
            let silu = zs[i] / (1.0 + (-zs[i]).exp());
            let want = ws[i] * xs[i] * inv * silu;
            assert!(
                (got[i] as f64 - want).abs() < 1e-6,
                "{i}: {} vs {want}",
                got[i]
            );
        }
        Ok(())
    }
}
