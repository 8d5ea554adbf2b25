//! Schema parsing: raw JSON (the flat form or the JSON Schema form) in, a validated
//! [`Schema`] out. Nothing downstream ever sees unvalidated schema JSON.
//!
//! Rules: an enum has 1–26 distinct non-empty string choices (code scoring) or up to
//! [`MAX_LITERAL_CHOICES`] with literal-choice scoring (`"scoring"` on the field, at the schema
//! root, or the caller's default: [`Schema::from_json_str_with`]); `"json"` scoring is all
//! fields or none; a boolean defaults to
//! `[false, true]` and explicit `"choices": [true, false]` reverses that order; selected booleans
//! stay JSON booleans while score keys are `"false"`/`"true"`; `choice_descriptions` keys must
//! all be choices; field order is the schema's order; a schema holds at most
//! [`MAX_SCHEMA_BYTES`] (checked first, before anything else reads it). Every rejection names
//! the JSON path of the offending value and the rule it breaks.

mod fields;

use crate::strict_json::{parse_strict, StrictJsonError};
use fields::{is_json_schema, parse_flat_field, parse_json_schema};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::fmt;

/// Most choices a code-scored field may have: one single-token code letter (A–Z) each.
pub const MAX_CHOICES: usize = 26;

/// Most choices a literal-scored field may have (each choice's text is tokenized at compile).
pub const MAX_LITERAL_CHOICES: usize = 4096;

/// Most bytes a schema may have: its JSON text ([`Schema::from_json_str`]), or the text it holds
/// (every key and string: field names, descriptions, choices, choice descriptions) when it
/// arrives already parsed ([`Schema::from_value`]). Checked before anything else, so nothing of
/// a larger schema is ever rendered or tokenized. 1 MiB is about 250,000 tokens of English, far
/// over any prompt a model scores.
pub const MAX_SCHEMA_BYTES: usize = 1 << 20;

/// How a field's choices are scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum Scoring {
    /// Each choice gets a one-token code (`A`, `B`, …); one projection right after the selector.
    #[default]
    #[serde(rename = "code")]
    Code,
    /// The choice's own text, scored token by token over the trie of all choices.
    #[serde(rename = "literal")]
    Literal(LiteralMethod),
    /// The field's JSON value, scored token by token as `"literal"` scores a choice's text, in
    /// the prompt that asks for one JSON object (the generation baseline's prompt): the row
    /// is `{\n  "name":` and each choice continues it with ` <value>` and what follows it
    /// (`,`, or `\n}` after the last field). Schema-wide: the prompt is one for all
    /// fields, so a schema scores every field this way or none.
    #[serde(rename = "json")]
    Json,
}

/// What a literal-scored field's probability is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LiteralMethod {
    /// The probability that a decoder constrained to the choices emits this choice: the product,
    /// along its trie path, of softmax(logits / T) over each branching node's children
    /// (`"literal"`).
    #[default]
    Exact,
    /// softmax over choices of the first token's logit only; choices sharing a first token
    /// share its probability equally (`"literal-first-token"`, as classifiers that score
    /// one token per label do).
    FirstToken,
    /// softmax over choices of the sum of each path token's unconstrained (full-vocabulary)
    /// log-probability (`"literal-sum-loglik"`, the multiple-choice log-likelihood of
    /// evaluation harnesses).
    SumLoglik,
    /// As [`LiteralMethod::SumLoglik`], divided by the path's token count
    /// (`"literal-mean-loglik"`, length-normalised).
    MeanLoglik,
}

impl LiteralMethod {
    /// True for the methods that need the full-vocabulary log-softmax along every path.
    pub fn needs_full_vocabulary(self) -> bool {
        matches!(self, LiteralMethod::SumLoglik | LiteralMethod::MeanLoglik)
    }
}

impl Scoring {
    /// The schema spelling (`"code"`, `"literal"`, `"literal-first-token"`).
    pub fn name(self) -> &'static str {
        match self {
            Scoring::Code => "code",
            Scoring::Literal(LiteralMethod::Exact) => "literal",
            Scoring::Literal(LiteralMethod::FirstToken) => "literal-first-token",
            Scoring::Literal(LiteralMethod::SumLoglik) => "literal-sum-loglik",
            Scoring::Literal(LiteralMethod::MeanLoglik) => "literal-mean-loglik",
            Scoring::Json => "json",
        }
    }

    /// How a field scored by its choices' tokens turns them into a probability (None for code
    /// letters): `json` fields take the constrained decoder's probability, as `"literal"`.
    pub fn literal_method(self) -> Option<LiteralMethod> {
        match self {
            Scoring::Code => None,
            Scoring::Literal(m) => Some(m),
            Scoring::Json => Some(LiteralMethod::Exact),
        }
    }

    /// Every accepted spelling, for error messages.
    pub const NAMES: &'static str = "\"code\", \"literal\", \"literal-first-token\", \"literal-sum-loglik\", \"literal-mean-loglik\", \"json\"";

    /// Most choices a field scored this way may have.
    pub fn max_choices(self) -> usize {
        match self {
            Scoring::Code => MAX_CHOICES,
            Scoring::Literal(_) | Scoring::Json => MAX_LITERAL_CHOICES,
        }
    }
}

