//! Row compilation: a validated [`Schema`] + tokenizer in, a [`CompiledSchema`] out — per field
//! its selector, suffix ids, and either its code token ids and their positions in the union of
//! candidate ids (code scoring) or its [`LiteralField`] (literal scoring: each choice's token
//! path, the choice trie, the projected positions and their index in the tree candidates).
//!
//! Context-independent: built once per (schema, tokenizer + template) and reused for every
//! context. Suffix ids are computed on a probe context; every real context's split is still
//! checked row by row (see `engine`), so a tokenizer that merges differently cannot go unseen.
//!
//! Linear in the schema's size: the probe prompt is rendered once and its head tokenized once
//! ([`AnchoredPrompt`]); the token bound is checked right after, before any per-field work; each
//! selector, code and choice is then tokenized with the prompt's short tail only. The schema's
//! text is tokenized as text (special-token text in it never becomes a control token).

pub mod error;

use crate::literal::compile::{literal_paths, LiteralField};
use crate::literal::tree::TreePlan;
use crate::options::Layout;
use crate::prepare::anchor::AnchoredPrompt;
use crate::prepare::render::{catalogue, code, code_text, render_prefix, selector};
use crate::prepare::untrusted::{context_span, schema_hits};
use crate::schema::{Choice, Field, FieldKind, LiteralMethod, Schema, Scoring};
use crate::tokenizer::ChatTokenizer;
pub use error::CompileError;
use rayon::prelude::*;

/// Probe context used to compile rows (any text works: suffixes do not depend on it).
pub const PROBE_CONTEXT: &str = "A short probe context used to compile rows.";

/// One compiled field (one row per context).
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledField {
    pub name: String,
    pub kind: FieldKind,
    pub choices: Vec<Choice>,
    pub scoring: Scoring,
    /// Code letters, one per choice (`A`, `B`, …); empty for a literal field.
    pub codes: Vec<char>,
    /// The single token id of each code as it appears after the selector; empty for a literal
    /// field.
    pub code_ids: Vec<u32>,
    /// For each choice, the index of its code id in [`CompiledSchema::candidates`]; empty for a
    /// literal field.
    pub candidate_index: Vec<usize>,
    /// The choice paths and trie of a literal-scored field (None: code scoring).
    pub literal: Option<LiteralField>,
    pub selector: String,
    /// Suffix ids on the probe context.
    pub suffix_ids: Vec<u32>,
}

/// A schema compiled against one tokenizer and template.
#[derive(Debug, Clone)]
pub struct CompiledSchema {
    schema: Schema,
    fields: Vec<CompiledField>,
    candidates: Vec<u32>,
    /// Union of the tokens literal fields project (first-seen order).
    tree_candidates: Vec<u32>,
    schema_hash: String,
    /// [`ChatTokenizer::identity`] of the tokenizer the rows were compiled with.
    tokenizer_identity: String,
    /// Tokens every prompt of this schema has at least, whatever the context (see
    /// [`CONTEXT_BOUNDARY_SLACK`]).
    schema_tokens: usize,
}

impl CompiledSchema {
    /// Compile `schema` with no token bound (see [`CompiledSchema::compile_within`]).
    pub fn compile(schema: &Schema, tok: &ChatTokenizer) -> Result<CompiledSchema, CompileError> {
        CompiledSchema::compile_within(schema, tok, None)
    }

