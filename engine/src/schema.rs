//! Schema parsing: raw JSON (the seeds' flat form or the JSON Schema form) in, a validated
//! [`Schema`] out. Nothing downstream ever sees unvalidated schema JSON.
//!
//! Rules (seed 000): an enum has 1–26 distinct non-empty string choices; a boolean defaults to
//! `[false, true]` and explicit `"choices": [true, false]` reverses that order; selected booleans
//! stay JSON booleans while score keys are `"false"`/`"true"`; `choice_descriptions` keys must
//! all be choices; field order is the schema's order. Every rejection names the JSON path of the
//! offending value and the rule it breaks.

use crate::strict_json::{parse_strict, StrictJsonError};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::fmt;

/// Most choices a code-scored field may have: one single-token code letter (A–Z) each.
pub const MAX_CHOICES: usize = 26;

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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
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
    #[error("{count} choices exceed the limit of 26 single-token codes (A–Z); literal-choice scoring lifts this limit")]
    TooManyChoices { count: usize },
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
}

fn err(path: impl Into<String>, kind: SchemaErrorKind) -> SchemaError {
    SchemaError {
        path: path.into(),
        kind,
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

const FLAT_FIELD_KEYS: &str = "type, choices, description, choice_descriptions";
const JSON_SCHEMA_ROOT_KEYS: &str =
    "type, properties, required, title, description, additionalProperties, $schema, $id";
const JSON_SCHEMA_FIELD_KEYS: &str = "type, enum, description, title, choice_descriptions";

impl Schema {
    /// Parse schema text, rejecting duplicate keys (a repeated field name included).
    pub fn from_json_str(text: &str) -> Result<Schema, SchemaError> {
        let value = parse_strict(text).map_err(|e| {
            let path = match &e {
                StrictJsonError::DuplicateKey { path, .. } => path.clone(),
                StrictJsonError::Syntax { .. } => "<root>".to_string(),
            };
            err(path, SchemaErrorKind::Json(e))
        })?;
        Schema::from_value(&value)
    }

    /// Validate an already parsed JSON value (duplicate keys can no longer be seen here).
    pub fn from_value(value: &Value) -> Result<Schema, SchemaError> {
        let root = value.as_object().ok_or_else(|| {
            err(
                "<root>",
                SchemaErrorKind::NotAnObject {
                    found: type_name(value),
                },
            )
        })?;
        let fields = if is_json_schema(root) {
            parse_json_schema(root)?
        } else {
            root.iter()
                .map(|(name, spec)| parse_flat_field(name, spec))
                .collect::<Result<Vec<_>, _>>()?
        };
        if fields.is_empty() {
            return Err(err("<root>", SchemaErrorKind::Empty));
        }
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

/// The JSON Schema form has `"type": "object"` at the root, or a `properties` object of field
/// specs. A flat field that happens to be named `properties` has a string `type` of its own.
fn is_json_schema(root: &Map<String, Value>) -> bool {
    if let Some(t) = root.get("type") {
        return t.as_str() == Some("object") || !t.is_object();
    }
    match root.get("properties") {
        Some(Value::Object(p)) => !p.get("type").is_some_and(Value::is_string),
        Some(_) => true,
        None => false,
    }
}

fn check_field_name(name: &str, path: &str) -> Result<(), SchemaError> {
    let bad = |reason| {
        err(
            path,
            SchemaErrorKind::InvalidFieldName {
                name: name.to_string(),
                reason,
            },
        )
    };
    if name.is_empty() {
        return Err(bad("field names must be non-empty"));
    }
    if name.trim() != name {
        return Err(bad("field names must not start or end with whitespace"));
    }
    if name.chars().any(char::is_control) {
        return Err(bad(
            "field names must not contain control characters (newlines, tabs…)",
        ));
    }
    if name.chars().count() > 128 {
        return Err(bad("field names are limited to 128 characters"));
    }
    Ok(())
}

fn parse_json_schema(root: &Map<String, Value>) -> Result<Vec<Field>, SchemaError> {
    for (key, v) in root {
        match key.as_str() {
            "type" => {
                if v.as_str() != Some("object") {
                    return Err(err(
                        "type",
                        SchemaErrorKind::BadAnnotation {
                            key: "`type` of a JSON Schema root",
                            expected: "\"object\"",
                        },
                    ));
                }
            }
            "properties" | "required" => {}
            "title" | "description" | "$schema" | "$id" => {
                if !v.is_string() {
                    return Err(err(
                        key.clone(),
                        SchemaErrorKind::BadAnnotation {
                            key: "this annotation",
                            expected: "a string",
                        },
                    ));
                }
            }
            "additionalProperties" => {
                if !v.is_boolean() {
                    return Err(err(
                        key.clone(),
                        SchemaErrorKind::BadAnnotation {
                            key: "`additionalProperties`",
                            expected: "a boolean (nested schemas are not supported)",
                        },
                    ));
                }
            }
            _ => {
                return Err(err(
                    key.clone(),
                    SchemaErrorKind::UnknownKey {
                        key: key.clone(),
                        allowed: JSON_SCHEMA_ROOT_KEYS,
                    },
                ))
            }
        }
    }
    let props = match root.get("properties") {
        None => return Err(err("<root>", SchemaErrorKind::Empty)),
        Some(Value::Object(p)) => p,
        Some(other) => {
            return Err(err(
                "properties",
                SchemaErrorKind::PropertiesNotObject {
                    found: type_name(other),
                },
            ))
        }
    };
    if let Some(req) = root.get("required") {
        let names = req
            .as_array()
            .ok_or_else(|| err("required", SchemaErrorKind::RequiredNotNames))?;
        for (i, n) in names.iter().enumerate() {
            let n = n
                .as_str()
                .ok_or_else(|| err(format!("required[{i}]"), SchemaErrorKind::RequiredNotNames))?;
            if !props.contains_key(n) {
                return Err(err(
                    format!("required[{i}]"),
                    SchemaErrorKind::RequiredUnknown {
                        name: n.to_string(),
                    },
                ));
            }
        }
    }
    props
        .iter()
        .map(|(name, spec)| parse_json_schema_field(name, spec, &format!("properties.{name}")))
        .collect()
}

fn parse_json_schema_field(name: &str, spec: &Value, path: &str) -> Result<Field, SchemaError> {
    let obj = field_object(name, spec, path, &["boolean", "string"])?;
    check_keys(
        obj,
        path,
        &[
            "type",
            "enum",
            "description",
            "title",
            "choice_descriptions",
        ],
        JSON_SCHEMA_FIELD_KEYS,
    )?;
    if let Some(t) = obj.get("title") {
        if !t.is_string() {
            return Err(err(
                format!("{path}.title"),
                SchemaErrorKind::BadAnnotation {
                    key: "`title`",
                    expected: "a string",
                },
            ));
        }
    }
    let ty = field_type(obj, path)?;
    let description = parse_description(obj, path)?;
    let (kind, choices) = match (ty, obj.get("enum")) {
        (Some("boolean"), None) => (FieldKind::Boolean, default_bool_choices()),
        (Some("boolean"), Some(e)) => (
            FieldKind::Boolean,
            parse_bool_choices(e, &format!("{path}.enum"))?,
        ),
        (None | Some("string"), Some(e)) => {
            if e.as_array()
                .is_some_and(|a| !a.is_empty() && a.iter().all(Value::is_boolean))
                && ty.is_none()
            {
                (
                    FieldKind::Boolean,
                    parse_bool_choices(e, &format!("{path}.enum"))?,
                )
            } else {
                (
                    FieldKind::Enum,
                    parse_enum_choices(e, "enum", &format!("{path}.enum"))?,
                )
            }
        }
        (Some("string"), None) => return Err(err(path, SchemaErrorKind::StringWithoutEnum)),
        (None, None) => return Err(err(path, SchemaErrorKind::MissingType)),
        (Some(other), _) => return Err(err(format!("{path}.type"), unsupported_type(other))),
    };
    let choice_descriptions = parse_choice_descriptions(obj, &choices, path)?;
    Ok(Field {
        name: name.to_string(),
        description,
        kind,
        choices,
        choice_descriptions,
    })
}

fn parse_flat_field(name: &str, spec: &Value) -> Result<Field, SchemaError> {
    let path = name;
    let obj = field_object(name, spec, path, &["enum", "boolean", "string"])?;
    check_keys(
        obj,
        path,
        &["type", "choices", "description", "choice_descriptions"],
        FLAT_FIELD_KEYS,
    )?;
    let ty = field_type(obj, path)?.ok_or_else(|| err(path, SchemaErrorKind::MissingType))?;
    let description = parse_description(obj, path)?;
    let choices_path = format!("{path}.choices");
    let (kind, choices) = match ty {
        "enum" => match obj.get("choices") {
            None => {
                return Err(err(
                    path,
                    SchemaErrorKind::MissingChoices { key: "choices" },
                ))
            }
            Some(c) => (
                FieldKind::Enum,
                parse_enum_choices(c, "choices", &choices_path)?,
            ),
        },
        "boolean" => match obj.get("choices") {
            None => (FieldKind::Boolean, default_bool_choices()),
            Some(c) => (FieldKind::Boolean, parse_bool_choices(c, &choices_path)?),
        },
        "string" if obj.contains_key("choices") => (
            FieldKind::Enum,
            parse_enum_choices(&obj["choices"], "choices", &choices_path)?,
        ),
        "string" => {
            return Err(err(
                format!("{path}.type"),
                SchemaErrorKind::StringWithoutEnum,
            ))
        }
        other => return Err(err(format!("{path}.type"), unsupported_type(other))),
    };
    let choice_descriptions = parse_choice_descriptions(obj, &choices, path)?;
    Ok(Field {
        name: name.to_string(),
        description,
        kind,
        choices,
        choice_descriptions,
    })
}

/// The checks every field starts with, in both forms: a valid name, an object, and a `type`
/// among `supported` when it is a string (an unsupported type is the clearer message than the
/// keys that come with it, such as `items` or `properties`).
fn field_object<'a>(
    name: &str,
    spec: &'a Value,
    path: &str,
    supported: &[&str],
) -> Result<&'a Map<String, Value>, SchemaError> {
    check_field_name(name, path)?;
    let obj = spec.as_object().ok_or_else(|| {
        err(
            path,
            SchemaErrorKind::FieldNotAnObject {
                found: type_name(spec),
            },
        )
    })?;
    if let Some(Value::String(t)) = obj.get("type") {
        if !supported.contains(&t.as_str()) {
            return Err(err(format!("{path}.type"), unsupported_type(t)));
        }
    }
    Ok(obj)
}

/// Reject any key of a field object outside `allowed`.
fn check_keys(
    obj: &Map<String, Value>,
    path: &str,
    allowed: &[&str],
    allowed_text: &'static str,
) -> Result<(), SchemaError> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(key) => Err(err(
            format!("{path}.{key}"),
            SchemaErrorKind::UnknownKey {
                key: key.clone(),
                allowed: allowed_text,
            },
        )),
        None => Ok(()),
    }
}

