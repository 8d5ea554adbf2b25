//! A rendered prompt tokenized once up to its anchor, so that text appended to it (a selector,
//! a selector and a code, a selector and a choice) costs a tokenization of the short tail only.
//!
//! Tokenizers segment their input at added tokens (e.g. the assistant header's `<|im_start|>`)
//! before normalizing or pre-tokenizing anything, and guarded ranges (special-token text inside
//! untrusted or schema text, see [`super::guard`]) are tokenized as separate pieces. So the
//! tokens before the last added token or guarded range (the anchor) never depend on what
//! follows: `tokenize(prompt ++ x) == head_ids ++ tokenize(prompt[anchor..] ++ x)`. The anchor
//! is the later of the two; the tail after it is what the template writes after its last marker
//! (`"assistant\n"` for Qwen2.5, `"\n\n"` after the empty think block of Qwen3 / Qwen3.5).
//!
//! The premise is checked on construction by tokenizing the prompt with one appended probe
//! whole (concurrently with the head); a mismatch (an added token configured to strip the
//! whitespace after it, say) drops the anchor, and every tokenization is then of the whole text,
//! as the reference path does. Special-token text inside appended text (field names, choices)
//! is always tokenized as text.
//!
//! Invariant: for every appended `x`, `head_ids() ++ tail_ids(x) == whole_ids(x)`, where
//! [`AnchoredPrompt::whole_ids`] is the guarded tokenization of the whole text.

use super::guard::{encode_guarded, special_hits};
use super::split::{split_from_tails, SplitError, SplitPrompt};
use crate::tokenizer::{ChatTokenizer, TokenizerError};
use rayon::prelude::*;
use std::ops::Range;

/// A prompt text with its head tokenized (see the module docs).
#[derive(Debug)]
pub struct AnchoredPrompt<'a> {
    tok: &'a ChatTokenizer,
    text: &'a str,
    /// Ranges of `text` tokenized as text (sorted, non-overlapping).
    hits: Vec<Range<usize>>,
    /// Byte offset where the tail starts (0: no anchor, every tokenization is whole).
    anchor: usize,
    /// Tokens of `text[..anchor]`.
    head_ids: Vec<u32>,
}

impl<'a> AnchoredPrompt<'a> {
    /// Tokenize `text[..anchor]` once, with `hits` tokenized as text, and check the premise on
    /// `text ++ probe` (one whole tokenization, run concurrently with the head's).
    pub fn new(
        tok: &'a ChatTokenizer,
        text: &'a str,
        hits: Vec<Range<usize>>,
        probe: &str,
    ) -> Result<AnchoredPrompt<'a>, TokenizerError> {
        let added = tok.last_added_token_end(text).unwrap_or(0);
        let guarded = hits.last().map_or(0, |h| h.end);
        let mut prompt = AnchoredPrompt {
            tok,
            text,
            hits,
            anchor: added.max(guarded),
            head_ids: Vec::new(),
        };
        if prompt.anchor == 0 {
            return Ok(prompt);
        }
        let (head, whole) = rayon::join(
            || encode_guarded(tok, &text[..prompt.anchor], &prompt.hits),
            || prompt.whole_ids(probe),
        );
        prompt.head_ids = head?;
        let whole = whole?;
        let tail = prompt.tail_ids(probe)?;
        let holds = whole.len() == prompt.head_ids.len() + tail.len()
            && whole.starts_with(&prompt.head_ids)
            && whole[prompt.head_ids.len()..] == tail[..];
        if !holds {
            prompt.anchor = 0;
            prompt.head_ids = Vec::new();
        }
        Ok(prompt)
    }

    /// The prompt text.
    pub fn text(&self) -> &str {
        self.text
    }

    /// Tokens of the text before the anchor.
    pub fn head_ids(&self) -> &[u32] {
        &self.head_ids
    }

    /// Tokens of the text after the anchor followed by `appended`: with [`Self::head_ids`]
    /// before them, the tokens of `text ++ appended`. Special-token text inside `appended` is
    /// tokenized as text.
    pub fn tail_ids(&self, appended: &str) -> Result<Vec<u32>, TokenizerError> {
        let tail = &self.text[self.anchor..];
        let joined = format!("{tail}{appended}");
        let mut hits: Vec<Range<usize>> = self
            .hits
            .iter()
            .filter(|h| h.start >= self.anchor)
            .map(|h| h.start - self.anchor..h.end - self.anchor)
            .collect();
        hits.extend(special_hits(self.tok, &joined, &(tail.len()..joined.len())));
        encode_guarded(self.tok, &joined, &hits)
    }

    /// The reference: `text ++ appended` tokenized whole, with the same ranges as text.
    pub fn whole_ids(&self, appended: &str) -> Result<Vec<u32>, TokenizerError> {
        let joined = format!("{}{appended}", self.text);
        let mut hits = self.hits.clone();
        hits.extend(special_hits(
            self.tok,
            &joined,
            &(self.text.len()..joined.len()),
        ));
        encode_guarded(self.tok, &joined, &hits)
    }

    /// Tokens of the whole text (head and tail).
    pub fn prompt_len(&self) -> Result<usize, TokenizerError> {
        Ok(self.head_ids.len() + self.tail_ids("")?.len())
    }

    /// Split `text ++ selectors[i]` into one shared prefix and per-row suffixes, and give each
    /// row's tail tokens (what a code or choice appended after the selector is checked against).
    pub fn split(&self, selectors: &[String]) -> Result<(SplitPrompt, Vec<Vec<u32>>), SplitError> {
        if let Some(index) = selectors.iter().position(String::is_empty) {
            return Err(SplitError::EmptySelector { index });
        }
        let prefix_tail = self.tail_ids("")?;
        let tails: Vec<Vec<u32>> = selectors
            .par_iter()
            .map(|s| self.tail_ids(s))
            .collect::<Result<_, _>>()?;
        let split = split_from_tails(self.text, &self.head_ids, &prefix_tail, &tails)?;
        Ok((split, tails))
    }
}

/// Split `prefix_text ++ selectors[i]` for every `i` with the same result as
/// [`super::split::split_exact`], tokenizing the long head once (see the module docs).
pub fn split_anchored(
    tok: &ChatTokenizer,
    prefix_text: &str,
    selectors: &[String],
) -> Result<SplitPrompt, SplitError> {
    if let Some(index) = selectors.iter().position(String::is_empty) {
        return Err(SplitError::EmptySelector { index });
    }
    // The premise check runs on the row with the longest selector.
    let probe = selectors
        .iter()
        .max_by_key(|s| s.len())
        .map_or("", String::as_str);
    let anchored = AnchoredPrompt::new(tok, prefix_text, Vec::new(), probe)?;
    Ok(anchored.split(selectors)?.0)
}