    /// Compile `schema`, linear in its size: the probe prompt is rendered once and tokenized
    /// once up to its anchor ([`AnchoredPrompt`]); with `max_input_tokens`, a schema whose
    /// prompt cannot fit with any context is refused right then, before any per-field work;
    /// every selector, code and choice is then tokenized with the short tail after the anchor
    /// only (the same ids as tokenizing each whole prompt: see [`crate::prepare::anchor`]).
    pub fn compile_within(
        schema: &Schema,
        tok: &ChatTokenizer,
        max_input_tokens: Option<usize>,
    ) -> Result<CompiledSchema, CompileError> {
        let prefix_text = render_prefix(
            tok.template(),
            PROBE_CONTEXT,
            schema.fields(),
            Layout::ContextFirst,
        )?;
        let selectors: Vec<String> = schema.fields().iter().map(selector).collect();
        // the catalogue is looked for after the probe context (from the start when a template
        // moved it: preparing a real context then says so)
        let from = context_span(
            &prefix_text,
            PROBE_CONTEXT,
            schema.fields(),
            Layout::ContextFirst,
        )
        .map_or(0, |s| s.end);
        let hits = schema_hits(tok, &prefix_text, from, &catalogue(schema.fields()))?;
        let probe = selectors
            .iter()
            .max_by_key(|s| s.len())
            .map_or("", String::as_str);
        let anchored = AnchoredPrompt::new(tok, &prefix_text, hits, probe)?;
        let schema_tokens = schema_tokens(tok, &anchored)?;
        if let Some(max) = max_input_tokens.filter(|&max| schema_tokens > max) {
            return Err(CompileError::TooManyTokens {
                tokens: schema_tokens,
                max,
            });
        }
        let (split, tails) = anchored.split(&selectors)?;
        // every field's tokens after its selector, in parallel (each tokenization is short)
        let tokens: Vec<Result<FieldTokens, CompileError>> = schema
            .fields()
            .par_iter()
            .zip(&selectors)
            .zip(&tails)
            .enumerate()
            .map(|(i, ((f, sel), tail))| {
                field_tokens(&anchored, f, sel, tail, i + 1 == schema.fields().len())
            })
            .collect();
        let mut candidates: Vec<u32> = Vec::new();
        let mut tree_candidates: Vec<u32> = Vec::new();
        let mut fields = Vec::with_capacity(schema.fields().len());
        for (((f, sel), suffix), tokens) in schema
            .fields()
            .iter()
            .zip(selectors)
            .zip(split.suffix_ids)
            .zip(tokens)
        {
            let mut field = CompiledField {
                name: f.name.clone(),
                kind: f.kind,
                choices: f.choices.clone(),
                scoring: f.scoring,
                codes: Vec::new(),
                code_ids: Vec::new(),
                candidate_index: Vec::new(),
                literal: None,
                selector: sel,
                suffix_ids: suffix,
            };
            match tokens? {
                FieldTokens::Literal(method, paths) => {
                    let literal = LiteralField::from_paths(f, method, paths, &mut tree_candidates)
                        .map_err(|source| CompileError::Literal {
                            field: f.name.clone(),
                            scoring: f.scoring.name(),
                            source,
                        })?;
                    field.literal = Some(literal);
                }
                FieldTokens::Codes(code_ids) => {
                    field.candidate_index = code_ids
                        .iter()
                        .map(|&id| {
                            candidates.iter().position(|&c| c == id).unwrap_or_else(|| {
                                candidates.push(id);
                                candidates.len() - 1
                            })
                        })
                        .collect();
                    field.codes = (0..f.choices.len()).map(code).collect();
                    field.code_ids = code_ids;
                }
            }
            fields.push(field);
        }
        Ok(CompiledSchema {
            schema: schema.clone(),
            fields,
            candidates,
            tree_candidates,
            schema_hash: schema.hash(),
            tokenizer_identity: tok.identity().to_string(),
            schema_tokens,
        })
    }

