//! One backbone call's batch geometry: per-row positions, RoPE tables and masks.
//!
//! In: for each row its past length (the prefix it continues; 0 for a plain forward), how many
//! of the `len` new tokens are real (the rest are right padding), and the merged past length `P`
//! when rows continue different prefixes. Out: a [`Step`] shared by every layer of the call.
//! Row `r`'s token `t` sits at absolute position `past_len[r] + t`, so RoPE continues each row
//! from its own prefix regardless of padding. A packed token tree ([`Step::tree`]) is one row
//! whose node `i` sits at `past_len + depth(i)` under a tree mask. A packed prefill
//! ([`Step::packed`]) is one row of `T` tokens holding several independent prefixes back to back
//! (no padding): token `t` of segment `s` sits at position `t`, and every mixer keeps segments
//! apart (attention per segment under its own causal mask, Gated DeltaNet conv and scan per
//! segment from zero state), so a segment's result never depends on its neighbours.

use candle_core::{DType, Device, Tensor};

use super::layers::attention::AttnMasks;
use super::layers::mask;
use super::layers::rope::{Rope, RopeTables};
use crate::error::CandleError;

pub(crate) struct Step {
    pub rows: usize,
    pub len: usize,
    /// cos/sin `(B, L, R/2)`.
    pub rope: RopeTables,
    /// `(1, 1, 1, L, L)` causal (built when first read) or a packed tree's, `None` when `L == 1`.
    pub new_keys: Option<mask::NewKeysMask>,
    /// `(1, B, 1, 1, P)`, `None` when no row has left padding.
    pub past_mask: Option<Tensor>,
    /// `(B,)` u32 first visible past key per row: `past_mask` for the flash kernel.
    pub past_start: Option<Tensor>,
    /// Per row: number of real new tokens (`<= len`); later ones are right padding.
    /// (Attention needs no padding mask for them; linear-attention mixers must not let pads
    /// update the state they return — only relevant for prefill, which never pads.)
    pub valid: Vec<usize>,
    /// `Some` for a packed prefill: the segments of the one row, each with its own geometry.
    pub packed: Option<Packing>,
    /// `Some` when rows continue several slots attended one by one
    /// ([`super::state::LayerPast::AttentionSlots`]).
    pub slots: Option<SlotSteps>,
    /// Whether the call's layer updates are kept (true but for a scoring pass, whose branch
    /// states are dropped: [`Step::discarding_state`]). Where false, a mixer may return an
    /// update it did not compute in full — the fused Gated DeltaNet kernels then skip writing
    /// each row's final recurrent state (`(Hv, dk, dv)` f32 a row).
    pub keeps_state: bool,
}

/// A call whose rows continue several slots: `rows_per_slot` consecutive rows per slot, and per
/// slot the step a call of those rows alone would use (its masks, and its length: the slot's
/// longest row), so each slot's attention is computed exactly as when it is scored alone.
pub(crate) struct SlotSteps {
    pub rows_per_slot: usize,
    pub steps: Vec<Step>,
}

/// One independent prefix inside a packed row: tokens `start .. start + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub start: usize,
    pub len: usize,
}

/// The segments of a packed row and, per segment, the step a solo prefill of it would use
/// (its causal mask and its RoPE tables from position 0): mixers run each segment's
/// sequence-mixing part under it.
pub(crate) struct Packing {
    pub segments: Vec<Segment>,
    pub steps: Vec<Step>,
}

impl Step {
    /// The same step for a call whose layer updates nobody keeps (a scoring pass,
    /// [`super::models::Backbone::forward_branch`]): the outputs are the same, the updates
    /// may be left incomplete ([`Step::keeps_state`]).
    pub fn discarding_state(mut self) -> Self {
        // `FORKSCORE_BRANCH_STATE=keep` computes the branch states anyway (to time the saving)
        self.keeps_state = crate::switches::is("FORKSCORE_BRANCH_STATE", "keep");
        self
    }

