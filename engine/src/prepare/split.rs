//! Exact split: full prompts (prefix text ++ each field's selector) in, one shared prefix token
//! list and per-row suffix token lists out, such that `prefix ++ suffix_i == tokenize(full_i)`
//! for every row — checked, not assumed.
//!
//! The parts cannot be tokenized separately (BPE merges across the text boundary), so every full
//! prompt is tokenized and the longest common token prefix of all of them (and of the prefix
//! text alone) is the shared prefix; each suffix keeps at least one token.
//!
//! [`split_exact`] tokenizes every full prompt whole: the plain reference path, R long
//! tokenizations per context. The anchored split (what the engine uses: `split_anchored` and
//! `AnchoredPrompt` in `anchor`) tokenizes the text up to the last added token of the
//! prefix (e.g. the assistant header's `<|im_start|>`) once, and only the short tail after it
//! once per row: tokenizers segment their input at added tokens before anything else, so
//! `tokenize(head ++ tail) == tokenize(head) ++ tokenize(tail)`. That premise is checked on every
//! context by tokenizing one full prompt whole (the row with the longest selector), concurrently
//! with the head; a mismatch drops the anchor and tokenizes every row whole, as [`split_exact`]
//! does. Both give identical results (tested). The common prefix is found on the tails
//! ([`split_from_tails`]), so no row's full token list is ever built.

use crate::tokenizer::{ChatTokenizer, TokenizerError};
use rayon::prelude::*;

/// A context's prompt split into shared prefix ids and per-row suffix ids (row order = field order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitPrompt {
    pub prefix_text: String,
    pub prefix_ids: Vec<u32>,
    pub suffix_ids: Vec<Vec<u32>>,
}

impl SplitPrompt {
    /// Prefix plus the longest suffix: what `max_input_tokens` bounds.
    pub fn input_tokens(&self) -> usize {
        self.prefix_ids.len() + self.longest_suffix()
    }
    pub fn longest_suffix(&self) -> usize {
        self.suffix_ids.iter().map(Vec::len).max().unwrap_or(0)
    }
    /// The full token list of row `i`.
    pub fn full_ids(&self, i: usize) -> Vec<u32> {
        let mut ids = self.prefix_ids.clone();
        ids.extend_from_slice(&self.suffix_ids[i]);
        ids
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("selector {index} is empty")]
    EmptySelector { index: usize },
    #[error("split check failed for row {row}: prefix ++ suffix does not reproduce the tokenized prompt")]
    Reconstruction { row: usize },
    #[error("the schema's text contains the special token {token:?}, and the chat template rewrote the field catalogue, so it cannot be kept as plain text; remove it from the schema")]
    UnguardedSchemaText { token: String },
}

fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Split `prefix_text ++ selectors[i]` for every `i`, tokenizing every full prompt whole.
pub fn split_exact(
    tok: &ChatTokenizer,
    prefix_text: &str,
    selectors: &[String],
) -> Result<SplitPrompt, SplitError> {
    if let Some(index) = selectors.iter().position(String::is_empty) {
        return Err(SplitError::EmptySelector { index });
    }
    let prefix_only = tok.encode(prefix_text)?;
    let fulls: Vec<Vec<u32>> = selectors
        .par_iter()
        .map(|s| tok.encode(&format!("{prefix_text}{s}")))
        .collect::<Result<_, _>>()?;
    split_from_tokenizations(prefix_text, prefix_only, fulls)
}

/// The longest common token prefix of all rows (and of the prefix alone), each suffix ≥ 1 token.
pub(crate) fn split_from_tokenizations(
    prefix_text: &str,
    prefix_only: Vec<u32>,
    fulls: Vec<Vec<u32>>,
) -> Result<SplitPrompt, SplitError> {
    split_from_tails(prefix_text, &[], &prefix_only, &fulls)
}

/// [`split_from_tokenizations`] where every tokenization starts with the same `head`: the
/// prompt alone is `head ++ prefix_tail` and row `i` is `head ++ tails[i]`. Works on the tails
/// only, so R rows cost R tails, not R copies of the head.
pub(crate) fn split_from_tails(
    prefix_text: &str,
    head: &[u32],
    prefix_tail: &[u32],
    tails: &[Vec<u32>],
) -> Result<SplitPrompt, SplitError> {
    if !head.is_empty() && tails.iter().any(Vec::is_empty) {
        // a row that adds no token after the head: its suffix would have to reach into the head
        let join = |t: &[u32]| [head, t].concat();
        let fulls: Vec<Vec<u32>> = tails.iter().map(|t| join(t)).collect();
        return split_from_tails(prefix_text, &[], &join(prefix_tail), &fulls);
    }
    let mut common = prefix_tail.len();
    for t in tails {
        common = common
            .min(common_prefix_len(prefix_tail, t))
            .min(t.len().saturating_sub(1));
    }
    let mut prefix_ids = Vec::with_capacity(head.len() + common);
    prefix_ids.extend_from_slice(head);
    prefix_ids.extend_from_slice(&prefix_tail[..common]);
    let mut suffix_ids = Vec::with_capacity(tails.len());
    for (row, t) in tails.iter().enumerate() {
        if t[..common] != prefix_tail[..common] || t.len() <= common {
            return Err(SplitError::Reconstruction { row });
        }
        suffix_ids.push(t[common..].to_vec());
    }
    Ok(SplitPrompt {
        prefix_text: prefix_text.to_string(),
        prefix_ids,
        suffix_ids,
    })
}
