//! Opt-in full-vocabulary summaries on candle: the allowed-mass diagnostics of a score call and
//! the per-token log-probabilities of a text (`Backend::vocab_rows`).
//!
//! In: gathered hidden rows `(N, D)` (before the final norm). Out: one
//! [`forkscore_seam::PositionVocab`] per row. Rows go through the full head in chunks of
//! [`VOCAB_ROWS_PER_CHUNK`] (`(256, V)` f32 logits: 254 MB at V = 248,320), each chunk is
//! copied to the host once, and every row is summarised by the seam's pure
//! [`forkscore_seam::topk::top_k`] (one f32 logsumexp, exact top-K with a block-max prefilter,
//! bit-equal to a full log-softmax + sort), rows in parallel on CPU threads. The logits of a
//! chunk are materialised once; no log-softmax tensor is ever built.
//!
//! On a CUDA device the same selection runs on the GPU ([`super::super::cuda::vocab_topk`], K ≤ 256): only the
//! logsumexp, the K best and the next token's logit of each row cross the bus, not the chunk's
//! logits. `FORKSCORE_VOCAB_TOPK=host` keeps the host path there (the reference).

use candle_core::Tensor;
use forkscore_seam::topk::{log_prob, top_k};
use forkscore_seam::{PositionVocab, TokenLogprob, VocabRequest, VocabRow};
use rayon::prelude::*;

use super::super::cuda::vocab_topk::{device_top_k, takes_device_path};
use super::super::CandleBackend;
use crate::error::CandleError;

/// Rows projected onto the full vocabulary and copied to the host at once.
pub const VOCAB_ROWS_PER_CHUNK: usize = 256;

impl CandleBackend {
    /// K must not exceed the vocabulary (the seam already bounds it by `MAX_TOP_K`).
    pub(crate) fn check_top_k(&self, k: usize) -> Result<(), CandleError> {
        let vocab = self.backbone.vocab_size();
        if k > vocab {
            return Err(CandleError::InvalidRequest {
                reason: format!("top-K of {k} asked; the model's vocabulary has {vocab} tokens"),
            });
        }
        Ok(())
    }

    /// `last (N, D)` -> one summary per row; `rows[i]` is row i's (position, next token).
    pub(crate) fn summarise(
        &self,
        last: &Tensor,
        k: usize,
        rows: &[(usize, Option<u32>)],
    ) -> Result<Vec<PositionVocab>, CandleError> {
        let vocab = self.backbone.vocab_size();
        let mut out = Vec::with_capacity(rows.len());
        for (c, meta) in rows.chunks(VOCAB_ROWS_PER_CHUNK).enumerate() {
            // (N, D) -> (n, D) -> (n, V) f32
            let logits = last
                .narrow(0, c * VOCAB_ROWS_PER_CHUNK, meta.len())
                .map_err(CandleError::tensor("vocabulary rows"))
                .and_then(|h| self.backbone.full_logits(&h))?;
            if takes_device_path(&logits, vocab, k) {
                out.extend(summarise_on_device(&logits, vocab, k, meta)?);
                continue;
            }
            // -> host
            let host: Vec<f32> = logits
                .flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(CandleError::tensor("full logits to host"))?;
            let summaries: Vec<Result<PositionVocab, CandleError>> = host
                .par_chunks(vocab)
                .zip(meta.par_iter())
                .map(|(row, &(position, next))| {
                    let vocab = top_k(row, k)
                        .map_err(|logit| CandleError::NonFiniteLogit { position, logit })?;
                    let next = next.map(|id| TokenLogprob {
                        id,
                        logprob: log_prob(row[id as usize], vocab.logsumexp),
                    });
                    Ok(PositionVocab {
                        position,
                        vocab,
                        next,
                    })
                })
                .collect();
            for s in summaries {
                out.push(s?);
            }
        }
        Ok(out)
    }

