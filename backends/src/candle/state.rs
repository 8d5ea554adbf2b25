//! Retained prefix state, and how a batch of rows sees it.
//!
//! [`CandleState`] holds one [`LayerState`] per decoder layer after a prefix: attention layers
//! keep K (after q/k norm and RoPE) and V `(1, Hkv, T, hd)` in the compute dtype; linear-attention
//! layers keep a conv state `(1, Kc−1, C)` and a recurrent state `(1, Hv, dk, dv)` in f32. A state is
//! built by prefill and never mutated afterwards: scoring reads it through [`LayerPast`] views and
//! discards whatever the branch computes.
//!
//! [`merge_slots`] turns the states a scoring call uses into per-layer [`LayerPast`] views:
//! one state used by every row is passed as is (leading dim 1, no per-row copy); several states
//! become slots — attention K/V one view per slot at its own length, attended per slot; linear
//! states stacked per slot and read per row.

use candle_core::Tensor;

use crate::error::CandleError;
use forkscore_seam::PrefixState;

/// State of one decoder layer after a prefix.
#[derive(Debug, Clone)]
pub enum LayerState {
    /// K and V, each `(1, Hkv, T, hd)`.
    Attention { k: Tensor, v: Tensor },
    /// Linear-attention conv state `(1, Kc−1, C)` and recurrent state `(1, Hv, dk, dv)`, f32.
    Linear { conv: Tensor, recurrent: Tensor },
}

impl LayerState {
    fn tensors(&self) -> [&Tensor; 2] {
        match self {
            LayerState::Attention { k, v } => [k, v],
            LayerState::Linear { conv, recurrent } => [conv, recurrent],
        }
    }

    /// Bytes held by the layer's tensors.
    pub fn nbytes(&self) -> usize {
        self.tensors()
            .iter()
            .map(|t| t.elem_count() * t.dtype().size_in_bytes())
            .sum()
    }

    /// The state after `update`: K/V appended along T; linear states replaced.
    pub(crate) fn extend(
        prev: Option<&LayerState>,
        update: LayerUpdate,
    ) -> Result<LayerState, CandleError> {
        match (prev, update) {
            (None, LayerUpdate::Attention { k, v }) => Ok(LayerState::Attention { k, v }),
            (Some(LayerState::Attention { k: pk, v: pv }), LayerUpdate::Attention { k, v }) => {
                // (1, Hkv, T, hd) ++ (1, Hkv, L, hd) -> (1, Hkv, T + L, hd)
                let cat = |a: &Tensor, b: &Tensor| {
                    Tensor::cat(&[a, b], 2).map_err(CandleError::tensor("state append"))
                };
                Ok(LayerState::Attention {
                    k: cat(pk, &k)?,
                    v: cat(pv, &v)?,
                })
            }
            (None | Some(LayerState::Linear { .. }), LayerUpdate::Linear { conv, recurrent }) => {
                Ok(LayerState::Linear { conv, recurrent })
            }
            _ => Err(CandleError::InvalidRequest {
                reason: "layer update does not match the layer's state kind".into(),
            }),
        }
    }
}

/// What one layer's forward produced for the new tokens of a call.
pub(crate) enum LayerUpdate {
    /// The new tokens' K and V `(B, Hkv, L, hd)`.
    Attention { k: Tensor, v: Tensor },
    /// The conv and recurrent states after the new tokens (leading dim `B`).
    Linear { conv: Tensor, recurrent: Tensor },
}

/// How the rows of one call see a layer's retained prefix.
pub(crate) enum LayerPast {
    /// No prefix (plain forward, or the first prefill chunk).
    Empty,
    /// K/V `(Hkv, S, P, hd)` (KV-head-major) of `S` slots (left-padded to `P`); `S` divides the
    /// row count and rows are slot-major: row `b` continues slot `b / (B / S)`. `S == 1`: one
    /// shared prefix.
    Attention { k: Tensor, v: Tensor },
    /// Several slots, each its own K/V `(Hkv, 1, P_s, hd)` at its own length (no padding); rows
    /// are slot-major, `B / S` per slot. Each slot's rows attend to it exactly as a call scoring
    /// that slot alone would ([`crate::candle::step::SlotSteps`]).
    AttentionSlots(Vec<(Tensor, Tensor)>),
    /// conv `(S, Kc−1, C)` and recurrent `(S, Hv, dk, dv)` f32 of `S` retained states, and which
    /// of them each row of the call continues. Built from states of linear-attention layers
    /// (Qwen3.5); dense models never produce one.
    Linear {
        conv: Tensor,
        recurrent: Tensor,
        rows: StateRows,
    },
}

/// Which retained linear-attention state each row of a call continues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StateRows {
    /// `S == 1`: every row continues the one state.
    Shared,
    /// Row `b` continues state `slot_of_row[b]` (`B` entries, each `< S`).
    Slots(Vec<u32>),
}

