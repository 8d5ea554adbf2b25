//! The four input projections of a Gated DeltaNet call, and the dtype the mixing part reads
//! them in.

use candle_core::{DType, Tensor};

use super::{DeltaRule, GdnLayer};
use crate::candle::layers::linear::{Linear, QuantSummary};
use crate::candle::profile;
use crate::error::CandleError;

/// The four input projections of a layer (`q|k|v` conv channels, `z`, `b`, `a`), all reading
/// the layer's input.
#[derive(Debug, Clone)]
pub(super) enum InProjections {
    /// Four products (the reference).
    Separate {
        qkv: Linear,
        z: Linear,
        b: Linear,
        a: Linear,
    },
    /// One product of the weights stacked `[qkv; z; b; a]` (`(Cc + Cv + 2Hv, D)`), cut into the
    /// four after (`layers::fusion::gdn_projections`).
    Stacked(Linear),
}

impl InProjections {
    /// `[qkv, z, b, a]`, stacked into one product when `stack` holds and [`Linear::stack`] can.
    pub(super) fn new(parts: [Linear; 4], stack: bool) -> Result<Self, CandleError> {
        if stack {
            if let Some(stacked) = Linear::stack(&parts.each_ref())? {
                return Ok(InProjections::Stacked(stacked));
            }
        }
        let [qkv, z, b, a] = parts;
        Ok(InProjections::Separate { qkv, z, b, a })
    }

    /// Count the ggml type of each checkpoint projection (four either way).
    pub(super) fn summarize(&self, summary: &mut QuantSummary) {
        match self {
            InProjections::Separate { qkv, z, b, a } => {
                [qkv, z, b, a].into_iter().for_each(|l| summary.count(l))
            }
            InProjections::Stacked(l) => (0..4).for_each(|_| summary.count(l)),
        }
    }
}

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

    /// `x (B, L, D)` -> the four input projections in `in_dtype`: four products, or one
    /// product of the stacked weights cut into four contiguous parts.
    pub(super) fn project(&self, x: &Tensor, in_dtype: DType) -> candle_core::Result<Projections> {
        let (b, l, _) = x.dims3()?;
        let (hv, dv) = (self.dims.value_heads, self.dims.value_dim);
        let (cc, cv) = (self.dims.conv_channels(), self.dims.value_channels());
        profile::region("gdn.projections", x.device(), || {
            let (p, z, b_logits, a_in) = match &self.in_proj {
                InProjections::Separate { qkv, z, b, a } => (
                    qkv.forward(x)?.to_dtype(in_dtype)?,
                    z.forward(x)?.to_dtype(in_dtype)?,
                    b.forward(x)?.to_dtype(in_dtype)?,
                    a.forward(x)?.to_dtype(in_dtype)?,
                ),
                InProjections::Stacked(stacked) => {
                    // (B, L, Cc + Cv + 2Hv) -> [p | z | b | a]
                    let all = stacked.forward(x)?;
                    let part = |start: usize, n: usize| {
                        all.narrow(2, start, n)?.contiguous()?.to_dtype(in_dtype)
                    };
                    (
                        part(0, cc)?,
                        part(cc, cv)?,
                        part(cc + cv, hv)?,
                        part(cc + cv + hv, hv)?,
                    )
                }
            };
            Ok(Projections {
                p,
                z: z.reshape((b, l, hv, dv))?,
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
