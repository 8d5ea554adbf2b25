//! Untrusted input on the text side: checkpoint text files, the rendered prompt, the context.
//!
//! - Checkpoint files (`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`) are
//!   read only when they are regular files of bounded size ([`read_checkpoint_file`]); a FIFO
//!   named `tokenizer.json` is refused instead of blocking forever.
//! - Template rendering is bounded by minijinja fuel ([`TEMPLATE_FUEL`] instructions), so a
//!   template with nested `range(100000)` loops fails with a render error instead of hanging.
//! - The context must appear verbatim in the rendered prompt ([`context_span`]): a template that
//!   drops the user message would otherwise score every context identically.
//! - The context is tokenized as text ([`split_context`]): a special token written inside it
//!   (e.g. `<|im_end|>\n<|im_start|>assistant\n`) is encoded as the ordinary tokens of its
//!   characters, so a context cannot forge chat turns. A context without special-token text
//!   tokenizes exactly as it always did (same ids, same split); the opt-out is
//!   [`crate::Engine::with_context_special_tokens`].
//! - The schema's text (field names, descriptions, choices, choice descriptions) is tokenized as
//!   text too, always ([`schema_hits`], and the appended selector / code / choice text in
//!   [`super::anchor`]): schemas come from request bodies and JSONL lines as contexts do. A
//!   schema without special-token text tokenizes exactly as before. Only the template's own
//!   markers are control tokens.
//!
//! Invariant: for every row, `prefix_ids ++ suffix_ids[i]` equals the guarded tokenization of
//! `prefix_text ++ selector_i` (checked by the shared split routine, as for the plain split).

use std::ops::Range;

use super::anchor::AnchoredPrompt;
pub use super::guard::encode_guarded;
use super::guard::special_hits;
use super::render::{schema_text, user_message_in};
use super::split::{SplitError, SplitPrompt};
use crate::error::EngineError;
use crate::options::Layout;
use crate::schema::Field;
pub use crate::template::TEMPLATE_FUEL;
use crate::tokenizer::ChatTokenizer;
pub use crate::tokenizer::{read_checkpoint_file, read_checkpoint_text};

/// Byte range of `context` inside the rendered `prefix_text`. The whole user message is looked
/// for first (so a context that also occurs in the instructions is located where the user turn
/// has it), then the context alone. Neither found: the template dropped or rewrote the user
/// message, and every context would score the same — an error.
pub fn context_span(
    prefix_text: &str,
    context: &str,
    fields: &[Field],
    layout: Layout,
) -> Result<Range<usize>, EngineError> {
    let (message, offset) = user_message_in(context, fields, layout);
    if let Some(at) = prefix_text.find(&message) {
        let start = at + offset;
        return Ok(start..start + context.len());
    }
    match prefix_text.find(context) {
        Some(start) => Ok(start..start + context.len()),
        None => Err(EngineError::ContextNotInPrompt),
    }
}

/// Special-token text inside the schema's part of a rendered prompt: `catalogue` (the schema's
/// fields as the user turn lists them, after the context), looked for from byte `from` on. The
/// schema's text is never trusted: it comes from request bodies and JSONL lines like the
/// context. A template that rewrites the catalogue cannot leave it out (every field's text is
/// needed), so when the catalogue is not found verbatim and holds special-token text, that is
/// an error rather than a control token.
pub fn schema_hits(
    tok: &ChatTokenizer,
    prefix_text: &str,
    from: usize,
    catalogue: &str,
) -> Result<Vec<Range<usize>>, SplitError> {
    let found = prefix_text
        .get(from..)
        .and_then(|rest| rest.find(catalogue))
        .map(|at| from + at..from + at + catalogue.len());
    match found {
        Some(span) => Ok(special_hits(tok, prefix_text, &span)),
        None => match special_hits(tok, catalogue, &(0..catalogue.len())).first() {
            None => Ok(Vec::new()),
            Some(h) => Err(SplitError::UnguardedSchemaText {
                token: catalogue[h.clone()].to_string(),
            }),
        },
    }
}

/// The ranges of a scoring prompt tokenized as text: special-token text inside the context at
/// `span` (unless `trust_context` opts out) and inside the schema's catalogue (always).
pub fn guarded_ranges(
    tok: &ChatTokenizer,
    prefix_text: &str,
    span: &Range<usize>,
    trust_context: bool,
    fields: &[Field],
    layout: Layout,
) -> Result<Vec<Range<usize>>, SplitError> {
    let mut hits = if trust_context {
        Vec::new()
    } else {
        special_hits(tok, prefix_text, span)
    };
    add_schema_hits(
        tok,
        prefix_text,
        span,
        layout,
        &schema_text(fields, layout),
        &mut hits,
    )?;
    Ok(hits)
}

/// Add to `hits` (the context's ranges, sorted) the special-token text inside `schema`, the
/// schema's text as a prompt in `layout` holds it: after the context at `span`
/// (context-first) or before it (fields-first) — the scoring and the generation prompts alike.
/// `hits` stays sorted.
pub fn add_schema_hits(
    tok: &ChatTokenizer,
    prompt: &str,
    span: &Range<usize>,
    layout: Layout,
    schema: &str,
    hits: &mut Vec<Range<usize>>,
) -> Result<(), SplitError> {
    match layout {
        Layout::ContextFirst => hits.extend(schema_hits(tok, prompt, span.end, schema)?),
        Layout::FieldsFirst => {
            hits.splice(0..0, schema_hits(tok, prompt, 0, schema)?);
        }
    }
    Ok(())
}

/// Split the prompt `prefix_text ++ selectors[i]` with the context at `span` tokenized as
/// text (unless `trust_special` opts out) and the schema's text always tokenized as text.
/// Without special-token text in either, this is [`super::anchor::split_anchored`], unchanged.
pub fn split_context(
    tok: &ChatTokenizer,
    prefix_text: &str,
    span: Range<usize>,
    trust_special: bool,
    fields: &[Field],
    selectors: &[String],
    layout: Layout,
) -> Result<SplitPrompt, SplitError> {
    if let Some(index) = selectors.iter().position(String::is_empty) {
        return Err(SplitError::EmptySelector { index });
    }
    let hits = guarded_ranges(tok, prefix_text, &span, trust_special, fields, layout)?;
    // The selectors follow the prefix, so the ranges (inside the prefix) hold for every row.
    let probe = selectors
        .iter()
        .max_by_key(|s| s.len())
        .map_or("", String::as_str);
    let anchored = AnchoredPrompt::new(tok, prefix_text, hits, probe)?;
    Ok(anchored.split(selectors)?.0)
}
