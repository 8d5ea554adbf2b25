//! Stage 3, grouping: prepared contexts (their prefix length, row count and longest suffix) in;
//! bounded, ordered [`ContextGroup`]s out. A group is the unit of accelerator work: its members
//! are prefilled one by one, then all their rows are scored in one slot-merged pass.
//!
//! Invariants (checked by proptests in `engine/tests/many.rs`):
//! - every item lands in exactly one group, and concatenating the groups' members gives the
//!   items in their input order (groups are contiguous runs; grouping never reorders results);
//! - no group exceeds the [`GroupBudget`] unless it holds a single item that alone exceeds it
//!   (such an item runs alone: forkscore never truncates a prompt to fit a budget).
//!
//! Grouping is greedy (an item joins the open group when the group still fits with it, else it
//! opens the next group): O(items), and streaming — [`GroupPlanner`] emits a group as soon as it
//! is closed, so a batch job never holds more than one open group.
//!
//! Memory estimate ([`MemoryModel`], from the backend's [`ModelFacts`]). For a group of `n`
//! contexts with prefix lengths `p_i` (`P` = sum, `p_max` = longest), `r` rows in all and the
//! longest suffix `s`:
//! - state: `kv · (P + n · p_max)` — every retained prefix state, plus one merged copy whose
//!   attention K/V is left-padded to the longest prefix;
//!   `kv = 2 · layers · kv_heads · head_dim · dtype bytes` (every layer charged as attention);
//! - activations: `act · (p_max + r · s)` — the longest prefill and every scored suffix token,
//!   `act = 8 · hidden · dtype bytes` (residual stream, q/k/v/o and MLP intermediates);
//! - attention scores of the scoring pass: `r · s · (p_max + s) · heads · 4` bytes (f32), with
//!   `heads` = the model's query heads ([`ModelFacts::attention_heads`]).
//!
//! - fixed-size (linear-attention, Qwen3.5) state: `f · 3n + (f / layers) · 2r` — per context
//!   the retained state, its copy in the prefill pass's output and its copy stacked into the
//!   scoring pass's slots; per scored row, one layer's branch state read and written at a time
//!   (the scoring pass drops each layer's branch states when the layer is done).
//!
//! It is an estimate for sizing groups, not an allocator measurement; the token and row bounds
//! hold regardless of it. Linear-attention layers keep a fixed-size state smaller than the K/V
//! this formula charges for them, so the estimate stays on the safe side.

use crate::prepare::split::SplitPrompt;
use forkscore_seam::ModelFacts;
use serde::Serialize;

/// Bytes the CPU default allows one group (state + activations): 512 MiB.
pub const CPU_GROUP_BYTES: usize = 512 << 20;
/// Prefix tokens (summed over a group's contexts) the CPU default allows: 32,768.
pub const CPU_GROUP_PREFIX_TOKENS: usize = 32_768;
/// Rows (fields × contexts) the CPU default allows in one scoring pass: 1,024.
pub const CPU_GROUP_ROWS: usize = 1_024;
/// Share of accelerator memory a group may use when the budget is derived from device memory
/// (the rest holds the weights, the allocator's slack and the next group's prefill).
pub const DEVICE_MEMORY_SHARE: f64 = 0.25;

/// How large one group may grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GroupBudget {
    /// Sum of the members' prefix tokens.
    pub max_prefix_tokens: usize,
    /// Rows of the scoring pass (fields × members).
    pub max_rows: usize,
    /// Estimated state + activation bytes ([`MemoryModel::group_bytes`]).
    pub max_state_bytes: usize,
}

impl Default for GroupBudget {
    /// The fixed, conservative CPU budget (512 MiB, 32,768 prefix tokens, 1,024 rows).
    fn default() -> Self {
        GroupBudget::cpu()
    }
}

impl GroupBudget {
    /// The fixed CPU budget: [`CPU_GROUP_BYTES`], [`CPU_GROUP_PREFIX_TOKENS`], [`CPU_GROUP_ROWS`].
    pub fn cpu() -> GroupBudget {
        GroupBudget {
            max_prefix_tokens: CPU_GROUP_PREFIX_TOKENS,
            max_rows: CPU_GROUP_ROWS,
            max_state_bytes: CPU_GROUP_BYTES,
        }
    }

