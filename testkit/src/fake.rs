//! A deterministic, causal fake backend for engine tests.
//!
//! Its "model" is a position-aware hash chain: the state after tokens `t_0 … t_n` is
//! `h_{n+1} = mix(h_n, t_n, n)`, and a candidate's logit is a function of the final `h` and the
//! candidate id. So a row's logits depend on every token of prefix ++ suffix, in order: reusing
//! the wrong state, feeding padding, mixing up slots or dropping a token changes the answer —
//! while every correct evaluation order (prefill + suffix, or the full prompt at once) gives
//! bit-identical logits.

use forkscore_backends::{
    Architecture, Backend, BackendError, CandidateLogits, DType, Device, ModelFacts, PositionVocab,
    PrefixState, ScoreRequest, TokenLogprob, VocabRequest, VocabRow,
};
use forkscore_seam::topk::{log_prob, top_k};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Embedding rows of the fake model (enough for any Qwen tokenizer id).
pub const FAKE_VOCAB: usize = 248_320;

/// Retained fake state: the hash after the prefix and its length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeState {
    hash: u64,
    len: usize,
}

impl PrefixState for FakeState {
    fn len(&self) -> usize {
        self.len
    }
    fn nbytes(&self) -> usize {
        std::mem::size_of::<FakeState>()
    }
}

/// Calls made, for tests that check batching (how many prefills and score calls ran).
#[derive(Debug, Default)]
pub struct CallCounts {
    pub prefill: AtomicUsize,
    pub score: AtomicUsize,
    pub forward_full: AtomicUsize,
    pub rows_scored: AtomicUsize,
    /// The most states (contexts) any one score call has held.
    pub max_states_per_score: AtomicUsize,
}

impl CallCounts {
    pub fn snapshot(&self) -> [usize; 4] {
        [
            self.prefill.load(Ordering::SeqCst),
            self.score.load(Ordering::SeqCst),
            self.forward_full.load(Ordering::SeqCst),
            self.rows_scored.load(Ordering::SeqCst),
        ]
    }
}

/// The fake backend. `seed` changes every logit (a different "model").
#[derive(Debug)]
pub struct FakeBackend {
    facts: ModelFacts,
    seed: u64,
    /// What [`Backend::contexts_alone`] answers.
    contexts_alone: bool,
    pub calls: CallCounts,
}

impl FakeBackend {
    pub fn new(seed: u64) -> FakeBackend {
        FakeBackend {
            facts: ModelFacts {
                architecture: Architecture::Fake,
                family: None,
                vocab_size: FAKE_VOCAB,
                num_layers: 0,
                hidden_size: 0,
                attention_heads: 0,
                kv_heads: 0,
                head_dim: 0,
                fixed_state_bytes: 0,
                fixed_state_layers: 0,
                dtype: DType::F32,
                device: Device::Cpu,
                quantization: None,
                max_positions: None,
            },
            seed,
            contexts_alone: false,
            calls: CallCounts::default(),
        }
    }

    /// State a context limit (`max_position_embeddings`), as a real checkpoint does.
    pub fn with_max_positions(mut self, max_positions: usize) -> FakeBackend {
        self.facts.max_positions = Some(max_positions);
        self
    }

    /// Ask the engine to keep contexts in calls of their own ([`Backend::contexts_alone`], as
    /// `--deterministic` on a GPU does).
    pub fn with_contexts_alone(mut self) -> FakeBackend {
        self.contexts_alone = true;
        self
    }

    /// Use another embedding size (to test the tokenizer-vs-embedding check).
    pub fn with_vocab_size(mut self, vocab_size: usize) -> FakeBackend {
        self.facts.vocab_size = vocab_size;
        self
    }

    fn start(&self) -> u64 {
        splitmix(self.seed ^ 0x243F_6A88_85A3_08D3)
    }

