//! The four input projections of a Gated DeltaNet call, and the dtype the mixing part reads
//! them in.

use candle_core::{DType, Tensor};

use super::{DeltaRule, GdnLayer};
use crate::candle::profile;

impl GdnLayer {
    /// The dtype the projections are handed on in: the fused kernels read bf16 projections
    /// directly (an exact upcast inside each kernel), so the four cast passes only run on the
    /// candle path and for other dtypes.
    pub(super) fn in_dtype(rule: DeltaRule, act: DType) -> DType {
        if rule == DeltaRule::Fused && act == DType::BF16 {
            DType::BF16
        } else {
            DType::F32
        }
    }

    /// `x (B, L, D)` -> the four input projections in `in_dtype`.
    pub(super) fn project(&self, x: &Tensor, in_dtype: DType) -> candle_core::Result<Projections> {
        let (b, l, _) = x.dims3()?;
        let (hv, dv) = (self.dims.value_heads, self.dims.value_dim);
        profile::region("gdn.projections", x.device(), || {
            let p = self.in_proj_qkv.forward(x)?.to_dtype(in_dtype)?;
            let z = self
                .in_proj_z
                .forward(x)?
                .to_dtype(in_dtype)?
                .reshape((b, l, hv, dv))?;
            let b_logits = self.in_proj_b.forward(x)?.to_dtype(in_dtype)?;
            let a_in = self.in_proj_a.forward(x)?.to_dtype(in_dtype)?;
            Ok(Projections {
                p,
                z,
                b_logits,
                a_in,
                p_rows: None,
            })
        })
    }
}

/// The four input projections of one call: `p (B, L, Cc)`, `z (B, L, Hv, dv)`,
/// `b_logits (B, L, Hv)`, `a_in (B, L, Hv)`.
pub(super) struct Projections {
    pub p: Tensor,
    pub z: Tensor,
    pub b_logits: Tensor,
    pub a_in: Tensor,
    /// Where `p` is still packed `(1, T, Cc)` (a packed pass whose fused conv reads it in
    /// place): each batch row's first token in it; the other projections are padded.
    pub p_rows: Option<Vec<usize>>,
}

impl Projections {
    /// Tokens `start .. start + len` of a one-row call (`z` is not needed by the mixing part
    /// and is left whole).
    pub(super) fn narrow(&self, start: usize, len: usize) -> candle_core::Result<Projections> {
        let cut = |t: &Tensor| t.narrow(1, start, len)?.contiguous();
        Ok(Projections {
            p: cut(&self.p)?,
            z: self.z.clone(),
            b_logits: cut(&self.b_logits)?,
            a_in: cut(&self.a_in)?,
            p_rows: None,
        })
    }
}
