//! Guarded tokenization: special-token text found inside untrusted text (a context, a schema's
//! text) is encoded as the ordinary tokens of its characters, never as control tokens. Which
//! ranges are guarded is decided by the caller (`untrusted`, `anchor`); this module only finds
//! special-token text (`special_hits`) and tokenizes around it ([`encode_guarded`]).

use crate::tokenizer::{ChatTokenizer, TokenizerError};
use std::ops::Range;

/// Special-token occurrences inside `text[span]`: leftmost first, longest at a position,
/// non-overlapping (as the tokenizer's own added-token split finds them).
pub(crate) fn special_hits(
    tok: &ChatTokenizer,
    text: &str,
    span: &Range<usize>,
) -> Vec<Range<usize>> {
    let Some(inner) = text.get(span.clone()) else {
        return Vec::new();
    };
    let mut all: Vec<Range<usize>> = tok
        .special_tokens()
        .iter()
        .flat_map(|t| {
            inner
                .match_indices(t.as_str())
                .map(|(i, m)| span.start + i..span.start + i + m.len())
        })
        .collect();
    all.sort_by_key(|r| (r.start, std::cmp::Reverse(r.end)));
    let mut hits: Vec<Range<usize>> = Vec::new();
    for r in all {
        if hits.last().is_none_or(|h| r.start >= h.end) {
            hits.push(r);
        }
    }
    hits
}

/// Tokenize `text` with the special tokens found at `hits` encoded as text. The tokenizer
/// splits its input at added tokens before anything else, so the pieces between hits tokenize
/// exactly as they would inside the whole text.
pub fn encode_guarded(
    tok: &ChatTokenizer,
    text: &str,
    hits: &[Range<usize>],
) -> Result<Vec<u32>, TokenizerError> {
    let mut ids = Vec::new();
    let mut at = 0;
    for h in hits {
        ids.extend(tok.encode(&text[at..h.start])?);
        ids.extend(tok.encode_as_text(&text[h.clone()])?);
        at = h.end;
    }
    ids.extend(tok.encode(&text[at..])?);
    Ok(ids)
}
