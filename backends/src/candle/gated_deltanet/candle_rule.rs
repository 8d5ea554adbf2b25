//! The delta rule over a layer's conv output in candle's forms (the reference; the fused CUDA
//! kernels compute the same function, `super::fused`): the split of the conv channels into
//! `q | k | v`, the L2 normalisation and scale, the key-head → value-head sharing, the
//! head-major layout, then the chunked or token-by-token recurrence.
//!
//! In: `c (B, L, Cc)` after conv + SiLU, `beta, g (B, L, Hv)`, the starting state
//! `(B, Hv, dk, dv)`. Out: `o (B, L, Hv, dv)` and the state after the last token.

use candle_core::{Result, Tensor};

use super::{chunked, norm, recurrence, DeltaRule, GdnDims};

/// See the module docs; `rule` picks the chunked form (`DeltaRule::Chunked`) or the recurrence
/// (any other).
pub(super) fn delta_rule(
    c: &Tensor,
    beta: &Tensor,
    g: &Tensor,
    state: &Tensor,
    dims: &GdnDims,
    rule: DeltaRule,
) -> Result<(Tensor, Tensor)> {
    let GdnDims {
        key_heads: hk,
        value_heads: hv,
        key_dim: dk,
        value_dim: dv,
        ..
    } = *dims;
    let (ck, cv) = (dims.key_channels(), dims.value_channels());
    let (b, l, _) = c.dims3()?;
    // (B, L, Cc) -> (B, L, Hk, dk) ×2, (B, L, Hv, dv)
    let q = c.narrow(2, 0, ck)?.reshape((b, l, hk, dk))?;
    let k = c.narrow(2, ck, ck)?.reshape((b, l, hk, dk))?;
    let v = c.narrow(2, 2 * ck, cv)?.reshape((b, l, hv, dv))?;
    let q = (norm::l2_normalize(&q)? * (dk as f64).powf(-0.5))?;
    let k = norm::l2_normalize(&k)?;
    // Value head h reads key head ⌊h / r⌋: (B, L, Hk, dk) -> (B, L, Hk, r, dk) -> (B, L, Hv, dk)
    let r = hv / hk;
    let repeat = |t: Tensor| -> candle_core::Result<Tensor> {
        if r == 1 {
            Ok(t)
        } else {
            t.unsqueeze(3)?
                .broadcast_as((b, l, hk, r, dk))?
                .reshape((b, l, hv, dk))
        }
    };
    // (B, L, Hv, d) -> (B, Hv, L, d)
    let heads_first = |t: Tensor| t.transpose(1, 2)?.contiguous();
    let q = heads_first(repeat(q)?)?;
    let k = heads_first(repeat(k)?)?;
    let v = heads_first(v)?;
    // (B, L, Hv) -> (B, Hv, L)
    let beta = beta.transpose(1, 2)?.contiguous()?;
    let g = g.transpose(1, 2)?.contiguous()?;
    let (o, recurrent) = match rule {
        DeltaRule::Chunked(chunk) => {
            chunked::chunked_gated_delta_rule(&q, &k, &v, &beta, &g, state, chunk)?
        }
        _ => recurrence::recurrent_gated_delta_rule(&q, &k, &v, &beta, &g, state)?,
    };
    // (B, Hv, L, dv) -> (B, L, Hv, dv)
    Ok((o.transpose(1, 2)?.contiguous()?, recurrent))
}