/// The field's `type`, if present (it must be a string).
fn field_type<'a>(obj: &'a Map<String, Value>, path: &str) -> Result<Option<&'a str>, SchemaError> {
    match obj.get("type") {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(other) => Err(err(
            format!("{path}.type"),
            SchemaErrorKind::TypeNotString {
                found: type_name(other),
            },
        )),
    }
}

fn unsupported_type(ty: &str) -> SchemaErrorKind {
    match ty {
        "object" => SchemaErrorKind::NestedObject,
        "array" => SchemaErrorKind::Array,
        "number" | "integer" => SchemaErrorKind::Number { ty: ty.to_string() },
        "null" => SchemaErrorKind::Null,
        _ => SchemaErrorKind::UnknownType { ty: ty.to_string() },
    }
}

fn default_bool_choices() -> Vec<Choice> {
    vec![Choice::Bool(false), Choice::Bool(true)]
}

fn parse_description(obj: &Map<String, Value>, path: &str) -> Result<Option<String>, SchemaError> {
    match obj.get("description") {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(err(
            format!("{path}.description"),
            SchemaErrorKind::DescriptionNotString {
                found: type_name(other),
            },
        )),
    }
}

fn parse_enum_choices(
    v: &Value,
    key: &'static str,
    path: &str,
) -> Result<Vec<Choice>, SchemaError> {
    let arr = v.as_array().ok_or_else(|| {
        err(
            path,
            SchemaErrorKind::ChoicesNotArray {
                key,
                found: type_name(v),
            },
        )
    })?;
    if arr.is_empty() {
        return Err(err(path, SchemaErrorKind::NoChoices));
    }
    if arr.len() > MAX_CHOICES {
        return Err(err(
            path,
            SchemaErrorKind::TooManyChoices { count: arr.len() },
        ));
    }
    let mut out: Vec<Choice> = Vec::with_capacity(arr.len());
    for (i, c) in arr.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let s = c.as_str().ok_or_else(|| {
            err(
                &p,
                SchemaErrorKind::ChoiceNotString {
                    found: type_name(c),
                },
            )
        })?;
        if s.trim().is_empty() {
            return Err(err(&p, SchemaErrorKind::EmptyChoice));
        }
        let choice = Choice::Str(s.to_string());
        if out.contains(&choice) {
            return Err(err(
                &p,
                SchemaErrorKind::DuplicateChoice {
                    choice: s.to_string(),
                },
            ));
        }
        out.push(choice);
    }
    Ok(out)
}

