//! Retained prefix state, and how a batch of rows sees it.
//!
//! [`CandleState`] holds one [`LayerState`] per decoder layer after a prefix: attention layers
//! keep K (after q/k norm and RoPE) and V `(1, Hkv, T, hd)` in the compute dtype; linear-attention
//! layers keep a conv state `(1, Kc−1, C)` and a recurrent state `(1, Hv, dk, dv)` in f32. A state is
//! built by prefill and never mutated afterwards: scoring reads it through [`LayerPast`] views and
//! discards whatever the branch computes.
//!
//! [`merge_slots`] turns the states a scoring call uses into per-layer [`LayerPast`] views:
//! one state used by every row is passed as is (leading dim 1, broadcast, no per-row copy);
//! several states are merged into slots — attention K/V left-padded with zeros to the longest
//! prefix `P` (hidden by the left-padding mask), linear states stacked — then gathered per row
//! (leading dim `B`).

use candle_core::Tensor;

use crate::seam::PrefixState;
use crate::BackendError;

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
        self.tensors().iter().map(|t| t.elem_count() * t.dtype().size_in_bytes()).sum()
    }

    /// The state after `update`: K/V appended along T; linear states replaced.
    pub(crate) fn extend(prev: Option<&LayerState>, update: LayerUpdate) -> Result<LayerState, BackendError> {
        match (prev, update) {
            (None, LayerUpdate::Attention { k, v }) => Ok(LayerState::Attention { k, v }),
            (Some(LayerState::Attention { k: pk, v: pv }), LayerUpdate::Attention { k, v }) => {
                // (1, Hkv, T, hd) ++ (1, Hkv, L, hd) -> (1, Hkv, T + L, hd)
                let cat = |a: &Tensor, b: &Tensor| Tensor::cat(&[a, b], 2).map_err(BackendError::tensor("state append"));
                Ok(LayerState::Attention { k: cat(pk, &k)?, v: cat(pv, &v)? })
            }
            (None | Some(LayerState::Linear { .. }), LayerUpdate::Linear { conv, recurrent }) => {
                Ok(LayerState::Linear { conv, recurrent })
            }
            _ => Err(BackendError::InvalidRequest { reason: "layer update does not match the layer's state kind".into() }),
        }
    }
}

/// What one layer's forward produced for the new tokens of a call.
pub(crate) enum LayerUpdate {
    /// The new tokens' K and V `(B, Hkv, L, hd)`.
    Attention { k: Tensor, v: Tensor },
    /// The conv and recurrent states after the new tokens (leading dim `B`).
    #[allow(dead_code)] // produced by linear-attention mixers (Qwen3.5)
    Linear { conv: Tensor, recurrent: Tensor },
}

/// How the rows of one call see a layer's retained prefix.
pub(crate) enum LayerPast {
    /// No prefix (plain forward, or the first prefill chunk).
    Empty,
    /// K/V `(S, Hkv, P, hd)`: `S == 1` shared by all rows when `shared`, else `S == B` (one
    /// left-padded past per row).
    Attention { k: Tensor, v: Tensor, shared: bool },
    /// conv `(S, Kc−1, C)` and recurrent `(S, Hv, dk, dv)` f32, `S == 1` when `shared`, else `B`.
    /// Built from states of linear-attention layers (Qwen3.5); dense models never produce one.
    #[allow(dead_code)]
    Linear { conv: Tensor, recurrent: Tensor, shared: bool },
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

/// Per-layer views of `states` for rows whose state indices are `row_states` (each indexes
/// `states`). Returns the views and the merged past length `P` (the longest used prefix).
pub(crate) fn merge_slots(
    states: &[&CandleState],
    row_states: &[usize],
) -> Result<(Vec<LayerPast>, usize), BackendError> {
    let op = |e| BackendError::Tensor { op: "merge slots", source: e };
    // distinct used states, in first-use order = slots
    let mut slots: Vec<usize> = Vec::new();
    for &s in row_states {
        if !slots.contains(&s) {
            slots.push(s);
        }
    }
    let p = slots.iter().map(|&s| states[s].len).max().unwrap_or(0);
    let num_layers = states.first().map(|s| s.layers.len()).unwrap_or(0);
    if let [only] = slots.as_slice() {
        let views = states[*only]
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Attention { k, v } => LayerPast::Attention { k: k.clone(), v: v.clone(), shared: true },
                LayerState::Linear { conv, recurrent } => {
                    LayerPast::Linear { conv: conv.clone(), recurrent: recurrent.clone(), shared: true }
                }
            })
            .collect();
        return Ok((views, p));
    }
    let device = states[slots[0]].layers.first().map(|l| l.tensors()[0].device().clone());
    let Some(device) = device else { return Ok((Vec::new(), p)) };
    // row -> slot index
    let row_slot: Vec<u32> = row_states
        .iter()
        .map(|s| slots.iter().position(|x| x == s).unwrap_or(0) as u32)
        .collect();
    let row_slot = Tensor::new(row_slot.as_slice(), &device).map_err(BackendError::tensor("row slots"))?;
    let mut views = Vec::with_capacity(num_layers);
    for layer in 0..num_layers {
        let per_slot: Vec<&LayerState> = slots.iter().map(|&s| &states[s].layers[layer]).collect();
        let gather = |parts: Vec<Tensor>| -> Result<Tensor, BackendError> {
            // (S, ...) -> (B, ...)
            Tensor::cat(&parts, 0).and_then(|t| t.index_select(&row_slot, 0)).map_err(op)
        };
        let view = match per_slot[0] {
            LayerState::Attention { .. } => {
                let mut ks = Vec::with_capacity(per_slot.len());
                let mut vs = Vec::with_capacity(per_slot.len());
                for l in &per_slot {
                    let LayerState::Attention { k, v } = l else {
                        return Err(BackendError::InvalidRequest { reason: "states disagree on layer kinds".into() });
                    };
                    // (1, Hkv, T, hd) -> (1, Hkv, P, hd), zeros on the left
                    let pad = p - k.dim(2).map_err(op)?;
                    ks.push(k.pad_with_zeros(2, pad, 0).map_err(op)?);
                    vs.push(v.pad_with_zeros(2, pad, 0).map_err(op)?);
                }
                LayerPast::Attention { k: gather(ks)?, v: gather(vs)?, shared: false }
            }
            LayerState::Linear { .. } => {
                let mut cs = Vec::with_capacity(per_slot.len());
                let mut rs = Vec::with_capacity(per_slot.len());
                for l in &per_slot {
                    let LayerState::Linear { conv, recurrent } = l else {
                        return Err(BackendError::InvalidRequest { reason: "states disagree on layer kinds".into() });
                    };
                    cs.push(conv.clone());
                    rs.push(recurrent.clone());
                }
                LayerPast::Linear { conv: gather(cs)?, recurrent: gather(rs)?, shared: false }
            }
        };
        views.push(view);
    }
    Ok((views, p))
}