    /// A budget derived from an accelerator's total memory: [`DEVICE_MEMORY_SHARE`] of it for
    /// one group, and token/row bounds that follow from that byte budget under `model` (a
    /// group of 2,048-token prefixes with up to 64 rows each), floored at the CPU bounds.
    pub fn from_device_memory(device_bytes: u64, model: &MemoryModel) -> GroupBudget {
        let bytes = (device_bytes as f64 * DEVICE_MEMORY_SHARE) as usize;
        let per_context = model.group_bytes(&GroupCost::single(2_048, 64, 16)).max(1);
        let contexts = (bytes / per_context).max(1);
        GroupBudget {
            max_prefix_tokens: (contexts * 2_048).max(CPU_GROUP_PREFIX_TOKENS),
            max_rows: (contexts * 64).max(CPU_GROUP_ROWS),
            max_state_bytes: bytes.max(CPU_GROUP_BYTES),
        }
    }

    /// The default for a device: the CPU budget when `device_bytes` is None (CPU, or an
    /// accelerator whose memory is unknown), else [`GroupBudget::from_device_memory`].
    pub fn for_device(device_bytes: Option<u64>, model: &MemoryModel) -> GroupBudget {
        match device_bytes {
            Some(b) => GroupBudget::from_device_memory(b, model),
            None => GroupBudget::cpu(),
        }
    }

    /// True when `cost` fits.
    pub fn admits(&self, cost: &GroupCost) -> bool {
        cost.prefix_tokens <= self.max_prefix_tokens
            && cost.rows <= self.max_rows
            && cost.estimated_bytes <= self.max_state_bytes
    }
}

/// Bytes per token of retained state and of activations (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryModel {
    pub state_bytes_per_token: usize,
    pub activation_bytes_per_token: usize,
    /// Attention heads assumed for the score matrix of the scoring pass.
    pub heads: usize,
    /// Length-independent state per sequence (Gated DeltaNet conv + recurrent, f32).
    pub fixed_state_bytes: usize,
    /// One layer's share of it: a scoring pass holds the branch states of one layer at a time.
    pub fixed_state_layer_bytes: usize,
}

impl MemoryModel {
    pub fn from_facts(facts: &ModelFacts) -> MemoryModel {
        let d = facts.dtype.size_in_bytes();
        MemoryModel {
            state_bytes_per_token: 2 * facts.num_layers * facts.kv_heads * facts.head_dim * d,
            activation_bytes_per_token: 8 * facts.hidden_size * d,
            heads: facts.attention_heads.max(1),
            fixed_state_bytes: facts.fixed_state_bytes,
            fixed_state_layer_bytes: facts.fixed_state_bytes / facts.fixed_state_layers.max(1),
        }
    }

    /// Estimated bytes of a group with these token counts (`estimated_bytes` is ignored).
    pub fn group_bytes(&self, c: &GroupCost) -> usize {
        let state = self.state_bytes_per_token.saturating_mul(
            c.prefix_tokens
                .saturating_add(c.contexts.saturating_mul(c.longest_prefix)),
        );
        let scored_tokens = c.rows.saturating_mul(c.longest_suffix);
        let act = self
            .activation_bytes_per_token
            .saturating_mul(c.longest_prefix.saturating_add(scored_tokens));
        let scores = scored_tokens
            .saturating_mul(c.longest_prefix.saturating_add(c.longest_suffix))
            .saturating_mul(self.heads)
            .saturating_mul(4);
        // a model without layers (the fake backend) holds nothing
        if self.state_bytes_per_token == 0 && self.activation_bytes_per_token == 0 {
            return 0;
        }
        // Fixed-size (linear-attention) state, per context: the retained state, its copy in a
        // prefill pass's output before it is split per context, and its copy stacked into the
        // scoring pass's slots; per row of the scoring pass, one layer at a time (the pass drops
        // each layer's branch states once the layer is done): the state it reads and the one
        // it computes.
        let fixed = self
            .fixed_state_bytes
            .saturating_mul(c.contexts.saturating_mul(3))
            .saturating_add(
                self.fixed_state_layer_bytes
                    .saturating_mul(c.rows.saturating_mul(2)),
            );
        state
            .saturating_add(act)
            .saturating_add(scores)
            .saturating_add(fixed)
    }
}

/// What a group (or one context) costs against a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct GroupCost {
    pub contexts: usize,
    /// Sum of the members' prefix tokens.
    pub prefix_tokens: usize,
    pub longest_prefix: usize,
    pub rows: usize,
    pub longest_suffix: usize,
    pub estimated_bytes: usize,
}

