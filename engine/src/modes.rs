//! Prefill + score over the backend seam, in each mode.
//!
//! In: split prompts (one per context of a group) and the candidate id union. Out: per context,
//! per row, f32 logits over the candidates, plus call counts and stage timings. Every mode feeds
//! the model exactly the same tokens and projects the same candidates; only the batching differs:
//! - parallel: one prefill per context, rows scored together (`row_batch` splits them into
//!   several calls, still one prefill);
//! - cached-serial: one prefill per context, one row per call;
//! - independent: each full prompt from scratch (the reference path).

use crate::split::SplitPrompt;
use forkscore_backends::{Backend, BackendError, PrefixState, ScoreRow};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// How rows are evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    #[default]
    Parallel,
    CachedSerial,
    Independent,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "parallel" => Ok(Mode::Parallel),
            "cached-serial" | "cached_serial" => Ok(Mode::CachedSerial),
            "independent" => Ok(Mode::Independent),
            other => Err(format!(
                "unknown mode {other:?} (expected parallel, cached-serial or independent)"
            )),
        }
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
}

/// Logits of one group: `logits[context][row][candidate]`.
pub type GroupLogits = Vec<Vec<Vec<f32>>>;

/// Evaluate every row of every context in `splits`. With `Mode::Parallel`, rows of all contexts
/// go into shared score calls of at most `row_batch` rows (None = all rows in one call): the
/// slot-merged pass of decide_many.
pub fn run_group<B: Backend>(
    backend: &B,
    splits: &[&SplitPrompt],
    candidates: &[u32],
    mode: Mode,
    row_batch: Option<usize>,
) -> Result<(GroupLogits, RunStats), BackendError> {
    run_group_from(backend, None, splits, candidates, mode, row_batch)
}

/// [`run_group`], with an optional retained `base` state of the token prefix `base_ids`: a
/// context whose prefix strictly extends `base_ids` is prefilled by extending `base` with its
/// remaining tokens instead of from scratch (the same tokens, so the same result); any other
/// context is prefilled whole.
pub fn run_group_from<B: Backend>(
    backend: &B,
    base: Option<(&[u32], &B::State)>,
    splits: &[&SplitPrompt],
    candidates: &[u32],
    mode: Mode,
    row_batch: Option<usize>,
) -> Result<(GroupLogits, RunStats), BackendError> {
    let mut stats = RunStats::default();
    let mut out: GroupLogits = splits
        .iter()
        .map(|s| Vec::with_capacity(s.suffix_ids.len()))
        .collect();
    if mode == Mode::Independent {
        let t = Instant::now();
        for (c, split) in splits.iter().enumerate() {
            for r in 0..split.suffix_ids.len() {
                out[c].push(backend.forward_full(&split.full_ids(r), candidates)?);
                stats.forward_calls += 1;
            }
        }
        stats.score_ms = ms(t);
        return Ok((out, stats));
    }

    let t = Instant::now();
    // Contexts that extend the retained base are extended one by one; all the others are
    // prefilled together (one padded pass where the backend can, see `Backend::prefill_many`).
    let mut states: Vec<Option<B::State>> = splits.iter().map(|_| None).collect();
    let mut fresh: Vec<usize> = Vec::with_capacity(splits.len());
    for (c, s) in splits.iter().enumerate() {
        match base {
            Some((ids, state)) if s.prefix_ids.len() > ids.len() && s.prefix_ids.starts_with(ids) => {
                stats.reused_prefix_tokens += ids.len();
                states[c] = Some(backend.extend(state, &s.prefix_ids[ids.len()..])?);
            }
            _ => fresh.push(c),
        }
    }
    let prefixes: Vec<&[u32]> = fresh.iter().map(|&c| splits[c].prefix_ids.as_slice()).collect();
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
        .collect();
    let batch = match mode {
        Mode::CachedSerial => 1,
        _ => row_batch.unwrap_or(pairs.len()).max(1),
    };
    for chunk in pairs.chunks(batch) {
        // Only the states this chunk uses are passed, so a small batch never carries other slots.
        let mut used: Vec<usize> = chunk.iter().map(|&(c, _)| c).collect();
        used.dedup();
        let call_states: Vec<&B::State> = used.iter().map(|&c| state_refs[c]).collect();
        let rows: Vec<ScoreRow<'_>> = chunk
            .iter()
            .map(|&(c, r)| ScoreRow {
                state: used.iter().position(|&u| u == c).unwrap_or_default(),
                suffix: &splits[c].suffix_ids[r],
            })
            .collect();
        let logits = backend.score(&call_states, &rows, candidates)?;
        if logits.rows != rows.len() || logits.candidates != candidates.len() {
            return Err(BackendError::InvalidRequest {
                reason: format!(
                    "backend returned {}x{} logits for {}x{} requested",
                    logits.rows,
                    logits.candidates,
                    rows.len(),
                    candidates.len()
                ),
            });
        }
        stats.score_calls += 1;
        for (i, &(c, _)) in chunk.iter().enumerate() {
            out[c].push(logits.row(i).to_vec());
        }
    }
    stats.score_ms = ms(t);
    Ok((out, stats))
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
