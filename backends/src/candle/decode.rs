//! Greedy decoding on candle: [`forkscore_seam::Backend::decode_step`] in one forward.
//!
//! In: a retained state and one token. The token runs through the backbone over the state's
//! K/V (and conv + recurrent states) exactly as a one-token `extend` (the state is appended
//! to, never mutated: the new state is a new value); the hidden row of that one position
//! goes through the final norm and the WHOLE output head (`Backbone::full_logits`, f32, in
//! head slices), the `(V,)` logits are copied to the host once and [`argmax`] picks the
//! greedy token. One forward per generated token; the prompt is never run again.
//!
//! Cost beyond the forward: the head over the full vocabulary for one row (what any greedy
//! decoder pays) and appending the new K/V to the retained tensors (a copy of the state per
//! attention layer, as the prefill chunks already do; a preallocated cache would avoid it).

use forkscore_seam::{DecodeStep, NonFiniteLogit, PrefixState};

use super::{CandleBackend, CandleState};
use crate::error::CandleError;

/// Index of the largest value (the first, i.e. the lowest id, on ties). NaN or +inf is an
/// error; −inf is an ordinary (smallest) value. An empty row has no argmax.
pub fn argmax(row: &[f32], position: usize) -> Result<u32, CandleError> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in row.iter().enumerate() {
        if x.is_nan() || x == f32::INFINITY {
            return Err(CandleError::NonFiniteLogit {
                position,
                logit: NonFiniteLogit {
                    id: i as u32,
                    value: x,
                },
            });
        }
        if best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map(|(i, _)| i as u32)
        .ok_or_else(|| CandleError::InvalidRequest {
            reason: "empty logits row: no argmax".into(),
        })
}

impl CandleBackend {
    /// [`forkscore_seam::Backend::decode_step`] in candle's error type.
    pub(crate) fn decode_step_candle(
        &self,
        state: &CandleState,
        token: u32,
    ) -> Result<DecodeStep<CandleState>, CandleError> {
        let b = &self.backbone;
        if state.layers().len() != b.layers.len() {
            return Err(CandleError::InvalidRequest {
                reason: format!(
                    "state has {} layers; this model has {}",
                    state.layers().len(),
                    b.layers.len()
                ),
            });
        }
        let position = state.len();
        if let Some(max) = self.config.text.max_positions {
            if position >= max {
                return Err(CandleError::InvalidRequest {
                    reason: format!(
                        "decoding position {position} is past the model's context limit (max_position_embeddings {max})"
                    ),
                });
            }
        }
        let mut logits = None;
        let next_state = self.run_chunks(
            Some(state),
            &[token],
            1,
            Some(&mut |hidden: &candle_core::Tensor, _| {
                // (1, 1, D) -> (1, D) -> (1, V) f32 -> host (V,)
                let row = hidden
                    .squeeze(0)
                    .map_err(CandleError::tensor("decode hidden row"))?;
                let full = b.full_logits(&row)?;
                logits = Some(
                    full.flatten_all()
                        .and_then(|t| t.to_vec1::<f32>())
                        .map_err(CandleError::tensor("decode logits to host"))?,
                );
                Ok(())
            }),
        )?;
        let row = logits.ok_or_else(|| CandleError::InvalidRequest {
            reason: "decode step produced no hidden row".into(),
        })?;
        Ok(DecodeStep {
            state: next_state,
            next: argmax(&row, position)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::argmax;

    #[test]
    fn argmax_takes_the_lowest_id_on_ties_and_refuses_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0], 0).unwrap(), 1);
        assert_eq!(
            argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY], 0).unwrap(),
            0
        );
        assert_eq!(argmax(&[-5.0, f32::NEG_INFINITY, -1.0], 0).unwrap(), 2);
        assert!(argmax(&[1.0, f32::NAN], 3).is_err());
        assert!(argmax(&[1.0, f32::INFINITY], 3).is_err());
        assert!(argmax(&[], 0).is_err());
    }
}