impl GroupCost {
    fn single(prefix: usize, rows: usize, longest_suffix: usize) -> GroupCost {
        GroupCost {
            contexts: 1,
            prefix_tokens: prefix,
            longest_prefix: prefix,
            rows,
            longest_suffix,
            estimated_bytes: 0,
        }
    }

    /// This cost with one more member.
    fn with(&self, item: &GroupItem, model: &MemoryModel) -> GroupCost {
        let mut c = GroupCost {
            contexts: self.contexts + 1,
            prefix_tokens: self.prefix_tokens.saturating_add(item.prefix_tokens),
            longest_prefix: self.longest_prefix.max(item.prefix_tokens),
            rows: self.rows.saturating_add(item.rows),
            longest_suffix: self.longest_suffix.max(item.longest_suffix),
            estimated_bytes: 0,
        };
        c.estimated_bytes = model.group_bytes(&c);
        c
    }
}

/// One prepared context as grouping sees it. `index` is the caller's handle (e.g. the position
/// of the context in its input); groups report members by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupItem {
    pub index: usize,
    pub prefix_tokens: usize,
    pub rows: usize,
    pub longest_suffix: usize,
}

impl GroupItem {
    pub fn of(index: usize, split: &SplitPrompt) -> GroupItem {
        GroupItem {
            index,
            prefix_tokens: split.prefix_ids.len(),
            rows: split.suffix_ids.len(),
            longest_suffix: split.longest_suffix(),
        }
    }
}

/// A bounded run of consecutive contexts. Only [`GroupPlanner`] (and [`plan_groups`]) build
/// one, so every group in existence respects its budget or is a lone oversized context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextGroup {
    members: Vec<usize>,
    cost: GroupCost,
}

impl ContextGroup {
    /// The members' indices, in input order.
    pub fn members(&self) -> &[usize] {
        &self.members
    }
    pub fn len(&self) -> usize {
        self.members.len()
    }
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
    pub fn cost(&self) -> &GroupCost {
        &self.cost
    }
    /// A group of one context, which runs alone whatever its size (no budget applies).
    pub fn single(item: GroupItem, model: &MemoryModel) -> ContextGroup {
        ContextGroup {
            members: vec![item.index],
            cost: GroupCost::default().with(&item, model),
        }
    }
    /// True for a single context that alone exceeds the budget (it runs alone).
    pub fn oversized(&self, budget: &GroupBudget) -> bool {
        !budget.admits(&self.cost)
    }
}

/// Streaming greedy grouping: push items in order; a closed group comes back as soon as an
/// item does not fit into it.
#[derive(Debug, Clone)]
pub struct GroupPlanner {
    budget: GroupBudget,
    model: MemoryModel,
    open: Option<ContextGroup>,
}

impl GroupPlanner {
    pub fn new(budget: GroupBudget, model: MemoryModel) -> GroupPlanner {
        GroupPlanner {
            budget,
            model,
            open: None,
        }
    }

    /// Add the next item. Returns the group it closed, if it did not fit into the open one.
    pub fn push(&mut self, item: GroupItem) -> Option<ContextGroup> {
        if let Some(open) = &mut self.open {
            let grown = open.cost.with(&item, &self.model);
            if self.budget.admits(&grown) {
                open.members.push(item.index);
                open.cost = grown;
                return None;
            }
        }
        let cost = GroupCost::default().with(&item, &self.model);
        self.open.replace(ContextGroup {
            members: vec![item.index],
            cost,
        })
    }

    /// True when no group is open.
    pub fn is_idle(&self) -> bool {
        self.open.is_none()
    }

    /// Close and return the open group, if any.
    pub fn flush(&mut self) -> Option<ContextGroup> {
        self.open.take()
    }
}

/// Group `items` (in order) under `budget`.
pub fn plan_groups(
    items: impl IntoIterator<Item = GroupItem>,
    budget: &GroupBudget,
    model: &MemoryModel,
) -> Vec<ContextGroup> {
    let mut planner = GroupPlanner::new(*budget, *model);
    let mut groups: Vec<ContextGroup> = items.into_iter().filter_map(|i| planner.push(i)).collect();
    groups.extend(planner.flush());
    groups
}

