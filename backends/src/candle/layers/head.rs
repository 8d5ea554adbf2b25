//! The candidate-only output head.
//!
//! In: final hidden states `(N, D)` (already normed) and candidate token ids. Out: f32 logits
//! `(N, C)`. Only the `C` candidate rows of the head matrix (`lm_head.weight`, or the embedding
//! when tied) are gathered and projected, in f32; the full vocabulary is never multiplied on
//! that path. [`CandidateHead::project_all`] is the opt-in full projection the vocabulary
//! diagnostics need (`candle::layers::vocab`), in f32 over slices of the head so no f32 copy of the
//! whole head matrix is ever made.

use candle_core::{DType, Device, Tensor};

use super::super::load::table::Table;
use crate::error::CandleError;

/// Head rows converted to f32 and multiplied at once by [`CandidateHead::project_all`]
/// (32,768 × hidden 2,560 × 4 bytes = 320 MiB at most for a bf16 head; a view on an f32 head).
pub(crate) const HEAD_SLICE_ROWS: usize = 32_768;

pub(crate) struct CandidateHead {
    /// `(V, D)` in the compute dtype; shares storage with the embedding when tied.
    weight: Table,
    tied: bool,
}

impl CandidateHead {
    pub fn new(weight: Table, tied: bool) -> Self {
        CandidateHead { weight, tied }
    }

    pub fn tied(&self) -> bool {
        self.tied
    }

    /// `(N, D) -> (N, C)` f32 logits for `candidates` (each `< V`, checked by the caller).
    pub fn project(
        &self,
        hidden: &Tensor,
        candidates: &[u32],
        device: &Device,
    ) -> Result<Tensor, CandleError> {
        let op = CandleError::tensor("candidate head");
        let ids = Tensor::new(candidates, device).map_err(CandleError::tensor("candidate ids"))?;
        // (V, D) -> (C, D) -> f32
        let rows = self.weight.rows_f32(&ids).map_err(op)?;
        if device.is_cpu() {
            return row_invariant_product(hidden, &rows)
                .map_err(CandleError::tensor("candidate projection"));
        }
        // (N, D) x (D, C) -> (N, C)
        hidden
            .to_dtype(DType::F32)
            .and_then(|h| h.matmul(&rows.t()?))
            .map_err(CandleError::tensor("candidate projection"))
    }

    /// `(N, D) -> (N, V)` f32 logits over the whole vocabulary, the head taken in slices of
    /// [`HEAD_SLICE_ROWS`] rows (each converted to f32 like the candidate rows of
    /// [`CandidateHead::project`], so a candidate's logit is computed the same way up to the
    /// matmul's summation order). A GGUF block head projects a few rows through candle's
    /// quantized matmul instead ([`Table::project_quantized`]).
    pub fn project_all(&self, hidden: &Tensor) -> Result<Tensor, CandleError> {
        let op = CandleError::tensor("full-vocabulary projection");
        let vocab = self.weight.dims().0;
        let h = hidden.to_dtype(DType::F32).map_err(op)?;
        if let Some(all) = self
            .weight
            .project_quantized(&h)
            .map_err(CandleError::tensor("quantized full-vocabulary projection"))?
        {
            return Ok(all);
        }
        let mut parts = Vec::with_capacity(vocab.div_ceil(HEAD_SLICE_ROWS));
        for start in (0..vocab).step_by(HEAD_SLICE_ROWS) {
            let len = HEAD_SLICE_ROWS.min(vocab - start);
            // (V, D) -> (len, D) f32; (N, D) x (D, len) -> (N, len)
            let part = self
                .weight
                .slice_f32(start, len)
                .and_then(|w| h.matmul(&w.t()?))
                .map_err(CandleError::tensor("full-vocabulary projection"))?;
            parts.push(part);
        }
        // (N, len) … -> (N, V)
        Tensor::cat(&parts, 1).map_err(CandleError::tensor("full-vocabulary concat"))
    }
}

/// `(N, D) x (C, D)ᵀ -> (N, C)` f32 on the host, each logit summed in one fixed order (eight
/// interleaved partial sums over `D`, then added pairwise), so a row's logits never depend on how
/// many rows share the call — a context's scores are the same whether it is scored alone or
/// merged with others. (The general matmul picks its blocking from the whole shape, which moved
/// the last bits of a logit with the row count.)
fn row_invariant_product(hidden: &Tensor, rows: &Tensor) -> candle_core::Result<Tensor> {
    use rayon::prelude::*;
    let (n, d) = hidden.dims2()?;
    let (c, dw) = rows.dims2()?;
    if d != dw {
        candle_core::bail!("candidate head: hidden width {d}, head width {dw}");
    }
    let h: Vec<f32> = hidden.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    let w: Vec<f32> = rows.flatten_all()?.to_vec1()?;
    let mut out = vec![0f32; n * c];
    if d > 0 {
        out.par_chunks_mut(c.max(1))
            .zip(h.par_chunks(d))
            .for_each(|(o, hr)| {
                for (oc, wr) in o.iter_mut().zip(w.chunks(d)) {
                    *oc = dot(hr, wr);
                }
            });
    }
    Tensor::from_vec(out, (n, c), hidden.device())
}

/// `Σ a·b` in a fixed order: eight lanes over `d` in steps of eight, the tail into the lanes in
/// order, then the lanes added pairwise.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..8 {
            lanes[i] = x[i].mul_add(y[i], lanes[i]);
        }
    }
    for (i, (x, y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
        lanes[i] = x.mul_add(*y, lanes[i]);
    }
    let [a0, a1, a2, a3, a4, a5, a6, a7] = lanes;
    ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_row_invariant_product_equals_the_matmul_and_ignores_the_row_count() {
        let dev = Device::Cpu;
        let mut seed = 7u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % 2001) as f32 / 1000.0 - 1.0
        };
        let (n, d, c) = (37, 83, 101);
        let h = Tensor::from_vec(
            (0..n * d).map(|_| next()).collect::<Vec<f32>>(),
            (n, d),
            &dev,
        )
        .unwrap();
        let w = Tensor::from_vec(
            (0..c * d).map(|_| next()).collect::<Vec<f32>>(),
            (c, d),
            &dev,
        )
        .unwrap();
        let got = row_invariant_product(&h, &w).unwrap();
        let want = h.matmul(&w.t().unwrap()).unwrap();
        let diff: f32 = (got.clone() - want)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert!(diff < 1e-4, "max |diff| {diff}");
        // every row alone gives the same bits as inside the whole call
        let all: Vec<Vec<f32>> = got.to_vec2().unwrap();
        for (r, want) in all.iter().enumerate() {
            let one = row_invariant_product(&h.narrow(0, r, 1).unwrap(), &w).unwrap();
            assert_eq!(&one.to_vec2::<f32>().unwrap()[0], want, "row {r}");
        }
    }
}
