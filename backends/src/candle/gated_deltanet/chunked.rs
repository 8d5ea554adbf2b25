//! The chunked gated delta rule for multi-token calls: the same function as
//! [`super::recurrence::recurrent_gated_delta_rule`], computed chunk-parallel.
//!
//! In/out: exactly as the recurrent form — `q, k: (B, Hv, L, dk)`, `v: (B, Hv, L, dv)`,
//! `beta, g: (B, Hv, L)`, `state: (B, Hv, dk, dv)`, all f32 → `o: (B, Hv, L, dv)`, final state.
//!
//! Algorithm (per batch row, value head and chunk of `C` tokens; `G` = cumulative log-decay
//! **restarted per chunk**, `Γ = e^G`):
//! `A = tril₋₁(β_i (k_i·k_j) e^{G_i−G_j})`, `T = (I + A)⁻¹` by forward substitution (never a
//! power series: its intermediate powers overflow in f32), `U = T·diag(β)·V`,
//! `W = T·diag(βΓ)·K`, `P = (QKᵀ) ⊙ tril₀(e^{G_i−G_j})`; then a sequential scan over chunks:
//! `Δ = U − W S`, `O = diag(Γ) Q S + P Δ`, `S ← Γ_last S + (diag(e^{G_last−G}) K)ᵀ Δ`.
//!
//! Numerics: everything f32. Decay differences are clamped to ≤ 0 *before* `exp` (the upper
//! triangle holds positive differences that could overflow; the lower triangle is ≤ 0 because
//! `g ≤ 0`), then masked. The ragged tail is padded with `q = k = v = 0, β = 0, g = 0`, which
//! leaves the state untouched; the padded outputs are dropped.
//! Cost: `O(L·C·(dk+dv))` per head plus `C` batched rank-1 updates for the triangular solve.

use candle_core::{DType, Device, Result, Tensor, D};

/// Chunk length used for prefill (HF / FLA use 64).
pub const CHUNK: usize = 64;

/// `(I + A)⁻¹` for strictly lower-triangular `A` `(…, C, C)`, by column-oriented forward
/// substitution: after step `j`, row `j` of the result is final and is subtracted, scaled by
/// column `j` of `A`, from the rows below it. `C − 1` batched rank-1 updates.
pub fn unit_lower_inverse(a: &Tensor) -> Result<Tensor> {
    let c = a.dim(D::Minus1)?;
    let mut t = Tensor::eye(c, a.dtype(), a.device())?
        .broadcast_as(a.shape())?
        .contiguous()?;
    for j in 0..c.saturating_sub(1) {
        let col = a.narrow(D::Minus1, j, 1)?; // (…, C, 1)
        let row = t.narrow(D::Minus2, j, 1)?; // (…, 1, C)
        t = t.sub(&col.broadcast_mul(&row)?)?;
    }
    Ok(t)
}

/// Lower-triangular 0/1 masks `(C, C)`: with the diagonal, and strictly below it.
fn tril_masks(c: usize, device: &Device) -> Result<(Tensor, Tensor)> {
    let incl = Tensor::tril2(c, DType::F32, device)?;
    let strict = incl.sub(&Tensor::eye(c, DType::F32, device)?)?;
    Ok((incl, strict))
}

