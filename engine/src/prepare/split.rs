//! Exact split: full prompts (prefix text ++ each field's selector) in, one shared prefix token
//! list and per-row suffix token lists out, such that `prefix ++ suffix_i == tokenize(full_i)`
//! for every row — checked, not assumed.
//!
//! The parts cannot be tokenized separately (BPE merges across the text boundary), so every full
//! prompt is tokenized and the longest common token prefix of all of them (and of the prefix
//! text alone) is the shared prefix; each suffix keeps at least one token.
//!
//! [`split_exact`] tokenizes every full prompt whole: the plain reference path, R long
//! tokenizations per context. [`split_anchored`] (what the engine uses) tokenizes the text up to
//! the last added token of the prefix (e.g. the assistant header's `<|im_start|>`) once, and only
//! the short tail after it once per row: tokenizers segment their input at added tokens before
//! anything else, so `tokenize(head ++ tail) == tokenize(head) ++ tokenize(tail)`. That premise is
//! checked on every context by tokenizing one full prompt whole (the row with the longest
//! selector), concurrently with the head; a mismatch falls back to [`split_exact`]. Both give
//! identical results (tested).

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

/// Same result as [`split_exact`], tokenizing the long head once (see the module docs).
pub fn split_anchored(
    tok: &ChatTokenizer,
    prefix_text: &str,
    selectors: &[String],
) -> Result<SplitPrompt, SplitError> {
    if let Some(index) = selectors.iter().position(String::is_empty) {
        return Err(SplitError::EmptySelector { index });
    }
    let Some(anchor) = tok.last_added_token_end(prefix_text) else {
        return split_exact(tok, prefix_text, selectors);
    };
    let (head_text, tail_text) = prefix_text.split_at(anchor);
    // The premise check (one full prompt tokenized whole) runs on another thread while the head
    // and the tails are tokenized: a split costs one long tokenization of wall time, not two.
    let probe = (0..selectors.len())
        .max_by_key(|&i| selectors[i].len())
        .unwrap_or(0);
    let (split, whole) = rayon::join(
        || -> Result<(Vec<u32>, Vec<Vec<u32>>), SplitError> {
            let head = tok.encode(head_text)?;
            let join = |tail: Vec<u32>| [head.as_slice(), tail.as_slice()].concat();
            let prefix_only = join(tok.encode(tail_text)?);
            let fulls: Vec<Vec<u32>> = selectors
                .par_iter()
                .map(|s| tok.encode(&format!("{tail_text}{s}")).map(join))
                .collect::<Result<_, _>>()?;
            Ok((prefix_only, fulls))
        },
        || tok.encode(&format!("{prefix_text}{}", selectors[probe])),
    );
    let (prefix_only, fulls) = split?;
    if whole? != fulls[probe] {
        return split_exact(tok, prefix_text, selectors);
    }
    split_from_tokenizations(prefix_text, prefix_only, fulls)
}

/// The longest common token prefix of all rows (and of the prefix alone), each suffix ≥ 1 token.
pub(crate) fn split_from_tokenizations(
    prefix_text: &str,
    prefix_only: Vec<u32>,
    fulls: Vec<Vec<u32>>,
) -> Result<SplitPrompt, SplitError> {
    let mut common = prefix_only.len();
    for f in &fulls {
        common = common
            .min(common_prefix_len(&prefix_only, f))
            .min(f.len().saturating_sub(1));
    }
    let prefix_ids = prefix_only[..common].to_vec();
    let mut suffix_ids = Vec::with_capacity(fulls.len());
    for (row, f) in fulls.into_iter().enumerate() {
        if f[..common] != prefix_ids[..] || f.len() <= common {
            return Err(SplitError::Reconstruction { row });
        }
        suffix_ids.push(f[common..].to_vec());
    }
    Ok(SplitPrompt {
        prefix_text: prefix_text.to_string(),
        prefix_ids,
        suffix_ids,
    })
}
