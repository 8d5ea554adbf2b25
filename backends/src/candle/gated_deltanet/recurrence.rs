//! The gated delta rule, token by token: the decode path (L = 1) and the
//! plain reference every chunked prefill is tested against.
//!
//! In (all f32, head-major, key heads already repeated onto value heads):
//! `q, k: (B, Hv, L, dk)` (L2-normed, q scaled by `dk^−½`), `v: (B, Hv, L, dv)`,
//! `beta, g: (B, Hv, L)`, `state: (B, Hv, dk, dv)` (HF/FLA layout).
//! Out: `o: (B, Hv, L, dv)` and the state after the last step.
//!
//! Per step: decay first (`S ← αS`, `α = e^g`), then the error against the **decayed** state
//! (`e = v − Sᵀk`), the rank-1 write `S ← S + β k eᵀ`, and the read-out **after** the write
//! (`o = Sᵀq`). A step with β = 0 and g = 0 leaves `S` bit-identical.

use candle_core::{Result, Tensor};

/// Run the recurrence over all `L` steps. See the module docs for shapes.
pub fn recurrent_gated_delta_rule(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    beta: &Tensor,
    g: &Tensor,
    state: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let l = q.dim(2)?;
    // (B, Hv, L) -> (B, Hv, L, 1): per-step scalars broadcast over (1, dv) / (dk, dv)
    let alpha = g.exp()?.unsqueeze(3)?;
    let beta = beta.unsqueeze(3)?;
    let mut s = state.clone();
    let mut outs = Vec::with_capacity(l);
    for t in 0..l {
        let qt = q.narrow(2, t, 1)?; // (B, Hv, 1, dk)
        let kt = k.narrow(2, t, 1)?; // (B, Hv, 1, dk)
        let vt = v.narrow(2, t, 1)?; // (B, Hv, 1, dv)
        let at = alpha.narrow(2, t, 1)?; // (B, Hv, 1, 1)
        let bt = beta.narrow(2, t, 1)?; // (B, Hv, 1, 1)
        s = s.broadcast_mul(&at)?;
        // (B, Hv, 1, dk) x (B, Hv, dk, dv) -> (B, Hv, 1, dv)
        let err = vt.sub(&kt.matmul(&s)?)?;
        // (B, Hv, dk, 1) x (B, Hv, 1, dv) -> (B, Hv, dk, dv)
        let write = kt
            .transpose(2, 3)?
            .contiguous()?
            .matmul(&err.broadcast_mul(&bt)?)?;
        s = s.add(&write)?;
        outs.push(qt.matmul(&s)?);
    }
    let o = Tensor::cat(&outs, 2)?;
    Ok((o, s))
}
