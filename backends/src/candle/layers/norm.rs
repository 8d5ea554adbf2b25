//! RMSNorm over the last dim, in both weight conventions.
//!
//! `plain` (Qwen2, Qwen3, Qwen3.5's gated norm): `y = x / rms(x) * w`.
//! `offset` (Qwen3.5 layer / final / q / k norms, stored zero-centred): `y = x / rms(x) * (1 + w)`;
//! the `1 +` is folded into the weight once at load (in f32), so both run the same kernel.
//! Statistics are computed in f32 inside the kernel whatever the activation dtype.

use candle_core::Tensor;

use super::super::load::weights::Weights;
use crate::error::CandleError;

pub(crate) struct RmsNorm {
    /// `(dim,)` in the compute dtype, the effective multiplier.
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    /// Plain convention: the stored weight multiplies the normalised input.
    pub fn plain(w: &Weights<'_>, name: &str, dim: usize, eps: f64) -> Result<Self, CandleError> {
        Ok(RmsNorm {
            weight: w.get(name, &[dim])?,
            eps: eps as f32,
        })
    }

    /// Offset convention: `1 + stored weight` multiplies the normalised input.
    pub fn offset(w: &Weights<'_>, name: &str, dim: usize, eps: f64) -> Result<Self, CandleError> {
        let weight = (w.get_f32(name, &[dim])? + 1.0)
            .and_then(|t| t.to_dtype(w.dtype()))
            .map_err(CandleError::tensor("rms_norm offset weight"))?;
        Ok(RmsNorm {
            weight,
            eps: eps as f32,
        })
    }

    /// `(.., dim) -> (.., dim)`, same dtype as `x`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, CandleError> {
        let x = x
            .contiguous()
            .map_err(CandleError::tensor("rms_norm contiguous"))?;
        let w = self.weight_in(x.dtype())?;
        candle_nn::ops::rms_norm(&x, &w, self.eps).map_err(CandleError::tensor("rms_norm"))
    }

    /// The residual add before this norm, fused with it where a kernel runs it
    /// ([`super::residual_norm`]): `(x + m, norm(x + m))`, both `(.., dim)`.
    pub fn add_forward(&self, x: &Tensor, m: &Tensor) -> Result<(Tensor, Tensor), CandleError> {
        let w = self.weight_in(x.dtype())?;
        super::residual_norm::add_rms_norm(x, m, &w, self.eps)
            .map_err(CandleError::tensor("residual add + rms_norm"))
    }

    /// The effective multiplier in `dtype` and eps, for a kernel that fuses this norm.
    pub fn weight_and_eps(&self, dtype: candle_core::DType) -> Result<(Tensor, f32), CandleError> {
        Ok((self.weight_in(dtype)?, self.eps))
    }

    /// The weight in `dtype` (the stored one when it already is).
    fn weight_in(&self, dtype: candle_core::DType) -> Result<Tensor, CandleError> {
        if dtype == self.weight.dtype() {
            return Ok(self.weight.clone());
        }
        self.weight
            .to_dtype(dtype)
            .map_err(CandleError::tensor("rms_norm weight dtype"))
    }
}