impl LayerPast {
    /// The whole of one retained state, shared by every row of the call.
    pub(crate) fn whole(state: &LayerState) -> Result<LayerPast, CandleError> {
        Ok(match state {
            LayerState::Attention { k, v } => LayerPast::Attention {
                k: head_major(k)?,
                v: head_major(v)?,
            },
            LayerState::Linear { conv, recurrent } => LayerPast::Linear {
                conv: conv.clone(),
                recurrent: recurrent.clone(),
                rows: StateRows::Shared,
            },
        })
    }
}

/// `(1, Hkv, T, hd) -> (Hkv, 1, T, hd)`: the same memory (a reshape of a size-1 axis).
fn head_major(t: &Tensor) -> Result<Tensor, CandleError> {
    let op = CandleError::tensor("head-major past");
    let (one, hkv, len, hd) = t.dims4().map_err(CandleError::tensor("past dims"))?;
    if one != 1 {
        return Err(CandleError::InvalidRequest {
            reason: format!("a retained K/V has {one} rows, expected 1"),
        });
    }
    t.contiguous()
        .and_then(|t| t.reshape((hkv, one, len, hd)))
        .map_err(op)
}

/// The retained state of one prefix: one [`LayerState`] per decoder layer.
#[derive(Debug, Clone)]
pub struct CandleState {
    layers: Vec<LayerState>,
    len: usize,
}

impl CandleState {
    pub(crate) fn new(layers: Vec<LayerState>, len: usize) -> Self {
        CandleState { layers, len }
    }

    /// Per-layer state, in layer order (read-only).
    pub fn layers(&self) -> &[LayerState] {
        &self.layers
    }
}

impl PrefixState for CandleState {
    fn len(&self) -> usize {
        self.len
    }

    fn nbytes(&self) -> usize {
        self.layers.iter().map(LayerState::nbytes).sum()
    }
}

/// Per-layer views of the states a scoring call uses.
///
/// `slots[i]` is the index into `states` of slot `i` (distinct); `batch_slot[b]` is the slot of
/// batch row `b`, slot-major (the rows of one slot are contiguous and every slot has the same
/// number of rows). Returns the views and the merged past length `P` (the longest used prefix).
/// One slot: every view is the state itself (leading dim 1). Several: attention K/V stay one
/// view per slot at the slot's own length ([`LayerPast::AttentionSlots`], no copy, no padding:
/// each slot's rows attend as they would alone, so a row's result does not depend on the other
/// slots of the call); linear states are stacked per slot (`(S, ..)`) with each row's slot
/// ([`StateRows::Slots`]): the fused CUDA kernels read a row's state through its slot, the
/// candle path gathers it per row.
pub(crate) fn merge_slots(
    states: &[&CandleState],
    slots: &[usize],
    batch_slot: &[u32],
) -> Result<(Vec<LayerPast>, usize), CandleError> {
    let op = |e| CandleError::Tensor {
        op: "merge slots",
        source: e,
    };
    let p = slots.iter().map(|&s| states[s].len).max().unwrap_or(0);
    if let [only] = slots {
        return Ok((
            states[*only]
                .layers
                .iter()
                .map(LayerPast::whole)
                .collect::<Result<_, _>>()?,
            p,
        ));
    }
    let Some(first) = slots.first().map(|&s| states[s]) else {
        return Ok((Vec::new(), p));
    };
    if first.layers.is_empty() {
        return Ok((Vec::new(), p));
    }
    let mismatch = || CandleError::InvalidRequest {
        reason: "states disagree on layer kinds".into(),
    };
    let mut views = Vec::with_capacity(first.layers.len());
    for layer in 0..first.layers.len() {
        let per_slot: Vec<&LayerState> = slots.iter().map(|&s| &states[s].layers[layer]).collect();
        let view = match per_slot[0] {
            LayerState::Attention { .. } => {
                let mut kv = Vec::with_capacity(per_slot.len());
                for l in &per_slot {
                    let LayerState::Attention { k, v } = l else {
                        return Err(mismatch());
                    };
                    // (1, Hkv, T, hd) -> (Hkv, 1, T, hd): the same memory
                    kv.push((head_major(k)?, head_major(v)?));
                }
                LayerPast::AttentionSlots(kv)
            }
            LayerState::Linear { .. } => {
                let mut cs = Vec::with_capacity(per_slot.len());
                let mut rs = Vec::with_capacity(per_slot.len());
                for l in &per_slot {
                    let LayerState::Linear { conv, recurrent } = l else {
                        return Err(mismatch());
                    };
                    cs.push(conv.clone());
                    rs.push(recurrent.clone());
                }
                // S x (1, ..) -> (S, ..); row b continues slot batch_slot[b]
                LayerPast::Linear {
                    conv: Tensor::cat(&cs, 0).map_err(op)?,
                    recurrent: Tensor::cat(&rs, 0).map_err(op)?,
                    rows: StateRows::Slots(batch_slot.to_vec()),
                }
            }
        };
        views.push(view);
    }
    Ok((views, p))
}