impl std::str::FromStr for Scoring {
    type Err = String;
    fn from_str(s: &str) -> Result<Scoring, String> {
        match s {
            "code" => Ok(Scoring::Code),
            "literal" => Ok(Scoring::Literal(LiteralMethod::Exact)),
            "literal-first-token" => Ok(Scoring::Literal(LiteralMethod::FirstToken)),
            "literal-sum-loglik" => Ok(Scoring::Literal(LiteralMethod::SumLoglik)),
            "literal-mean-loglik" => Ok(Scoring::Literal(LiteralMethod::MeanLoglik)),
            "json" => Ok(Scoring::Json),
            other => Err(format!(
                "unknown scoring {other:?} (expected {})",
                Scoring::NAMES
            )),
        }
    }
}

/// A validated schema: fields in the schema's order.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    fields: Vec<Field>,
}

/// One enum or boolean field.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: String,
    pub description: Option<String>,
    pub kind: FieldKind,
    /// Allowed values, in the order the codes A, B, C… are assigned.
    pub choices: Vec<Choice>,
    /// Per choice (same order), its optional description.
    pub choice_descriptions: Vec<Option<String>>,
    pub scoring: Scoring,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum FieldKind {
    Enum,
    Boolean,
}

/// One allowed value: a string (enum) or a boolean.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    Str(String),
    Bool(bool),
}

impl Choice {
    /// The string used as a key in score maps and in prompts (`"true"`/`"false"` for booleans).
    pub fn key(&self) -> String {
        match self {
            Choice::Str(s) => s.clone(),
            Choice::Bool(b) => b.to_string(),
        }
    }
    /// The typed JSON value (booleans stay JSON booleans).
    pub fn to_json(&self) -> Value {
        match self {
            Choice::Str(s) => Value::String(s.clone()),
            Choice::Bool(b) => Value::Bool(*b),
        }
    }
}

