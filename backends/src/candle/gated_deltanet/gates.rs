//! The per-token write strength β and log-decay g of a Gated DeltaNet layer.
//!
//! In: β logits `b` and decay inputs `a`, `(B, L, Hv)` f32; parameters `A_log`, `dt_bias`,
//! `(Hv,)` f32; optionally a right-padding mask `(B, L)` (1 = valid, 0 = pad).
//! Out: `β = σ(b)` and `g = −exp(A_log) · softplus(a + dt_bias)`, `(B, L, Hv)` f32, with β = 0 and
//! g = 0 at padded positions so that the recurrent state passes through those steps exactly
//! (zeroing the layer input alone would still decay the state, because g depends on a bias).
//!
//! Invariant: `g ≤ 0` everywhere (so cumulative decays are non-increasing within a chunk), which
//! the chunked form relies on to clamp the upper triangle of its decay differences safely.

use candle_core::{Result, Tensor};

/// Numerically stable `softplus(x) = ln(1 + eˣ)` as `max(x, 0) + ln(1 + e^{−|x|})`.
///
/// Matches PyTorch's `softplus` (threshold 20 returns `x`) to f32 rounding: for `x > 20` the
/// correction `ln(1 + e^{−x}) < 2.1e-9` is below half an ulp of `x`.
pub fn softplus(x: &Tensor) -> Result<Tensor> {
    let pos = x.maximum(0f32)?;
    let tail = (x.abs()?.neg()?.exp()? + 1.0)?.log()?;
    pos + tail
}

/// `β = σ(b)`, `(B, L, Hv)`.
pub fn beta(b: &Tensor) -> Result<Tensor> {
    candle_nn::ops::sigmoid(b)
}

/// `g = −exp(A_log) · softplus(a + dt_bias)`, `(B, L, Hv)`; `a_log`, `dt_bias`: `(Hv,)`.
pub fn log_decay(a: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<Tensor> {
    let sp = softplus(&a.broadcast_add(dt_bias)?)?;
    sp.broadcast_mul(&a_log.exp()?)?.neg()
}

/// Zero `x` `(B, L, Hv)` where `mask` `(B, L)` is 0.
pub fn apply_mask(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    // (B, L) -> (B, L, 1)
    x.broadcast_mul(&mask.unsqueeze(2)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn softplus_matches_reference_and_threshold() -> Result<()> {
        let xs = [-30.0f32, -5.0, -0.5, 0.0, 0.7, 19.0, 20.5, 80.0];
        let t = Tensor::from_slice(&xs, (xs.len(),), &Device::Cpu)?;
        let got: Vec<f32> = softplus(&t)?.to_vec1()?;
        for (x, y) in xs.iter().zip(got) {
            let x64 = *x as f64;
            let want = if x64 > 20.0 { x64 } else { x64.exp().ln_1p() };
            let tol = 1e-6 * want.abs().max(1e-7);
            assert!(
                (y as f64 - want).abs() <= tol.max(1e-12),
                "softplus({x}) = {y}, want {want}"
            );
        }
        Ok(())
    }

    #[test]
    fn decay_is_negative_and_masked_positions_are_exact_zero() -> Result<()> {
        let dev = Device::Cpu;
        let a = Tensor::from_slice(&[0.3f32, -2.0, 5.0, 1.0], (1, 2, 2), &dev)?;
        let a_log = Tensor::from_slice(&[0.1f32, -1.0], (2,), &dev)?;
        let dt = Tensor::from_slice(&[0.5f32, -0.2], (2,), &dev)?;
        let g = log_decay(&a, &a_log, &dt)?;
        let gv: Vec<f32> = g.flatten_all()?.to_vec1()?;
        assert!(gv.iter().all(|v| *v < 0.0));
        let mask = Tensor::from_slice(&[1.0f32, 0.0], (1, 2), &dev)?;
        let gm: Vec<f32> = apply_mask(&g, &mask)?.flatten_all()?.to_vec1()?;
        assert_eq!(&gm[..2], &gv[..2]);
        assert!(gm[2..].iter().all(|v| *v == 0.0));
        Ok(())
    }
}
