//! The candidate-only output head.
//!
//! In: final hidden states `(N, D)` (already normed) and candidate token ids. Out: f32 logits
//! `(N, C)`. Only the `C` candidate rows of the head matrix (`lm_head.weight`, or the embedding
//! when tied) are gathered and projected, in f32; the full vocabulary is never multiplied on
//! that path. [`CandidateHead::project_all`] is the opt-in full projection the vocabulary
//! diagnostics need (`candle::vocab`), in f32 over slices of the head so no f32 copy of the
//! whole head matrix is ever made.

use candle_core::{DType, Device, Tensor};

use super::table::Table;
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