    /// `merged_past`: `Some(P)` when rows see per-row pasts left-padded to `P`.
    pub fn new(
        rope: &Rope,
        past_lens: &[usize],
        valid: &[usize],
        len: usize,
        merged_past: Option<usize>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, CandleError> {
        let rows = past_lens.len();
        let positions: Vec<u32> = past_lens
            .iter()
            .flat_map(|&p| (0..len).map(move |t| (p + t) as u32))
            .collect();
        let tables = rope.tables(&positions, rows, len, dtype, device)?;
        let new_keys = if len > 1 {
            Some(mask::NewKeysMask::causal(len, device))
        } else {
            None
        };
        let (past_mask, past_start) = match merged_past {
            Some(p) if past_lens.iter().any(|&l| l < p) => (
                Some(mask::left_padding(past_lens, p, device)?),
                Some(mask::past_starts(past_lens, p, device)?),
            ),
            _ => (None, None),
        };
        Ok(Step {
            rows,
            len,
            rope: tables,
            new_keys,
            past_mask,
            past_start,
            valid: valid.to_vec(),
            packed: None,
            slots: None,
            keeps_state: true,
        })
    }

    /// [`Step::new`] for rows continuing `slots` retained states one after another
    /// (`rows_per_slot` rows each, slot-major), each slot attended on its own: the whole call's
    /// RoPE tables, and per slot the step of its rows alone.
    pub fn per_slot(
        rope: &Rope,
        past_lens: &[usize],
        valid: &[usize],
        len: usize,
        rows_per_slot: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, CandleError> {
        if rows_per_slot == 0
            || !past_lens.len().is_multiple_of(rows_per_slot)
            || valid.len() != past_lens.len()
        {
            return Err(CandleError::InvalidRequest {
                reason: format!(
                    "{} rows cannot be split into slots of {rows_per_slot}",
                    past_lens.len()
                ),
            });
        }
        let mut step = Step::new(rope, past_lens, valid, len, None, dtype, device)?;
        let steps = past_lens
            .chunks(rows_per_slot)
            .zip(valid.chunks(rows_per_slot))
            .map(|(p, v)| {
                // the slot's own longest row: the length a call of its rows alone has
                let own = v.iter().copied().max().unwrap_or(len).min(len);
                Step::new(rope, p, v, own, None, dtype, device)
            })
            .collect::<Result<Vec<_>, _>>()?;
        step.slots = Some(SlotSteps {
            rows_per_slot,
            steps,
        });
        Ok(step)
    }

    /// One row of `sum(lens)` tokens: the prefixes of `lens` back to back, each from position 0
    /// and from an empty past. `lens` must be non-empty with every length > 0.
    pub fn packed(
        rope: &Rope,
        lens: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Self, CandleError> {
        if lens.is_empty() || lens.contains(&0) {
            return Err(CandleError::InvalidRequest {
                reason: format!("a packed prefill needs non-empty segments, got lengths {lens:?}"),
            });
        }
        let total: usize = lens.iter().sum();
        // positions restart at 0 in every segment
        let positions: Vec<u32> = lens.iter().flat_map(|&n| 0..n as u32).collect();
        let tables = rope.tables(&positions, 1, total, dtype, device)?; // (1, T, R/2)
        let mut segments = Vec::with_capacity(lens.len());
        let mut steps = Vec::with_capacity(lens.len());
        let mut start = 0;
        for &len in lens {
            segments.push(Segment { start, len });
            steps.push(Step::new(rope, &[0], &[len], len, None, dtype, device)?);
            start += len;
        }
        Ok(Step {
            rows: 1,
            len: total,
            rope: tables,
            new_keys: None,
            past_mask: None,
            past_start: None,
            valid: vec![total],
            packed: Some(Packing { segments, steps }),
            slots: None,
            keeps_state: true,
        })
    }

    /// One row of `T` packed token-tree nodes continuing one whole past of `past_len` tokens:
    /// node `i` sits at position `past_len + depths[i]` and sees the past and its own ancestors
    /// (`parents`, parents first) only.
    pub fn tree(
        rope: &Rope,
        past_len: usize,
        parents: &[Option<usize>],
        depths: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Self, CandleError> {
        let len = parents.len();
        if depths.len() != len || len == 0 {
            return Err(CandleError::InvalidRequest {
                reason: format!("{} tree depths for {len} nodes", depths.len()),
            });
        }
        let positions: Vec<u32> = depths.iter().map(|&d| (past_len + d) as u32).collect();
        let tables = rope.tables(&positions, 1, len, dtype, device)?;
        let new_keys = if len > 1 {
            Some(mask::NewKeysMask::tree(parents, device)?)
        } else {
            None
        };
        Ok(Step {
            rows: 1,
            len,
            rope: tables,
            new_keys,
            past_mask: None,
            past_start: None,
            valid: vec![len],
            packed: None,
            slots: None,
            keeps_state: true,
        })
    }

    pub fn masks(&self) -> AttnMasks<'_> {
        AttnMasks {
            new_keys: self.new_keys.as_ref(),
            past: self.past_mask.as_ref(),
            past_start: self.past_start.as_ref(),
            precision: Default::default(),
        }
    }
}