/// Run the chunked form with chunk length `min(chunk, L)` (≥ 1). See the module docs.
pub fn chunked_gated_delta_rule(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    beta: &Tensor,
    g: &Tensor,
    state: &Tensor,
    chunk: usize,
) -> Result<(Tensor, Tensor)> {
    let (b, hv, l, dk) = q.dims4()?;
    let dv = v.dim(3)?;
    let bh = b * hv;
    // A call shorter than one chunk runs as one chunk of its own length (the formulas hold for
    // any chunk length), so short scoring suffixes do not pay for 64-token chunks.
    let c = chunk.clamp(1, l.max(1));
    let n = l.div_ceil(c);
    let pad = n * c - l;
    let dev = q.device();

    // Batch and head are folded into one dim (candle's CPU matmul takes ≤ 2 batch dims).
    // (B, Hv, L, d) -> (B·Hv, n, C, d); (B, Hv, L) -> (B·Hv, n, C)
    let chunks4 = |x: &Tensor, d: usize| x.pad_with_zeros(2, 0, pad)?.reshape((bh, n, c, d));
    let chunks3 = |x: &Tensor| x.pad_with_zeros(2, 0, pad)?.reshape((bh, n, c));
    let q = chunks4(q, dk)?;
    let k = chunks4(k, dk)?;
    let v = chunks4(v, dv)?;
    let beta = chunks3(beta)?;
    let g = chunks3(g)?;

    let (tril_incl, tril_strict) = tril_masks(c, dev)?;
    // Cumulative log-decay restarted per chunk: (BH, n, C)
    let gc = g.cumsum(D::Minus1)?;
    // G_i − G_j: (BH, n, C, 1) − (BH, n, 1, C) -> (BH, n, C, C), clamped before exp
    let diff = gc
        .unsqueeze(3)?
        .broadcast_sub(&gc.unsqueeze(2)?)?
        .minimum(0f32)?;
    let decay = diff.exp()?.broadcast_mul(&tril_incl)?; // M, diagonal = 1

    let kt = k.transpose(2, 3)?.contiguous()?; // (BH, n, dk, C)
                                               // A = tril₋₁(β_i · (K Kᵀ) ⊙ M): (BH, n, C, C)
    let a = k
        .matmul(&kt)?
        .mul(&decay)?
        .broadcast_mul(&beta.unsqueeze(3)?)?
        .broadcast_mul(&tril_strict)?;
    let t = unit_lower_inverse(&a)?;

    let gamma = gc.exp()?; // Γ: (BH, n, C)
                           // U = T·diag(β)·V: (BH, n, C, dv); W = T·diag(βΓ)·K: (BH, n, C, dk)
    let u = t.matmul(&v.broadcast_mul(&beta.unsqueeze(3)?)?)?;
    let w = t.matmul(&k.broadcast_mul(&beta.mul(&gamma)?.unsqueeze(3)?)?)?;
    // P = (Q Kᵀ) ⊙ M: (BH, n, C, C)
    let p = q.matmul(&kt)?.mul(&decay)?;
    // diag(Γ)·Q: (BH, n, C, dk)
    let qg = q.broadcast_mul(&gamma.unsqueeze(3)?)?;
    // G_last: (BH, n, 1); keys decayed to the chunk end, transposed: (BH, n, dk, C)
    let g_last = gc.narrow(2, c - 1, 1)?;
    let kd_t = k
        .broadcast_mul(&g_last.broadcast_sub(&gc)?.exp()?.unsqueeze(3)?)?
        .transpose(2, 3)?
        .contiguous()?;
    let gamma_last = g_last.exp()?.unsqueeze(3)?; // (BH, n, 1, 1)

    let mut s = state.reshape((bh, dk, dv))?; // (BH, dk, dv)
    let mut outs = Vec::with_capacity(n);
    let at = |x: &Tensor, i: usize| x.narrow(1, i, 1)?.squeeze(1);
    for i in 0..n {
        // Δ = U − W S: (BH, C, dv)
        let delta = at(&u, i)?.sub(&at(&w, i)?.matmul(&s)?)?;
        // O = diag(Γ) Q S + P Δ: (BH, C, dv)
        let o = at(&qg, i)?.matmul(&s)?.add(&at(&p, i)?.matmul(&delta)?)?;
        outs.push(o);
        // S ← Γ_last S + (diag(e^{G_last−G}) K)ᵀ Δ: (BH, dk, dv)
        s = s
            .broadcast_mul(&at(&gamma_last, i)?)?
            .add(&at(&kd_t, i)?.matmul(&delta)?)?;
    }
    // n × (BH, C, dv) -> (BH, n·C, dv) -> (B, Hv, L, dv)
    let o = Tensor::cat(&outs, 1)?
        .narrow(1, 0, l)?
        .reshape((b, hv, l, dv))?;
    Ok((o, s.reshape((b, hv, dk, dv))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_substitution_inverts_unit_lower() -> Result<()> {
        let dev = Device::Cpu;
        let c = 6usize;
        let vals: Vec<f32> = (0..c * c)
            .map(|i| {
                let (r, col) = (i / c, i % c);
                if col < r {
                    ((i * 31 % 17) as f32 - 8.0) / 9.0
                } else {
                    0.0
                }
            })
            .collect();
        let a = Tensor::from_slice(&vals, (1, c, c), &dev)?;
        let t = unit_lower_inverse(&a)?;
        let eye = Tensor::eye(c, DType::F32, &dev)?.unsqueeze(0)?;
        let prod = eye.add(&a)?.matmul(&t)?;
        let err: f32 = prod.sub(&eye)?.abs()?.flatten_all()?.max(0)?.to_scalar()?;
        assert!(err < 1e-5, "(I + A) T − I = {err}");
        Ok(())
    }
}
