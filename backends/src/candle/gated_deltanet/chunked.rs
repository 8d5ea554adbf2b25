//! The chunked gated delta rule for multi-token calls (QWEN35_SPEC §6): the same function as
//! [`super::recurrence::recurrent_gated_delta_rule`], computed chunk-parallel.
//!
//! In/out: exactly as the recurrent form — `q, k: (B, Hv, L, dk)`, `v: (B, Hv, L, dv)`,
//! `beta, g: (B, Hv, L)`, `state: (B, Hv, dk, dv)`, all f32 → `o: (B, Hv, L, dv)`, final state.
//!
//! Algorithm (per batch row, value head and chunk of `C` tokens; `G` = cumulative log-decay
//! **restarted per chunk**, `Γ = e^G`):
//! `A = tril₋₁(β_i (k_i·k_j) e^{G_i−G_j})`, `T = (I + A)⁻¹` by forward substitution (never a
//! power series: its intermediate powers overflow, spec §6.5), `U = T·diag(β)·V`,
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

/// Run the chunked form with chunk length `chunk` (≥ 1). See the module docs.
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
    let c = chunk.max(1);
    let n = l.div_ceil(c);
    let pad = n * c - l;
    let dev = q.device();

    // (B, Hv, L, d) -> (B, Hv, n, C, d); (B, Hv, L) -> (B, Hv, n, C)
    let chunks4 = |x: &Tensor, d: usize| x.pad_with_zeros(2, 0, pad)?.reshape((b, hv, n, c, d));
    let chunks3 = |x: &Tensor| x.pad_with_zeros(2, 0, pad)?.reshape((b, hv, n, c));
    let q = chunks4(q, dk)?;
    let k = chunks4(k, dk)?;
    let v = chunks4(v, dv)?;
    let beta = chunks3(beta)?;
    let g = chunks3(g)?;

    let (tril_incl, tril_strict) = tril_masks(c, dev)?;
    // Cumulative log-decay restarted per chunk: (B, Hv, n, C)
    let gc = g.cumsum(D::Minus1)?;
    // G_i − G_j: (B, Hv, n, C, 1) − (B, Hv, n, 1, C) -> (B, Hv, n, C, C), clamped before exp
    let diff = gc.unsqueeze(4)?.broadcast_sub(&gc.unsqueeze(3)?)?.minimum(0f32)?;
    let decay = diff.exp()?.broadcast_mul(&tril_incl)?; // M, diagonal = 1

    let kt = k.transpose(3, 4)?.contiguous()?; // (B, Hv, n, dk, C)
    // A = tril₋₁(β_i · (K Kᵀ) ⊙ M): (B, Hv, n, C, C)
    let a = k
        .matmul(&kt)?
        .mul(&decay)?
        .broadcast_mul(&beta.unsqueeze(4)?)?
        .broadcast_mul(&tril_strict)?;
    let t = unit_lower_inverse(&a)?;

    let gamma = gc.exp()?; // Γ: (B, Hv, n, C)
    // U = T·diag(β)·V: (B, Hv, n, C, dv); W = T·diag(βΓ)·K: (B, Hv, n, C, dk)
    let u = t.matmul(&v.broadcast_mul(&beta.unsqueeze(4)?)?)?;
    let w = t.matmul(&k.broadcast_mul(&beta.mul(&gamma)?.unsqueeze(4)?)?)?;
    // P = (Q Kᵀ) ⊙ M: (B, Hv, n, C, C)
    let p = q.matmul(&kt)?.mul(&decay)?;
    // diag(Γ)·Q: (B, Hv, n, C, dk)
    let qg = q.broadcast_mul(&gamma.unsqueeze(4)?)?;
    // G_last: (B, Hv, n, 1); keys decayed to the chunk end, transposed: (B, Hv, n, dk, C)
    let g_last = gc.narrow(3, c - 1, 1)?;
    let kd_t = k
        .broadcast_mul(&g_last.broadcast_sub(&gc)?.exp()?.unsqueeze(4)?)?
        .transpose(3, 4)?
        .contiguous()?;
    let gamma_last = g_last.exp()?.unsqueeze(4)?; // (B, Hv, n, 1, 1)

    let mut s = state.clone(); // (B, Hv, dk, dv)
    let mut outs = Vec::with_capacity(n);
    let at = |x: &Tensor, i: usize| x.narrow(2, i, 1)?.squeeze(2);
    for i in 0..n {
        // Δ = U − W S: (B, Hv, C, dv)
        let delta = at(&u, i)?.sub(&at(&w, i)?.matmul(&s)?)?;
        // O = diag(Γ) Q S + P Δ: (B, Hv, C, dv)
        let o = at(&qg, i)?.matmul(&s)?.add(&at(&p, i)?.matmul(&delta)?)?;
        outs.push(o);
        // S ← Γ_last S + (diag(e^{G_last−G}) K)ᵀ Δ: (B, Hv, dk, dv)
        s = s
            .broadcast_mul(&at(&gamma_last, i)?)?
            .add(&at(&kd_t, i)?.matmul(&delta)?)?;
    }
    // n × (B, Hv, C, dv) -> (B, Hv, n·C, dv) -> (B, Hv, L, dv)
    let o = Tensor::cat(&outs, 2)?.narrow(2, 0, l)?;
    Ok((o, s))
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
