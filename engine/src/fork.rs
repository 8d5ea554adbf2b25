//! Stages 4 and 5, prefill and score: fork one retained prefix state per context into its rows.
//!
//! In: split prompts (one per context of a group), the candidate id union, and optionally a
//! [`SharedPrefix`] (a retained state that several contexts' prefixes extend). Out: per context,
//! per row, f32 logits over the candidates, plus call counts and stage timings. Every mode feeds
//! the model exactly the same tokens and projects the same candidates; only the batching differs:
//! - parallel: one prefill per context, rows scored together (`row_batch` splits them into
//!   several calls, still one prefill);
//! - cached-serial: one prefill per context, one row per call;
//! - independent: each full prompt from scratch (the reference path);
//! - tree: one prefill per context, every code row of the group (each a chain continuing its
//!   context's state: `TokenTree::from_rows`) in ONE `Backend::score_tree` call; on an
//!   attention-only model the candle backend packs each state's rows into one sequence under a
//!   tree mask, elsewhere the seam's default scores them as flat rows (`RunStats::tree_packing`
//!   names which ran).
//!
//! With `vocab_top_k` (the allowed-mass diagnostics), every row also gets its full-vocabulary
//! summary at the decision position ([`VocabRow`]): in the same score calls
//! (`ScoreRequest::with_vocab`), or, in independent mode, from `Backend::vocab_rows` at the
//! full prompt's last position (a second forward per row: the reference path stays plain).
//!
//! A context whose prefix strictly extends a [`SharedPrefix`] is prefilled by extending the
//! shared state with its remaining tokens (the same tokens, so the same result).
//!
//! Literal-scored fields ([`TreePlan`]) are not flat rows: per context, one token tree holds
//! every literal field's selector and choice trie (`literal::tree`), scored by one
//! `Backend::score_tree` call over the context's state (parallel, cached-serial and tree), or, in
//! independent mode, one `forward_full` (and, for the log-likelihood methods, one `vocab_rows`)
//! per projected node on the full prompt up to it — the reference.

use crate::literal::tree::{context_tree, field_scores, NodeScores, TreePlan};
// defined in `options`; re-exported at its former path
pub use crate::options::Mode;
use crate::prepare::split::SplitPrompt;
use forkscore_seam::{
    Backend, BackendError, CandidateLogits, PrefixState, ScoreRequest, ScoreRow, TokenTree,
    TreeRequest, VocabRequest, VocabRow,
};
use serde::Serialize;
use std::time::Instant;

/// Shortest shared prefix worth a separate prefill.
pub const MIN_SHARED_PREFIX: usize = 16;

/// A retained state of a token prefix that several prompts extend (e.g. instructions + one
/// context, scored against many schemas). Built by [`SharedPrefix::prefill`].
pub struct SharedPrefix<S> {
    ids: Vec<u32>,
    state: S,
}

impl<S: PrefixState> SharedPrefix<S> {
    /// The longest common token prefix of `first` and every prompt of `others`, less one token
    /// so each of them still extends it; None when `others` is empty or that prefix is shorter
    /// than [`MIN_SHARED_PREFIX`] (nothing worth sharing).
    pub fn common_prefix<'a>(
        first: &'a [u32],
        others: impl IntoIterator<Item = &'a [u32]>,
    ) -> Option<&'a [u32]> {
        let mut common = first.len().saturating_sub(1);
        let mut any = false;
        for other in others {
            let lcp = first.iter().zip(other).take_while(|(a, b)| a == b).count();
            common = common.min(lcp).min(other.len().saturating_sub(1));
            any = true;
        }
        (any && common >= MIN_SHARED_PREFIX).then(|| &first[..common])
    }

    /// Prefill `ids` once and keep the state.
    pub fn prefill<B: Backend<State = S>>(
        backend: &B,
        ids: &[u32],
    ) -> Result<SharedPrefix<S>, BackendError> {
        Ok(SharedPrefix {
            ids: ids.to_vec(),
            state: backend.prefill(ids)?,
        })
    }

    /// The token ids the state covers.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// True when `prefix` strictly extends this shared prefix (so it can be extended from it).
    pub fn covers(&self, prefix: &[u32]) -> bool {
        prefix.len() > self.ids.len() && prefix.starts_with(&self.ids)
    }
}

