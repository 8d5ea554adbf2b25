//! The two field forms of a schema (flat, and JSON Schema `properties`), parsed field by field
//! into [`Field`]s; every rejection names its JSON path and rule.

use super::{
    err, parse_scoring, type_name, Choice, Field, FieldKind, SchemaError, SchemaErrorKind, Scoring,
};
use serde_json::{Map, Value};

const FLAT_FIELD_KEYS: &str = "type, choices, description, choice_descriptions, scoring";
const JSON_SCHEMA_ROOT_KEYS: &str =
    "type, properties, required, title, description, additionalProperties, $schema, $id, scoring";
const JSON_SCHEMA_FIELD_KEYS: &str = "type, enum, description, title, choice_descriptions, scoring";

/// The JSON Schema form has `"type": "object"` at the root, or a `properties` object of field
/// specs. A flat field that happens to be named `properties` has a string `type` of its own.
pub(super) fn is_json_schema(root: &Map<String, Value>) -> bool {
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

pub(super) fn parse_json_schema(
    root: &Map<String, Value>,
    default: Scoring,
) -> Result<Vec<Field>, SchemaError> {
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
            "scoring" => {
                if !v.is_string() {
                    return Err(err(
                        "scoring",
                        SchemaErrorKind::BadScoring {
                            expected: Scoring::NAMES,
                            found: type_name(v).to_string(),
                        },
                    ));
                }
            }
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
        .map(|(name, spec)| {
            parse_json_schema_field(name, spec, &format!("properties.{name}"), default)
        })
        .collect()
}

fn parse_json_schema_field(
    name: &str,
    spec: &Value,
    path: &str,
    default: Scoring,
) -> Result<Field, SchemaError> {
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
            "scoring",
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
    let scoring = field_scoring(obj, path, default)?;
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
                    parse_enum_choices(e, "enum", &format!("{path}.enum"), scoring)?,
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
        scoring,
    })
}

pub(super) fn parse_flat_field(
    name: &str,
    spec: &Value,
    default: Scoring,
) -> Result<Field, SchemaError> {
    let path = name;
    let obj = field_object(name, spec, path, &["enum", "boolean", "string"])?;
    check_keys(
        obj,
        path,
        &[
            "type",
            "choices",
            "description",
            "choice_descriptions",
            "scoring",
        ],
        FLAT_FIELD_KEYS,
    )?;
    let ty = field_type(obj, path)?.ok_or_else(|| err(path, SchemaErrorKind::MissingType))?;
    let description = parse_description(obj, path)?;
    let scoring = field_scoring(obj, path, default)?;
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
                parse_enum_choices(c, "choices", &choices_path, scoring)?,
            ),
        },
        "boolean" => match obj.get("choices") {
            None => (FieldKind::Boolean, default_bool_choices()),
            Some(c) => (FieldKind::Boolean, parse_bool_choices(c, &choices_path)?),
        },
        "string" if obj.contains_key("choices") => (
            FieldKind::Enum,
            parse_enum_choices(&obj["choices"], "choices", &choices_path, scoring)?,
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
        scoring,
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

/// The field's own `scoring`, else `default`.
fn field_scoring(
    obj: &Map<String, Value>,
    path: &str,
    default: Scoring,
) -> Result<Scoring, SchemaError> {
    let path = format!("{path}.scoring");
    match obj.get("scoring") {
        None => Ok(default),
        Some(Value::String(s)) => parse_scoring(s, &path),
        Some(other) => Err(err(
            path,
            SchemaErrorKind::BadScoring {
                expected: Scoring::NAMES,
                found: type_name(other).to_string(),
            },
        )),
    }
}

fn parse_enum_choices(
    v: &Value,
    key: &'static str,
    path: &str,
    scoring: Scoring,
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
    if arr.len() > scoring.max_choices() {
        let count = arr.len();
        let kind = match scoring {
            Scoring::Code => SchemaErrorKind::TooManyChoices { count },
            Scoring::Literal(_) | Scoring::Json => SchemaErrorKind::TooManyLiteralChoices {
                count,
                max: scoring.max_choices(),
            },
        };
        return Err(err(path, kind));
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