/// Group facts attached to each decision's telemetry.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupTelemetry {
    /// Contexts in the group this decision was scored with.
    pub size: usize,
    /// This decision's position in its group.
    pub slot: usize,
    /// Rows of the group's scoring pass.
    pub rows: usize,
    /// Sum of the group's prefix tokens.
    pub prefix_tokens: usize,
    pub estimated_bytes: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkscore_seam::{Architecture, DType, Device, Family};

    fn item(index: usize, prefix_tokens: usize, rows: usize) -> GroupItem {
        GroupItem {
            index,
            prefix_tokens,
            rows,
            longest_suffix: 3,
        }
    }

    #[test]
    fn oversized_items_run_alone_and_order_is_kept() {
        let budget = GroupBudget {
            max_prefix_tokens: 100,
            max_rows: 10,
            max_state_bytes: usize::MAX,
        };
        let model = MemoryModel {
            state_bytes_per_token: 0,
            activation_bytes_per_token: 0,
            heads: 1,
            fixed_state_bytes: 0,
            fixed_state_layer_bytes: 0,
        };
        let items = [
            item(0, 40, 2),
            item(1, 40, 2),
            item(2, 500, 2),
            item(3, 10, 2),
            item(4, 10, 20),
        ];
        let groups = plan_groups(items, &budget, &model);
        let members: Vec<&[usize]> = groups.iter().map(ContextGroup::members).collect();
        assert_eq!(members, vec![&[0, 1][..], &[2], &[3], &[4]]);
        assert!(
            groups[1].oversized(&budget)
                && groups[3].oversized(&budget)
                && !groups[0].oversized(&budget)
        );
    }

    #[test]
    fn memory_model_charges_padding_to_the_longest_prefix() {
        let facts = ModelFacts {
            architecture: Architecture::Qwen2ForCausalLM,
            family: Some(Family::Qwen2),
            vocab_size: 10,
            num_layers: 2,
            hidden_size: 128,
            attention_heads: 1,
            kv_heads: 1,
            head_dim: 128,
            fixed_state_bytes: 0,
            fixed_state_layers: 0,
            dtype: DType::Bf16,
            device: Device::Cuda(0),
            quantization: None,
            max_positions: None,
        };
        let m = MemoryModel::from_facts(&facts);
        assert_eq!(m.state_bytes_per_token, 2 * 2 * 128 * 2);
        let one = GroupCost::single(100, 1, 1);
        let two = GroupCost {
            contexts: 2,
            prefix_tokens: 110,
            longest_prefix: 100,
            rows: 2,
            longest_suffix: 1,
            estimated_bytes: 0,
        };
        // the short member is padded to 100 in the merged copy
        assert!(m.group_bytes(&two) - m.group_bytes(&one) >= m.state_bytes_per_token * (10 + 100));
        let gpu = GroupBudget::from_device_memory(80 << 30, &m);
        assert!(gpu.max_state_bytes == 20 << 30 && gpu.max_rows >= CPU_GROUP_ROWS);
    }

    #[test]
    fn memory_model_charges_linear_attention_state_per_context_and_per_row_layer() {
        // Qwen3.5-4B-like: 24 GDN layers of 32 value heads × 128 × 128 f32 = 48 MiB per sequence.
        let per_seq = 24 * 32 * 128 * 128 * 4;
        let facts = ModelFacts {
            architecture: Architecture::Qwen3_5ForConditionalGeneration,
            family: Some(Family::Qwen3_5),
            vocab_size: 10,
            num_layers: 32,
            hidden_size: 2560,
            attention_heads: 16,
            kv_heads: 4,
            head_dim: 256,
            fixed_state_bytes: per_seq,
            fixed_state_layers: 24,
            dtype: DType::Bf16,
            device: Device::Cuda(0),
            quantization: None,
            max_positions: None,
        };
        let m = MemoryModel::from_facts(&facts);
        let cost = GroupCost {
            contexts: 2,
            prefix_tokens: 200,
            longest_prefix: 100,
            rows: 56,
            longest_suffix: 4,
            estimated_bytes: 0,
        };
        let without = MemoryModel {
            fixed_state_bytes: 0,
            fixed_state_layer_bytes: 0,
            ..m
        };
        // per context: retained, prefill output, slot copy; per row: one layer read + written
        assert_eq!(
            m.group_bytes(&cost) - without.group_bytes(&cost),
            per_seq * 3 * 2 + per_seq / 24 * 2 * 56
        );
    }
}
