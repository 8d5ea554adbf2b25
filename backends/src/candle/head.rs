//! The candidate-only output head.
//!
//! In: final hidden states `(N, D)` (already normed) and candidate token ids. Out: f32 logits
//! `(N, C)`. Only the `C` candidate rows of the head matrix (`lm_head.weight`, or the embedding
//! when tied) are gathered and projected, in f32; the full vocabulary is never multiplied.

use candle_core::{DType, Device, Tensor};

use crate::error::CandleError;

pub(crate) struct CandidateHead {
    /// `(V, D)` in the compute dtype; shares storage with the embedding when tied.
    weight: Tensor,
    tied: bool,
}

impl CandidateHead {
    pub fn new(weight: Tensor, tied: bool) -> Self {
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
        let rows = self
            .weight
            .index_select(&ids, 0)
            .and_then(|w| w.to_dtype(DType::F32))
            .map_err(op)?;
        // (N, D) x (D, C) -> (N, C)
        hidden
            .to_dtype(DType::F32)
            .and_then(|h| h.matmul(&rows.t()?))
            .map_err(CandleError::tensor("candidate projection"))
    }
}
