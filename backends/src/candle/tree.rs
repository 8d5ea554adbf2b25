//! Token trees on candle ([`forkscore_seam::Backend::score_tree`]).
//!
//! Attention-only models (Qwen2, Qwen3) pack ([`TreePacking::Packed`]): for every retained state
//! the tree references, that state's nodes (in index order, so parents first) become ONE
//! sequence `(1, T)` run over the state's K/V, which is read as is (never copied per branch nor
//! mutated). Node `i` sits at position `prefix_len + depth(i)` (its branch-local position, as if
//! its path alone followed the prefix) and attends to the whole prefix and to its own ancestors
//! only (the additive tree mask of [`super::layers::mask::tree`] over the new keys; the past part needs
//! none). Each state's projected nodes' hidden states are gathered right after its pass, and the
//! gathered rows of all states go through the candidate-only head (and the optional
//! full-vocabulary summary) once, in the tree's projected order. Under a tree mask attention
//! takes the candle path (the CUDA flash kernel only knows causal masks).
//!
//! Models with linear-attention layers (Qwen3.5) cannot pack: a Gated DeltaNet layer's recurrent
//! state runs token after token along one sequence and cannot be branched by a mask. They score
//! one batched row per root-to-leaf path ([`TreePacking::RowPerLeaf`]), in one slot-merged pass
//! like `score`, gathering every projected node at its depth on the first leaf path through it
//! (a causal row's position `d` sees exactly `prefix ++ path(node)`), so a projected internal
//! node costs no row of its own.

use candle_core::Tensor;
use forkscore_seam::{CandidateLogits, PrefixState, ScoreRow, TreePacking, TreeRequest};

use super::load::config::LayerKind;
use super::state::{CandleState, LayerPast};
use super::step::Step;
use super::CandleBackend;
use crate::error::CandleError;

impl CandleBackend {
    /// How this model evaluates token trees.
    pub(crate) fn packing(&self) -> TreePacking {
        let dense = self
            .backbone
            .layers
            .iter()
            .all(|l| l.mixer.kind() == LayerKind::FullAttention);
        if dense {
            TreePacking::Packed
        } else {
            TreePacking::RowPerLeaf
        }
    }

    /// One row per root-to-leaf path, every projected node gathered on the first path through
    /// it (see the module docs).
    pub(crate) fn score_tree_leaves(
        &self,
        request: &TreeRequest<'_, CandleState>,
    ) -> Result<CandidateLogits, CandleError> {
        let tree = request.tree();
        let nodes = tree.nodes();
        let leaves = tree.leaves();
        let paths: Vec<Vec<usize>> = leaves.iter().map(|&l| tree.path_nodes(l)).collect();
        // the row (leaf path) each node is read from: the first one through it
        let mut row_of: Vec<Option<usize>> = vec![None; nodes.len()];
        for (r, path) in paths.iter().enumerate() {
            for &n in path {
                row_of[n].get_or_insert(r);
            }
        }
        let picks = tree
            .projected()
            .iter()
            .map(|&i| {
                row_of[i]
                    .map(|r| (r, tree.depth(i)))
                    .ok_or_else(|| CandleError::InvalidRequest {
                        reason: format!("tree node {i} lies on no root-to-leaf path"),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let tokens: Vec<Vec<u32>> = paths
            .iter()
            .map(|p| p.iter().map(|&n| nodes[n].token).collect())
            .collect();
        let rows: Vec<ScoreRow<'_>> = leaves
            .iter()
            .zip(&tokens)
            .map(|(&l, t)| ScoreRow {
                state: nodes[l].state,
                suffix: t,
            })
            .collect();
        let (data, vocab) = self.score_at(
            request.states(),
            &rows,
            &picks,
            request.candidates(),
            request.vocab_top_k(),
        )?;
        Ok(CandidateLogits {
            rows: picks.len(),
            candidates: request.candidates().len(),
            data,
            vocab,
        })
    }

    /// The packed evaluation of `request` (attention-only models; see the module docs).
    pub(crate) fn score_tree_packed(
        &self,
        request: &TreeRequest<'_, CandleState>,
    ) -> Result<CandidateLogits, CandleError> {
        let (states, tree, candidates) = (request.states(), request.tree(), request.candidates());
        let b = &self.backbone;
        self.check_ids(candidates)?;
        self.check_states(states)?;
        let nodes = tree.nodes();
        let tokens: Vec<u32> = nodes.iter().map(|n| n.token).collect();
        self.check_ids(&tokens)?;
        if let Some(k) = request.vocab_top_k() {
            self.check_top_k(k)?;
        }
        // states in order of first use
        let mut used: Vec<usize> = Vec::new();
        for n in nodes {
            if !used.contains(&n.state) {
                used.push(n.state);
            }
        }
        let mut gathered: Vec<Tensor> = Vec::with_capacity(used.len());
        // the tree node of each gathered row, in gathered order
        let mut gathered_nodes: Vec<usize> = Vec::with_capacity(tree.projected().len());
        let mut local = vec![usize::MAX; nodes.len()];
        for &s in &used {
            let members: Vec<usize> = (0..nodes.len()).filter(|&i| nodes[i].state == s).collect();
            for (j, &i) in members.iter().enumerate() {
                local[i] = j;
            }
            let parents: Vec<Option<usize>> = members
                .iter()
                .map(|&i| nodes[i].parent.map(|p| local[p]))
                .collect();
            let depths: Vec<usize> = members.iter().map(|&i| tree.depth(i)).collect();
            let ids: Vec<u32> = members.iter().map(|&i| nodes[i].token).collect();
            let state = states[s];
            let step = Step::tree(&b.rope, state.len(), &parents, &depths, b.dtype, &b.device)?;
            let pasts: Vec<LayerPast> = state
                .layers()
                .iter()
                .map(LayerPast::whole)
                .collect::<Result<_, _>>()?;
            // (1, T) -> hidden (1, T, D); the branch K/V are dropped layer by layer
            let (hidden, branch) = b.forward_branch(&ids, &pasts, &step)?;
            self.record_branch(branch, 1, ids.len(), state.len(), 1);
            let picks: Vec<u32> = members
                .iter()
                .enumerate()
                .filter(|&(_, &i)| nodes[i].project)
                .map(|(j, _)| j as u32)
                .collect();
            if picks.is_empty() {
                continue;
            }
            gathered_nodes.extend(members.iter().filter(|&&i| nodes[i].project));
            let idx = Tensor::new(picks.as_slice(), &b.device)
                .map_err(CandleError::tensor("tree gather index"))?;
            // (1, T, D) -> (T, D) -> (n_s, D)
            gathered.push(
                hidden
                    .flatten_to(1)
                    .and_then(|h| h.index_select(&idx, 0))
                    .map_err(CandleError::tensor("gather projected nodes"))?,
            );
        }
        // (N, D) in gathered order -> the tree's projected (index) order
        let mut row_of = vec![0u32; nodes.len()];
        for (r, &i) in gathered_nodes.iter().enumerate() {
            row_of[i] = r as u32;
        }
        let order: Vec<u32> = tree.projected().iter().map(|&i| row_of[i]).collect();
        let order =
            Tensor::new(order.as_slice(), &b.device).map_err(CandleError::tensor("tree order"))?;
        let last = Tensor::cat(&gathered, 0)
            .and_then(|h| h.index_select(&order, 0))
            .map_err(CandleError::tensor("tree projected rows"))?;
        let (data, vocab) = self.project_rows(&last, candidates, request.vocab_top_k())?;
        Ok(CandidateLogits {
            rows: tree.projected().len(),
            candidates: candidates.len(),
            data,
            vocab,
        })
    }
}