/// A schema rejection: where, and which rule.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("schema error at `{path}`: {kind}")]
pub struct SchemaError {
    /// JSON path of the offending value (`<root>` for the whole schema).
    pub path: String,
    pub kind: SchemaErrorKind,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchemaErrorKind {
    #[error("{0}")]
    Json(StrictJsonError),
    #[error("a schema must be a JSON object, found {found}")]
    NotAnObject { found: &'static str },
    #[error("the schema has no fields")]
    Empty,
    #[error("unknown key `{key}` (allowed: {allowed})")]
    UnknownKey { key: String, allowed: &'static str },
    #[error("a field must be a JSON object, found {found}")]
    FieldNotAnObject { found: &'static str },
    #[error("invalid field name {name:?}: {reason}")]
    InvalidFieldName { name: String, reason: &'static str },
    #[error("missing `type` (expected \"enum\" or \"boolean\")")]
    MissingType,
    #[error("`type` must be a string, found {found}")]
    TypeNotString { found: &'static str },
    #[error("nested objects are not supported: only flat enum and boolean fields can be scored")]
    NestedObject,
    #[error("arrays are not supported: only enum and boolean fields can be scored")]
    Array,
    #[error("{ty} fields are not supported: only enum and boolean fields can be scored")]
    Number { ty: String },
    #[error("a string field needs an `enum` of choices: free text cannot be scored")]
    StringWithoutEnum,
    #[error("null fields are not supported")]
    Null,
    #[error("unknown type {ty:?} (expected \"enum\" or \"boolean\")")]
    UnknownType { ty: String },
    #[error("an enum field needs `{key}`: a list of 1–26 string choices")]
    MissingChoices { key: &'static str },
    #[error("`{key}` must be an array, found {found}")]
    ChoicesNotArray {
        key: &'static str,
        found: &'static str,
    },
    #[error("an enum needs at least 1 choice")]
    NoChoices,
    #[error("{count} choices exceed the limit of 26 single-token codes (A–Z); literal-choice scoring (\"scoring\": \"literal\") lifts this limit")]
    TooManyChoices { count: usize },
    #[error("{count} choices exceed the limit of {max} for literal-choice scoring")]
    TooManyLiteralChoices { count: usize, max: usize },
    #[error("`scoring` must be one of {expected}, found {found}")]
    BadScoring {
        expected: &'static str,
        found: String,
    },
    #[error("this field is scored {scoring:?} but field {json_field:?} is scored \"json\": json scoring asks for the whole answer as one JSON object, so every field of a schema must use it or none (set \"scoring\": \"json\" at the schema root, or --scoring json)")]
    MixedJsonScoring {
        json_field: String,
        scoring: &'static str,
    },
    #[error("enum choices must be strings, found {found}")]
    ChoiceNotString { found: &'static str },
    #[error("enum choices must be non-empty strings")]
    EmptyChoice,
    #[error("duplicate choice {choice:?}")]
    DuplicateChoice { choice: String },
    #[error("boolean choices must be exactly [false, true] or [true, false]")]
    BadBooleanChoices,
    #[error("`description` must be a string, found {found}")]
    DescriptionNotString { found: &'static str },
    #[error("`choice_descriptions` must be an object mapping choices to strings, found {found}")]
    ChoiceDescriptionsNotObject { found: &'static str },
    #[error("`choice_descriptions` key {key:?} is not one of the choices ({choices})")]
    ChoiceDescriptionUnknown { key: String, choices: String },
    #[error("a choice description must be a string, found {found}")]
    ChoiceDescriptionNotString { found: &'static str },
    #[error("`properties` must be an object, found {found}")]
    PropertiesNotObject { found: &'static str },
    #[error("`required` must be an array of property names")]
    RequiredNotNames,
    #[error("`required` names {name:?}, which is not a property")]
    RequiredUnknown { name: String },
    #[error("{key} must be {expected}")]
    BadAnnotation {
        key: &'static str,
        expected: &'static str,
    },
    #[error("the schema is {bytes} bytes, over the limit of {max} bytes; it is refused before anything is tokenized")]
    TooLarge { bytes: usize, max: usize },
    #[error("the schema's text passes the limit of {max} bytes here ({bytes} bytes of keys and strings up to and including this one); it is refused before anything is tokenized")]
    TextTooLarge { bytes: usize, max: usize },
}

pub(crate) fn err(path: impl Into<String>, kind: SchemaErrorKind) -> SchemaError {
    SchemaError {
        path: path.into(),
        kind,
    }
}

/// `json` scoring renders the whole prompt as a request for one JSON object, so it is all
/// fields or none: the first field that differs from the first `json` field is named.
/// `field_path` is what comes before a field's name in an error's path.
fn check_json_scoring(fields: &[Field], field_path: &str) -> Result<(), SchemaError> {
    let Some(json) = fields.iter().find(|f| f.scoring == Scoring::Json) else {
        return Ok(());
    };
    match fields.iter().find(|f| f.scoring != Scoring::Json) {
        None => Ok(()),
        Some(other) => Err(err(
            format!("{field_path}{}.scoring", other.name),
            SchemaErrorKind::MixedJsonScoring {
                json_field: json.name.clone(),
                scoring: other.scoring.name(),
            },
        )),
    }
}

pub(crate) fn parse_scoring(text: &str, path: &str) -> Result<Scoring, SchemaError> {
    text.parse().map_err(|_| {
        err(
            path,
            SchemaErrorKind::BadScoring {
                expected: Scoring::NAMES,
                found: format!("{text:?}"),
            },
        )
    })
}

pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Schema {
    /// Parse schema text, rejecting duplicate keys (a repeated field name included).
    pub fn from_json_str(text: &str) -> Result<Schema, SchemaError> {
        Schema::from_json_str_with(text, Scoring::Code)
    }

    /// [`Schema::from_json_str`] with a request-level default scoring for every field that
    /// names none (a schema-root `"scoring"` overrides the default; a field's own overrides both).
    pub fn from_json_str_with(text: &str, default: Scoring) -> Result<Schema, SchemaError> {
        if text.len() > MAX_SCHEMA_BYTES {
            return Err(err(
                "<root>",
                SchemaErrorKind::TooLarge {
                    bytes: text.len(),
                    max: MAX_SCHEMA_BYTES,
                },
            ));
        }
        let value = parse_strict(text).map_err(|e| {
            let path = match &e {
                StrictJsonError::DuplicateKey { path, .. } => path.clone(),
                StrictJsonError::Syntax { .. } => "<root>".to_string(),
            };
            err(path, SchemaErrorKind::Json(e))
        })?;
        Schema::from_value_with(&value, default)
    }

    /// Validate an already parsed JSON value (duplicate keys can no longer be seen here).
    pub fn from_value(value: &Value) -> Result<Schema, SchemaError> {
        Schema::from_value_with(value, Scoring::Code)
    }

    /// [`Schema::from_value`] with a request-level default scoring (see [`Schema::from_json_str_with`]).
    pub fn from_value_with(value: &Value, default: Scoring) -> Result<Schema, SchemaError> {
        check_text_bytes(value)?;
        let root = value.as_object().ok_or_else(|| {
            err(
                "<root>",
                SchemaErrorKind::NotAnObject {
                    found: type_name(value),
                },
            )
        })?;
        // A string `scoring` at the root is the schema-wide default, never a field.
        let default = match root.get("scoring") {
            Some(Value::String(s)) => parse_scoring(s, "scoring")?,
            _ => default,
        };
        let fields = if is_json_schema(root) {
            parse_json_schema(root, default)?
        } else {
            root.iter()
                .filter(|(name, spec)| !(name.as_str() == "scoring" && spec.is_string()))
                .map(|(name, spec)| parse_flat_field(name, spec, default))
                .collect::<Result<Vec<_>, _>>()?
        };
        if fields.is_empty() {
            return Err(err("<root>", SchemaErrorKind::Empty));
        }
        let field_path = if is_json_schema(root) {
            "properties."
        } else {
            ""
        };
        check_json_scoring(&fields, field_path)?;
        Ok(Schema { fields })
    }

    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// The schema in the flat canonical form (field order kept).
    pub fn to_canonical_json(&self) -> Value {
        let mut root = Map::new();
        for f in &self.fields {
            let mut spec = Map::new();
            spec.insert(
                "type".into(),
                serde_json::to_value(f.kind).unwrap_or(Value::Null),
            );
            spec.insert(
                "choices".into(),
                Value::Array(f.choices.iter().map(Choice::to_json).collect()),
            );
            if let Some(d) = &f.description {
                spec.insert("description".into(), Value::String(d.clone()));
            }
            let cd: Map<String, Value> = f
                .choices
                .iter()
                .zip(&f.choice_descriptions)
                .filter_map(|(c, d)| d.as_ref().map(|d| (c.key(), Value::String(d.clone()))))
                .collect();
            if !cd.is_empty() {
                spec.insert("choice_descriptions".into(), Value::Object(cd));
            }
            // Code-scored schemas keep the hash they had before literal scoring existed.
            if f.scoring != Scoring::Code {
                spec.insert("scoring".into(), Value::String(f.scoring.name().into()));
            }
            root.insert(f.name.clone(), Value::Object(spec));
        }
        Value::Object(root)
    }

    /// SHA-256 of the canonical form: equal schemas written differently hash the same.
    pub fn hash(&self) -> String {
        let text = self.to_canonical_json().to_string();
        hex::encode(Sha256::digest(text.as_bytes()))
    }
}

/// Refuse a parsed schema holding more than [`MAX_SCHEMA_BYTES`] of keys and strings, naming the
/// path of the string that passes the limit (a walk in document order, no copies).
fn check_text_bytes(value: &Value) -> Result<(), SchemaError> {
    fn walk(v: &Value, path: &mut String, total: &mut usize) -> Result<(), SchemaError> {
        let over = |path: &str, total: usize| {
            err(
                if path.is_empty() { "<root>" } else { path },
                SchemaErrorKind::TextTooLarge {
                    bytes: total,
                    max: MAX_SCHEMA_BYTES,
                },
            )
        };
        match v {
            Value::String(s) => {
                *total += s.len();
                if *total > MAX_SCHEMA_BYTES {
                    return Err(over(path, *total));
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    walk(item, path, total)?;
                    path.truncate(len);
                }
            }
            Value::Object(map) => {
                for (k, item) in map {
                    let len = path.len();
                    if !path.is_empty() {
                        path.push('.');
                    }
                    // a key past any field name's length is named by its start only
                    match k.char_indices().nth(128) {
                        Some((end, _)) => path.push_str(&format!("{}…", &k[..end])),
                        None => path.push_str(k),
                    }
                    *total += k.len();
                    if *total > MAX_SCHEMA_BYTES {
                        return Err(over(path, *total));
                    }
                    walk(item, path, total)?;
                    path.truncate(len);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
        Ok(())
    }
    walk(value, &mut String::new(), &mut 0)
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key())
    }
}