fn parse_bool_choices(v: &Value, path: &str) -> Result<Vec<Choice>, SchemaError> {
    match v.as_array().map(Vec::as_slice) {
        Some([Value::Bool(a), Value::Bool(b)]) if a != b => {
            Ok(vec![Choice::Bool(*a), Choice::Bool(*b)])
        }
        Some([Value::Bool(a), Value::Bool(b)]) if a == b => Err(err(
            path,
            SchemaErrorKind::DuplicateChoice {
                choice: a.to_string(),
            },
        )),
        _ => Err(err(path, SchemaErrorKind::BadBooleanChoices)),
    }
}

fn parse_choice_descriptions(
    obj: &Map<String, Value>,
    choices: &[Choice],
    path: &str,
) -> Result<Vec<Option<String>>, SchemaError> {
    let mut out = vec![None; choices.len()];
    let Some(v) = obj.get("choice_descriptions") else {
        return Ok(out);
    };
    let path = format!("{path}.choice_descriptions");
    let map = v.as_object().ok_or_else(|| {
        err(
            &path,
            SchemaErrorKind::ChoiceDescriptionsNotObject {
                found: type_name(v),
            },
        )
    })?;
    let keys: Vec<String> = choices.iter().map(Choice::key).collect();
    for (k, d) in map {
        let p = format!("{path}.{k}");
        let idx = keys.iter().position(|c| c == k).ok_or_else(|| {
            err(
                &p,
                SchemaErrorKind::ChoiceDescriptionUnknown {
                    key: k.clone(),
                    choices: keys.join(", "),
                },
            )
        })?;
        let d = d.as_str().ok_or_else(|| {
            err(
                &p,
                SchemaErrorKind::ChoiceDescriptionNotString {
                    found: type_name(d),
                },
            )
        })?;
        out[idx] = Some(d.to_string());
    }
    Ok(out)
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key())
    }
}