/// What a run did, for telemetry.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RunStats {
    pub prefill_calls: usize,
    pub score_calls: usize,
    pub forward_calls: usize,
    /// Bytes held by retained prefix states (sum over the group).
    pub state_bytes: usize,
    /// Prefix tokens not prefilled again because a retained base state was extended.
    pub reused_prefix_tokens: usize,
    pub prefill_ms: f64,
    pub score_ms: f64,
    /// Token-tree calls (literal fields, and the code rows in tree mode; independent mode
    /// counts `forward_calls` instead).
    pub tree_calls: usize,
    /// Nodes of those trees, and how many of them were projected.
    pub tree_nodes: usize,
    pub tree_projected: usize,
    /// How the backend evaluated those trees (`Backend::tree_packing`), None without a tree call.
    pub tree_packing: Option<&'static str>,
}

/// Logits of one group: `logits[context][row][candidate]` (a literal field's row is empty: its
/// logits are in [`GroupScores::literal`]).
pub type GroupLogits = Vec<Vec<Vec<f32>>>;

/// Full-vocabulary summaries of one group: `vocab[context][i]` for the `i`-th code row; every
/// context's list is empty when none were asked for.
pub type GroupVocab = Vec<Vec<VocabRow>>;

/// Literal fields' logits of one group: `literal[context][field]` (None for a code field).
pub type GroupLiteral = Vec<Vec<Option<NodeScores>>>;

/// What one group's scoring returns.
pub struct GroupScores {
    pub logits: GroupLogits,
    pub vocab: GroupVocab,
    pub literal: GroupLiteral,
    pub stats: RunStats,
}

