//! Row compilation: a validated [`Schema`] + tokenizer in, a [`CompiledSchema`] out — per field
//! its selector, suffix ids, and either its code token ids and their positions in the union of
//! candidate ids (code scoring) or its [`LiteralField`] (literal scoring: each choice's token
//! path, the choice trie, the projected positions and their index in the tree candidates).
//!
//! Context-independent: built once per (schema, tokenizer + template) and reused for every
//! context. Suffix ids are computed on a probe context; every real context's split is still
//! checked row by row (see `engine`), so a tokenizer that merges differently cannot go unseen.

use crate::literal::compile::{LiteralError, LiteralField};
use crate::prepare::render::{code, code_text, render_prefix, selector};
use crate::prepare::split::{split_exact, SplitError};
use crate::schema::{Choice, Field, FieldKind, Schema, Scoring};
use crate::template::TemplateError;
use crate::tokenizer::{ChatTokenizer, TokenizerError};

/// Probe context used to compile rows (any text works: suffixes do not depend on it).
const PROBE_CONTEXT: &str = "A short probe context used to compile rows.";

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
}

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Split(#[from] SplitError),
    #[error("field `{field}`: code {code:?} is {tokens} tokens after the selector {selector:?} with this tokenizer (it must be exactly one token); this tokenizer cannot use code scoring")]
    CodeNotSingleToken {
        field: String,
        code: String,
        selector: String,
        tokens: usize,
    },
    #[error("field `{field}` ({scoring} scoring): {source}")]
    Literal {
        field: String,
        scoring: &'static str,
        #[source]
        source: LiteralError,
    },
    #[error("field `{field}`: the code {code:?} merges with the selector {selector:?} when tokenized, so the prompt would not end where the code begins")]
    CodeMergesWithSelector {
        field: String,
        code: String,
        selector: String,
    },
}

impl CompiledSchema {
    pub fn compile(schema: &Schema, tok: &ChatTokenizer) -> Result<CompiledSchema, CompileError> {
        let prefix_text = render_prefix(tok.template(), PROBE_CONTEXT, schema.fields())?;
        let selectors: Vec<String> = schema.fields().iter().map(selector).collect();
        let split = split_exact(tok, &prefix_text, &selectors)?;
        let mut candidates: Vec<u32> = Vec::new();
        let mut tree_candidates: Vec<u32> = Vec::new();
        let mut fields = Vec::with_capacity(schema.fields().len());
        for ((f, sel), suffix) in schema.fields().iter().zip(selectors).zip(split.suffix_ids) {
            let full_ids = [split.prefix_ids.as_slice(), suffix.as_slice()].concat();
            if let Scoring::Literal(method) = f.scoring {
                let literal = LiteralField::compile(
                    tok,
                    &prefix_text,
                    &sel,
                    &full_ids,
                    f,
                    method,
                    &mut tree_candidates,
                )
                .map_err(|source| CompileError::Literal {
                    field: f.name.clone(),
                    scoring: f.scoring.name(),
                    source,
                })?;
                fields.push(CompiledField {
                    name: f.name.clone(),
                    kind: f.kind,
                    choices: f.choices.clone(),
                    scoring: f.scoring,
                    codes: Vec::new(),
                    code_ids: Vec::new(),
                    candidate_index: Vec::new(),
                    literal: Some(literal),
                    selector: sel,
                    suffix_ids: suffix,
                });
                continue;
            }
            let mut code_ids = Vec::with_capacity(f.choices.len());
            let mut candidate_index = Vec::with_capacity(f.choices.len());
            for i in 0..f.choices.len() {
                let id = single_code_token(tok, &prefix_text, &sel, &full_ids, f, i)?;
                let pos = candidates.iter().position(|&c| c == id).unwrap_or_else(|| {
                    candidates.push(id);
                    candidates.len() - 1
                });
                code_ids.push(id);
                candidate_index.push(pos);
            }
            fields.push(CompiledField {
                name: f.name.clone(),
                kind: f.kind,
                choices: f.choices.clone(),
                scoring: f.scoring,
                codes: (0..f.choices.len()).map(code).collect(),
                code_ids,
                candidate_index,
                literal: None,
                selector: sel,
                suffix_ids: suffix,
            });
        }
        Ok(CompiledSchema {
            schema: schema.clone(),
            fields,
            candidates,
            tree_candidates,
            schema_hash: schema.hash(),
            tokenizer_identity: tok.identity().to_string(),
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

/// The id of code `i` of field `f`, checked to be exactly one token right after the selector.
fn single_code_token(
    tok: &ChatTokenizer,
    prefix_text: &str,
    sel: &str,
    full_ids: &[u32],
    f: &Field,
    i: usize,
) -> Result<u32, CompileError> {
    let text = code_text(i);
    let with_code = tok.encode(&format!("{prefix_text}{sel}{text}"))?;
    if !with_code.starts_with(full_ids) {
        return Err(CompileError::CodeMergesWithSelector {
            field: f.name.clone(),
            code: text,
            selector: sel.to_string(),
        });
    }
    match &with_code[full_ids.len()..] {
        [id] => Ok(*id),
        rest => Err(CompileError::CodeNotSingleToken {
            field: f.name.clone(),
            code: text,
            selector: sel.to_string(),
            tokens: rest.len(),
        }),
    }
}