    /// [`forkscore_seam::Backend::vocab_rows`] in candle's error type: the sequence up to the
    /// last asked position runs in prefill chunks (later tokens cannot change earlier
    /// positions), and each chunk's asked positions are summarised as it completes.
    pub(crate) fn vocab_rows_candle(
        &self,
        request: &VocabRequest<'_>,
    ) -> Result<Vec<PositionVocab>, CandleError> {
        let ids = request.ids();
        let positions = request.positions();
        self.check_ids(ids)?;
        self.check_top_k(request.top_k())?;
        if let Some(max) = self.config.text.max_positions {
            if ids.len() > max {
                return Err(CandleError::InvalidRequest {
                    reason: format!(
                        "a sequence of {} tokens is longer than the model's context limit (max_position_embeddings {max})",
                        ids.len()
                    ),
                });
            }
        }
        let mut out = Vec::with_capacity(positions.len());
        self.run_chunks(
            None,
            &ids[..positions.end],
            self.prefill_chunk,
            Some(&mut |hidden: &Tensor, offset: usize| {
                let len = hidden.dims().get(1).copied().unwrap_or(0);
                let (lo, hi) = (positions.start.max(offset), positions.end.min(offset + len));
                if lo >= hi {
                    return Ok(());
                }
                // (1, L, D) -> (L, D) -> (hi - lo, D)
                let rows = hidden
                    .squeeze(0)
                    .and_then(|h| h.narrow(0, lo - offset, hi - lo))
                    .map_err(CandleError::tensor("vocabulary positions"))?;
                let meta: Vec<(usize, Option<u32>)> =
                    (lo..hi).map(|p| (p, ids.get(p + 1).copied())).collect();
                out.extend(self.summarise(&rows, request.top_k(), &meta)?);
                Ok(())
            }),
        )?;
        Ok(out)
    }

    /// The full f32 logits `(V,)` at every position of `ids` run from scratch, as host rows
    /// (for tests and benchmarks that compare the summaries with a full log-softmax + sort).
    pub fn full_logits(&self, ids: &[u32]) -> Result<Vec<Vec<f32>>, CandleError> {
        self.check_ids(ids)?;
        let mut rows = Vec::with_capacity(ids.len());
        self.run_chunks(
            None,
            ids,
            self.prefill_chunk,
            Some(&mut |hidden: &Tensor, _| {
                // (1, L, D) -> (L, D) -> (L, V)
                let h = hidden
                    .squeeze(0)
                    .map_err(CandleError::tensor("full logits rows"))?;
                let logits = self.backbone.full_logits(&h)?;
                rows.extend(
                    logits
                        .to_vec2::<f32>()
                        .map_err(CandleError::tensor("full logits to host"))?,
                );
                Ok(())
            }),
        )?;
        Ok(rows)
    }
}

/// [`CandleBackend::summarise`]'s rows through the GPU kernel: `logits (n, V)` f32 on CUDA.
fn summarise_on_device(
    logits: &Tensor,
    vocab: usize,
    k: usize,
    meta: &[(usize, Option<u32>)],
) -> Result<Vec<PositionVocab>, CandleError> {
    let n = meta.len();
    let d = device_top_k(logits, k).map_err(CandleError::tensor("vocabulary top-K on the GPU"))?;
    // the next token's logit of each row that has one: (n, 1) gather -> host
    let next_logits: Vec<f32> = if meta.iter().any(|m| m.1.is_some()) {
        let idx: Vec<u32> = meta.iter().map(|m| m.1.unwrap_or(0)).collect();
        Tensor::from_vec(idx, (n, 1), logits.device())
            .and_then(|idx| logits.gather(&idx, 1))
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(CandleError::tensor("next-token logits"))?
    } else {
        Vec::new()
    };
    let kk = k.min(vocab);
    let mut out = Vec::with_capacity(n);
    for (i, &(position, next)) in meta.iter().enumerate() {
        if let Ok(id) = u32::try_from(d.status[i]) {
            let value = logits
                .get(i)
                .and_then(|row| row.get(id as usize))
                .and_then(|v| v.to_scalar::<f32>())
                .map_err(CandleError::tensor("non-finite logit"))?;
            return Err(CandleError::NonFiniteLogit {
                position,
                logit: forkscore_seam::NonFiniteLogit { id, value },
            });
        }
        let lse = d.logsumexp[i];
        let row = &d.ids[i * d.stride..i * d.stride + kk];
        let lps = &d.logprobs[i * d.stride..i * d.stride + kk];
        let top = row
            .iter()
            .zip(lps)
            .map(|(&id, &logprob)| TokenLogprob { id, logprob })
            .collect();
        let next = next.map(|id| TokenLogprob {
            id,
            logprob: log_prob(next_logits[i], lse),
        });
        out.push(PositionVocab {
            position,
            vocab: VocabRow {
                logsumexp: lse,
                top,
            },
            next,
        });
    }
    Ok(out)
}