/// Evaluate every row of every context in `splits`. With `Mode::Parallel`, rows of all contexts
/// go into shared score calls of at most `row_batch` rows (None = all rows in one call): the
/// slot-merged pass of a group. A context whose prefix strictly extends `shared` is prefilled by
/// extending it; any other context is prefilled whole. `vocab_top_k`: also each row's
/// full-vocabulary summary with its top K tokens (code rows only). `literal`: the fields scored
/// through token trees (rows of those fields are left empty in `logits`).
#[allow(clippy::too_many_arguments)]
pub fn score_group<B: Backend>(
    backend: &B,
    shared: Option<&SharedPrefix<B::State>>,
    splits: &[&SplitPrompt],
    candidates: &[u32],
    literal: &TreePlan<'_>,
    mode: Mode,
    row_batch: Option<usize>,
    vocab_top_k: Option<usize>,
) -> Result<GroupScores, BackendError> {
    let mut stats = RunStats::default();
    let mut out: GroupLogits = splits
        .iter()
        .map(|s| vec![Vec::new(); s.suffix_ids.len()])
        .collect();
    let mut vocab: GroupVocab = splits.iter().map(|_| Vec::new()).collect();
    if mode == Mode::Independent {
        let t = Instant::now();
        let mut trees: GroupLiteral = Vec::with_capacity(splits.len());
        for ((c, split), rows) in splits.iter().enumerate().zip(out.iter_mut()) {
            for (r, row) in rows.iter_mut().enumerate() {
                if literal.is_literal(r) {
                    continue;
                }
                let full = split.full_ids(r);
                *row = backend.forward_full(&full, candidates)?;
                stats.forward_calls += 1;
                if let Some(k) = vocab_top_k {
                    let last = backend.vocab_rows(&VocabRequest::last_position(&full, k)?)?;
                    let [row]: [_; 1] =
                        last.try_into()
                            .map_err(|l: Vec<_>| BackendError::InvalidRequest {
                                reason: format!(
                                    "{} vocabulary summaries for one position",
                                    l.len()
                                ),
                            })?;
                    vocab[c].push(row.vocab);
                    stats.forward_calls += 1;
                }
            }
            trees.push(independent_tree(backend, split, literal, &mut stats)?);
        }
        stats.score_ms = ms(t);
        return Ok(GroupScores {
            logits: out,
            vocab,
            literal: trees,
            stats,
        });
    }

    let t = Instant::now();
    // Contexts that extend the shared prefix continue it together (`Backend::extend_many`); all
    // the others are prefilled together (`Backend::prefill_many`).
    let mut states: Vec<Option<B::State>> = splits.iter().map(|_| None).collect();
    let mut fresh: Vec<usize> = Vec::with_capacity(splits.len());
    if let Some(shared) = shared {
        // every context that extends the shared prefix, in one `extend_many` call
        let n = shared.ids.len();
        let (covered, rest): (Vec<usize>, Vec<usize>) =
            (0..splits.len()).partition(|&c| shared.covers(&splits[c].prefix_ids));
        fresh = rest;
        let suffixes: Vec<&[u32]> = covered
            .iter()
            .map(|&c| &splits[c].prefix_ids[n..])
            .collect();
        let results = backend.extend_many(&shared.state, &suffixes);
        if results.len() != covered.len() {
            return Err(BackendError::InvalidRequest {
                reason: format!(
                    "extend_many returned {} states for {} suffixes",
                    results.len(),
                    covered.len()
                ),
            });
        }
        for (&c, r) in covered.iter().zip(results) {
            stats.reused_prefix_tokens += n;
            states[c] = Some(r?);
        }
    } else {
        fresh.extend(0..splits.len());
    }
    let prefixes: Vec<&[u32]> = fresh
        .iter()
        .map(|&c| splits[c].prefix_ids.as_slice())
        .collect();
    let results = backend.prefill_many(&prefixes);
    if results.len() != fresh.len() {
        return Err(BackendError::InvalidRequest {
            reason: format!(
                "prefill_many returned {} states for {} prefixes",
                results.len(),
                fresh.len()
            ),
        });
    }
    for (&c, r) in fresh.iter().zip(results) {
        states[c] = Some(r?);
    }
    let states = states
        .into_iter()
        .map(|s| {
            s.ok_or_else(|| BackendError::InvalidRequest {
                reason: "a context was left without a prefilled state".into(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    stats.prefill_calls = states.len();
    stats.state_bytes = states.iter().map(PrefixState::nbytes).sum();
    stats.prefill_ms = ms(t);

    let t = Instant::now();
    let state_refs: Vec<&B::State> = states.iter().collect();
    // All (context, row) pairs in order; each becomes one ScoreRow.
    let pairs: Vec<(usize, usize)> = splits
        .iter()
        .enumerate()
        .flat_map(|(c, s)| (0..s.suffix_ids.len()).map(move |r| (c, r)))
        .filter(|&(_, r)| !literal.is_literal(r))
        .collect();
    if mode == Mode::Tree && !pairs.is_empty() {
        // every code row a chain over its context's state, all in one tree call
        let rows: Vec<ScoreRow<'_>> = pairs
            .iter()
            .map(|&(c, r)| ScoreRow {
                state: c,
                suffix: &splits[c].suffix_ids[r],
            })
            .collect();
        let tree = TokenTree::from_rows(&rows, state_refs.len())?;
        let mut request = TreeRequest::new(&state_refs, &tree, candidates)?;
        if let Some(k) = vocab_top_k {
            request = request.with_vocab(k)?;
        }
        let logits = backend.score_tree(&request)?;
        stats.tree_calls += 1;
        stats.tree_nodes += tree.len();
        stats.tree_projected += rows.len();
        stats.tree_packing = Some(backend.tree_packing().name());
        spread(
            logits,
            &pairs,
            candidates.len(),
            vocab_top_k,
            &mut out,
            &mut vocab,
        )?;
    }
    let batch = match mode {
        Mode::CachedSerial => 1,
        _ => row_batch.unwrap_or(pairs.len()).max(1),
    };
    let flat_pairs: &[(usize, usize)] = if mode == Mode::Tree { &[] } else { &pairs };
    for chunk in flat_pairs.chunks(batch) {
        // Only the states this chunk uses are passed, so a small batch never carries other slots;
        // `slot_of[c]` is context c's index among them.
        let mut used: Vec<usize> = Vec::new();
        let mut slot_of: Vec<Option<usize>> = vec![None; splits.len()];
        let mut rows: Vec<ScoreRow<'_>> = Vec::with_capacity(chunk.len());
        for &(c, r) in chunk {
            let state = *slot_of[c].get_or_insert_with(|| {
                used.push(c);
                used.len() - 1
            });
            rows.push(ScoreRow {
                state,
                suffix: &splits[c].suffix_ids[r],
            });
        }
        let call_states: Vec<&B::State> = used.iter().map(|&c| state_refs[c]).collect();
        let mut request = ScoreRequest::new(&call_states, &rows, candidates)?;
        if let Some(k) = vocab_top_k {
            request = request.with_vocab(k)?;
        }
        let logits = backend.score(&request)?;
        stats.score_calls += 1;
        spread(
            logits,
            chunk,
            candidates.len(),
            vocab_top_k,
            &mut out,
            &mut vocab,
        )?;
    }
    let mut trees: GroupLiteral = Vec::with_capacity(splits.len());
    for (split, state) in splits.iter().zip(&state_refs) {
        trees.push(tree_call(backend, state, split, literal, &mut stats)?);
    }
    stats.score_ms = ms(t);
    Ok(GroupScores {
        logits: out,
        vocab,
        literal: trees,
        stats,
    })
}

/// Hand the logits (and summaries) of one call over `pairs` (context, row) to their places.
fn spread(
    mut logits: CandidateLogits,
    pairs: &[(usize, usize)],
    candidates: usize,
    vocab_top_k: Option<usize>,
    out: &mut GroupLogits,
    vocab: &mut GroupVocab,
) -> Result<(), BackendError> {
    logits.check_shape(pairs.len(), candidates)?;
    let mut summaries = match (vocab_top_k, logits.vocab.take()) {
        (None, _) => None,
        (Some(_), Some(v)) => Some(v.into_iter()),
        (Some(_), None) => {
            return Err(BackendError::InvalidRequest {
                reason: "vocabulary summaries were asked for but the backend returned none".into(),
            })
        }
    };
    for (i, &(c, r)) in pairs.iter().enumerate() {
        out[c][r] = logits.row(i).to_vec();
        if let Some(row) = summaries.as_mut().and_then(Iterator::next) {
            vocab[c].push(row);
        }
    }
    Ok(())
}

/// One context's literal fields in one `score_tree` call over its prefix state.
fn tree_call<B: Backend>(
    backend: &B,
    state: &B::State,
    split: &SplitPrompt,
    literal: &TreePlan<'_>,
    stats: &mut RunStats,
) -> Result<Vec<Option<NodeScores>>, BackendError> {
    let tree = context_tree(&split.suffix_ids, &literal.fields, 0)?;
    let Some(t) = &tree else {
        return field_scores(None, &literal.fields, &[], None);
    };
    let states = [state];
    let mut request = TreeRequest::new(&states, &t.tree, literal.candidates)?;
    if literal.logsumexp {
        request = request.with_vocab(0)?;
    }
    let mut logits = backend.score_tree(&request)?;
    let projected = t.tree.projected().len();
    logits.check_shape(projected, literal.candidates.len())?;
    stats.tree_calls += 1;
    stats.tree_nodes += t.tree.len();
    stats.tree_projected += projected;
    stats.tree_packing = Some(backend.tree_packing().name());
    let lse: Option<Vec<f32>> = match (literal.logsumexp, logits.vocab.take()) {
        (false, _) => None,
        (true, Some(v)) if v.len() == projected => Some(v.iter().map(|r| r.logsumexp).collect()),
        (true, _) => {
            return Err(BackendError::InvalidRequest {
                reason: "the tree's logsumexps were asked for but the backend returned none".into(),
            })
        }
    };
    let rows: Vec<Vec<f32>> = (0..projected).map(|i| logits.row(i).to_vec()).collect();
    field_scores(tree.as_ref(), &literal.fields, &rows, lse.as_deref())
}

/// The reference for [`tree_call`]: every projected node's full prompt run from scratch.
fn independent_tree<B: Backend>(
    backend: &B,
    split: &SplitPrompt,
    literal: &TreePlan<'_>,
    stats: &mut RunStats,
) -> Result<Vec<Option<NodeScores>>, BackendError> {
    let tree = context_tree(&split.suffix_ids, &literal.fields, 0)?;
    let Some(t) = &tree else {
        return field_scores(None, &literal.fields, &[], None);
    };
    let mut rows = Vec::with_capacity(t.tree.projected().len());
    let mut lse = Vec::new();
    for &node in t.tree.projected() {
        let full = [split.prefix_ids.as_slice(), t.tree.path(node).as_slice()].concat();
        rows.push(backend.forward_full(&full, literal.candidates)?);
        stats.forward_calls += 1;
        if literal.logsumexp {
            let last = backend.vocab_rows(&VocabRequest::last_position(&full, 0)?)?;
            let row = last.first().ok_or_else(|| BackendError::InvalidRequest {
                reason: "no vocabulary summary for the last position".into(),
            })?;
            lse.push(row.vocab.logsumexp);
            stats.forward_calls += 1;
        }
    }
    let lse = literal.logsumexp.then_some(lse);
    field_scores(tree.as_ref(), &literal.fields, &rows, lse.as_deref())
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