    fn step(hash: u64, id: u32, pos: usize) -> u64 {
        splitmix(hash ^ (u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15)) ^ ((pos as u64) << 40))
    }

    fn advance(&self, mut hash: u64, start: usize, ids: &[u32]) -> Result<u64, BackendError> {
        for (j, &id) in ids.iter().enumerate() {
            if id as usize >= self.facts.vocab_size {
                return Err(BackendError::TokenOutOfRange {
                    id,
                    vocab_size: self.facts.vocab_size,
                });
            }
            hash = Self::step(hash, id, start + j);
        }
        Ok(hash)
    }

    fn logit(hash: u64, c: u32) -> f32 {
        let h = splitmix(hash ^ u64::from(c).wrapping_mul(0xD6E8_FEB8_6659_FD93));
        // 53 random bits → [-8, 8)
        ((h >> 11) as f64 / (1u64 << 53) as f64 * 16.0 - 8.0) as f32
    }

    fn logits(hash: u64, candidates: &[u32]) -> Vec<f32> {
        candidates.iter().map(|&c| Self::logit(hash, c)).collect()
    }

    /// The logits of every id of the vocabulary (the same function as [`Self::logits`]).
    fn full_row(&self, hash: u64) -> Vec<f32> {
        (0..self.facts.vocab_size as u32)
            .map(|c| Self::logit(hash, c))
            .collect()
    }

    fn check_top_k(&self, k: usize) -> Result<(), BackendError> {
        if k > self.facts.vocab_size {
            return Err(BackendError::InvalidRequest {
                reason: format!(
                    "top-K of {k} asked; the model's vocabulary has {} tokens",
                    self.facts.vocab_size
                ),
            });
        }
        Ok(())
    }

    /// The summary of the position whose hash is `hash`.
    fn summary(&self, hash: u64, k: usize, position: usize) -> Result<VocabRow, BackendError> {
        top_k(&self.full_row(hash), k)
            .map_err(|logit| BackendError::NonFiniteLogit { position, logit })
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Backend for FakeBackend {
    type State = FakeState;

    fn facts(&self) -> &ModelFacts {
        &self.facts
    }

    fn prefill(&self, ids: &[u32]) -> Result<FakeState, BackendError> {
        if ids.is_empty() {
            return Err(BackendError::InvalidRequest {
                reason: "prefill of an empty prefix".into(),
            });
        }
        self.calls.prefill.fetch_add(1, Ordering::SeqCst);
        Ok(FakeState {
            hash: self.advance(self.start(), 0, ids)?,
            len: ids.len(),
        })
    }

    fn contexts_alone(&self) -> bool {
        self.contexts_alone
    }

    fn extend(&self, state: &FakeState, ids: &[u32]) -> Result<FakeState, BackendError> {
        if ids.is_empty() {
            return Err(BackendError::InvalidRequest {
                reason: "extend with no tokens".into(),
            });
        }
        self.calls.prefill.fetch_add(1, Ordering::SeqCst);
        Ok(FakeState {
            hash: self.advance(state.hash, state.len, ids)?,
            len: state.len + ids.len(),
        })
    }

    fn score(
        &self,
        request: &ScoreRequest<'_, FakeState>,
    ) -> Result<CandidateLogits, BackendError> {
        let (states, rows, candidates) = (request.states(), request.rows(), request.candidates());
        self.calls.score.fetch_add(1, Ordering::SeqCst);
        self.calls
            .rows_scored
            .fetch_add(rows.len(), Ordering::SeqCst);
        self.calls
            .max_states_per_score
            .fetch_max(states.len(), Ordering::SeqCst);
        let mut data = Vec::with_capacity(rows.len() * candidates.len());
        let mut vocab = request
            .vocab_top_k()
            .map(|_| Vec::with_capacity(rows.len()));
        if let Some(k) = request.vocab_top_k() {
            self.check_top_k(k)?;
        }
        for (i, row) in rows.iter().enumerate() {
            let state = states[row.state];
            let hash = self.advance(state.hash, state.len, row.suffix)?;
            data.extend(Self::logits(hash, candidates));
            if let (Some(v), Some(k)) = (vocab.as_mut(), request.vocab_top_k()) {
                v.push(self.summary(hash, k, i)?);
            }
        }
        Ok(CandidateLogits {
            rows: rows.len(),
            candidates: candidates.len(),
            data,
            vocab,
        })
    }

    fn forward_full(&self, ids: &[u32], candidates: &[u32]) -> Result<Vec<f32>, BackendError> {
        if ids.is_empty() {
            return Err(BackendError::InvalidRequest {
                reason: "forward of an empty prompt".into(),
            });
        }
        self.calls.forward_full.fetch_add(1, Ordering::SeqCst);
        Ok(Self::logits(
            self.advance(self.start(), 0, ids)?,
            candidates,
        ))
    }

    fn vocab_rows(&self, request: &VocabRequest<'_>) -> Result<Vec<PositionVocab>, BackendError> {
        let ids = request.ids();
        self.check_top_k(request.top_k())?;
        self.advance(self.start(), 0, ids)?; // every id in range, the next tokens included
        self.calls.forward_full.fetch_add(1, Ordering::SeqCst);
        let mut hash = self.start();
        let mut out = Vec::with_capacity(request.positions().len());
        for (p, &id) in ids[..request.positions().end].iter().enumerate() {
            hash = self.advance(hash, p, &[id])?;
            if p < request.positions().start {
                continue;
            }
            let vocab = self.summary(hash, request.top_k(), p)?;
            let next = ids.get(p + 1).map(|&n| TokenLogprob {
                id: n,
                logprob: log_prob(Self::logit(hash, n), vocab.logsumexp),
            });
            out.push(PositionVocab {
                position: p,
                vocab,
                next,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkscore_backends::ScoreRow;

    #[test]
    fn prefill_then_score_equals_full_forward_and_order_matters() {
        let b = FakeBackend::new(7);
        let s = b.prefill(&[1, 2, 3]).unwrap();
        let cands = [10, 11, 12];
        let scored = b
            .score_rows(
                &[&s],
                &[ScoreRow {
                    state: 0,
                    suffix: &[4, 5],
                }],
                &cands,
            )
            .unwrap();
        assert_eq!(
            scored.row(0),
            b.forward_full(&[1, 2, 3, 4, 5], &cands).unwrap().as_slice()
        );
        assert_ne!(
            scored.row(0),
            b.forward_full(&[1, 2, 3, 5, 4], &cands).unwrap().as_slice()
        );
        assert_ne!(
            scored.row(0),
            b.forward_full(&[2, 3, 4, 5], &cands).unwrap().as_slice()
        );
        assert!(b
            .score_rows(
                &[&s],
                &[ScoreRow {
                    state: 1,
                    suffix: &[4]
                }],
                &cands
            )
            .is_err());
        assert!(b.prefill(&[FAKE_VOCAB as u32]).is_err());
    }
}