    pub fn schema(&self) -> &Schema {
        &self.schema
    }
    pub fn fields(&self) -> &[CompiledField] {
        &self.fields
    }
    /// Union of every field's code ids (first-seen order): the only head rows ever projected.
    pub fn candidates(&self) -> &[u32] {
        &self.candidates
    }
    /// Union of the tokens the literal fields' trees project (empty without literal fields).
    pub fn tree_candidates(&self) -> &[u32] {
        &self.tree_candidates
    }
    /// Per field, its literal compilation (None for a code field).
    pub fn literal_fields(&self) -> Vec<Option<&LiteralField>> {
        self.fields.iter().map(|f| f.literal.as_ref()).collect()
    }
    /// What stage 5 needs to score this schema's literal fields.
    pub fn tree_plan(&self) -> TreePlan<'_> {
        TreePlan {
            fields: self.literal_fields(),
            candidates: self.tree_candidates(),
            logsumexp: self.needs_tree_logsumexp(),
        }
    }
    /// True when some field needs the full-vocabulary logsumexp along its paths.
    pub fn needs_tree_logsumexp(&self) -> bool {
        self.fields
            .iter()
            .filter_map(|f| f.literal.as_ref())
            .any(|l| l.method.needs_full_vocabulary())
    }
    pub fn selectors(&self) -> Vec<String> {
        self.fields.iter().map(|f| f.selector.clone()).collect()
    }
    /// Tokens every prompt of this schema has at least, whatever the context: a bound below
    /// it can never be met (stage 2 refuses such a context before tokenizing it).
    pub fn schema_tokens(&self) -> usize {
        self.schema_tokens
    }
    pub fn tokenizer_identity(&self) -> &str {
        &self.tokenizer_identity
    }
    pub fn schema_hash(&self) -> &str {
        &self.schema_hash
    }
    /// Schema fields in order (descriptions included), for rendering.
    pub fn schema_fields(&self) -> &[Field] {
        self.schema.fields()
    }
}

/// Tokens a real context's prompt has, at least, beyond the schema's: the probe context's
/// own tokens are taken off the probe prompt's count, and this many more for the merges a
/// context can make with the text around it ("Context:\n" before, "\n\nFields:" after: a BPE
/// merge never crosses more than a few characters there). A context is never empty, so a
/// schema refused here could fit no context; one within this margin is checked exactly per
/// context (stage 2).
pub const CONTEXT_BOUNDARY_SLACK: usize = 8;

/// Tokens of the probe prompt less the probe context's own and [`CONTEXT_BOUNDARY_SLACK`]: no
/// prompt of this schema has fewer.
fn schema_tokens(tok: &ChatTokenizer, anchored: &AnchoredPrompt) -> Result<usize, CompileError> {
    let prompt = anchored.prompt_len()?;
    let probe = tok.encode(PROBE_CONTEXT)?.len();
    Ok(prompt.saturating_sub(probe + CONTEXT_BOUNDARY_SLACK))
}

/// What follows one field's selector: its code ids, or its choices' token paths.
enum FieldTokens {
    Codes(Vec<u32>),
    Literal(LiteralMethod, Vec<Vec<u32>>),
}

/// Field `f`'s tokens after its selector `sel`, whose tail tokens are `sel_tail` (`last`: the
/// schema's last field, whose JSON value closes the object).
fn field_tokens(
    anchored: &AnchoredPrompt,
    f: &Field,
    sel: &str,
    sel_tail: &[u32],
    last: bool,
) -> Result<FieldTokens, CompileError> {
    if let Some(method) = f.scoring.literal_method() {
        let paths = literal_paths(anchored, sel, sel_tail, f, last).map_err(|source| {
            CompileError::Literal {
                field: f.name.clone(),
                scoring: f.scoring.name(),
                source,
            }
        })?;
        return Ok(FieldTokens::Literal(method, paths));
    }
    (0..f.choices.len())
        .map(|i| single_code_token(anchored, sel, sel_tail, f, i))
        .collect::<Result<_, _>>()
        .map(FieldTokens::Codes)
}

/// The id of code `i` of field `f`, checked to be exactly one token right after the selector:
/// the prompt's tail with the selector and the code must be the selector's tail tokens and one
/// more (with the shared head before both, the whole prompt's tokens).
fn single_code_token(
    anchored: &AnchoredPrompt,
    sel: &str,
    sel_tail: &[u32],
    f: &Field,
    i: usize,
) -> Result<u32, CompileError> {
    let text = code_text(i);
    let with_code = anchored.tail_ids(&format!("{sel}{text}"))?;
    if !with_code.starts_with(sel_tail) {
        return Err(CompileError::CodeMergesWithSelector {
            field: f.name.clone(),
            code: text,
            selector: sel.to_string(),
        });
    }
    match &with_code[sel_tail.len()..] {
        [id] => Ok(*id),
        rest => Err(CompileError::CodeNotSingleToken {
            field: f.name.clone(),
            code: text,
            selector: sel.to_string(),
            tokens: rest.len(),
        }),
    }
}
