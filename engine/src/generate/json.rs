//! The text side of the autoregressive baseline: when a generated JSON object is complete
//! ([`JsonScan`], the stop rule) and whether it answers the schema ([`validate`]).
//!
//! Both are pure functions of text, tested without a model.

use crate::schema::Field;
use crate::strict_json::parse_strict;
use indexmap::IndexMap;
use serde::Serialize;
use serde_json::Value;

/// Incremental brace scanner: fed the generated text piece by piece, it says when the first
/// JSON object closes (brace depth back to 0). Text before the first `{` is ignored; inside
/// the object, braces within strings do not count and `\` escapes the next character of a
/// string (so `"\""` and `"\\"` are handled). Only the ASCII structure matters, so feeding
/// each token's own decoded text (a partial UTF-8 character decodes to U+FFFD) is exact.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JsonScan {
    depth: usize,
    started: bool,
    in_string: bool,
    escape: bool,
    closed: bool,
}

impl JsonScan {
    /// Feed the next piece of text; true once the object has closed (and from then on).
    pub fn feed(&mut self, piece: &str) -> bool {
        for c in piece.chars() {
            if self.closed {
                break;
            }
            if !self.started {
                if c == '{' {
                    self.started = true;
                    self.depth = 1;
                }
                continue;
            }
            if self.in_string {
                if self.escape {
                    self.escape = false;
                } else if c == '\\' {
                    self.escape = true;
                } else if c == '"' {
                    self.in_string = false;
                }
                continue;
            }
            match c {
                '"' => self.in_string = true,
                '{' => self.depth += 1,
                '}' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        self.closed = true;
                    }
                }
                _ => {}
            }
        }
        self.closed
    }

    /// True once the first object has closed.
    pub fn closed(&self) -> bool {
        self.closed
    }

    /// Byte length of the first complete object's prefix in `text` (up to and including its
    /// closing brace), or `None` when it never closes.
    pub fn object_end(text: &str) -> Option<usize> {
        let mut scan = JsonScan::default();
        for (i, c) in text.char_indices() {
            let mut buf = [0u8; 4];
            if scan.feed(c.encode_utf8(&mut buf)) {
                return Some(i + c.len_utf8());
            }
        }
        None
    }
}

/// One field of a generated answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GeneratedField {
    /// What the object held for the field (absent: `null`).
    pub value: Option<Value>,
    /// True when the value is one of the field's choices (a JSON boolean for a boolean field).
    pub valid: bool,
}

/// Whether a generated text answers the schema.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Validation {
    /// The text is one JSON object (whitespace and one markdown code fence around it are
    /// allowed), every field is present with one of its choices, and there is no other key.
    pub valid: bool,
    /// Every problem found, in order (empty when valid).
    pub problems: Vec<String>,
    /// Per field of the schema, in schema order.
    pub fields: IndexMap<String, GeneratedField>,
}

/// Check a generated `text` against `fields` (see [`Validation::valid`]).
pub fn validate(text: &str, fields: &[Field]) -> Validation {
    let mut problems = Vec::new();
    let object = locate_object(text, &mut problems);
    let parsed = object.and_then(|o| match parse_strict(o) {
        Ok(Value::Object(map)) => Some(map),
        Ok(_) => {
            problems.push("the JSON value is not an object".into());
            None
        }
        Err(e) => {
            problems.push(format!("the object is not valid JSON: {e}"));
            None
        }
    });
    let mut out = IndexMap::new();
    for f in fields {
        let value = parsed.as_ref().and_then(|m| m.get(&f.name)).cloned();
        let valid = match &value {
            None => {
                if parsed.is_some() {
                    problems.push(format!("field `{}` is missing", f.name));
                }
                false
            }
            Some(v) => {
                let ok = f.choices.iter().any(|c| c.to_json() == *v);
                if !ok {
                    problems.push(format!(
                        "field `{}`: {} is not one of its choices",
                        f.name,
                        short(v)
                    ));
                }
                ok
            }
        };
        out.insert(f.name.clone(), GeneratedField { value, valid });
    }
    if let Some(map) = &parsed {
        for key in map.keys() {
            if !fields.iter().any(|f| &f.name == key) {
                problems.push(format!("unexpected key `{key}`"));
            }
        }
    }
    Validation {
        valid: problems.is_empty(),
        problems,
        fields: out,
    }
}

/// The object's text inside `text`: leading whitespace and an opening code fence (```` ``` ````
/// or ```` ```json ````) may precede it, whitespace and a closing fence may follow it; anything
/// else is a problem (the object is still returned when it closes, so its fields are reported).
fn locate_object<'a>(text: &'a str, problems: &mut Vec<String>) -> Option<&'a str> {
    let mut rest = text.trim_start();
    if let Some(r) = rest.strip_prefix("```") {
        let r = r.strip_prefix("json").unwrap_or(r);
        rest = r.trim_start();
    }
    let Some(start) = rest.find('{') else {
        problems.push(if text.trim().is_empty() {
            "nothing was generated".into()
        } else {
            "no JSON object in the text".into()
        });
        return None;
    };
    if start > 0 {
        problems.push(format!(
            "text before the object: {}",
            short(&Value::String(rest[..start].to_string()))
        ));
    }
    let body = &rest[start..];
    let Some(end) = JsonScan::object_end(body) else {
        problems.push("truncated: the JSON object never closes".into());
        return None;
    };
    let after = body[end..].trim();
    let after = after.strip_suffix("```").unwrap_or(after).trim();
    if !after.is_empty() {
        problems.push(format!(
            "extra text after the object: {}",
            short(&Value::String(after.to_string()))
        ));
    }
    Some(&body[..end])
}

/// A value's JSON text, cut to 60 characters.
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        format!("{}…", s.chars().take(60).collect::<String>())
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Schema;

    fn fields() -> Vec<Field> {
        Schema::from_json_str(
            r#"{"risk": {"type": "enum", "choices": ["low", "high"]}, "review": {"type": "boolean"}}"#,
        )
        .unwrap()
        .fields()
        .to_vec()
    }

    fn scan_all(pieces: &[&str]) -> Option<usize> {
        let mut s = JsonScan::default();
        pieces.iter().position(|p| s.feed(p))
    }

    #[test]
    fn stop_when_brace_depth_returns_to_zero() {
        assert_eq!(
            scan_all(&["{\"a\":", " {\"b\": 1}", ", \"c\": 2", "}", "x"]),
            Some(3)
        );
        assert_eq!(scan_all(&["Sure:\n```json\n", "{", "}"]), Some(2));
        assert_eq!(scan_all(&["no object } here", "still none"]), None);
        assert_eq!(scan_all(&["{\"a\": {", "}"]), None);
        assert_eq!(scan_all(&["{}"]), Some(0));
    }

    #[test]
    fn braces_inside_strings_and_escapes_do_not_count() {
        assert_eq!(scan_all(&["{\"a\": \"}\"", "}"]), Some(1));
        assert_eq!(scan_all(&["{\"a\": \"{{\"", "}"]), Some(1));
        // an escaped quote keeps the string open, so the brace after it is inside the string
        assert_eq!(scan_all(&["{\"a\": \"x\\\"}", "\"}"]), Some(1));
        // an escaped backslash closes nothing: the quote after it ends the string
        assert_eq!(scan_all(&["{\"a\": \"x\\\\\"", "}"]), Some(1));
        // an escape split across pieces
        assert_eq!(scan_all(&["{\"a\": \"\\", "\"}", "\"}"]), Some(2));
        assert_eq!(JsonScan::object_end("{\"k\": \"é}\"} tail"), Some(12));
    }

    #[test]
    fn a_valid_answer_is_valid() {
        let v = validate("{\"risk\": \"high\", \"review\": false}", &fields());
        assert!(v.valid, "{:?}", v.problems);
        assert_eq!(v.fields["risk"].value, Some(Value::from("high")));
        assert_eq!(v.fields["review"].value, Some(Value::from(false)));
        let fenced = validate(
            "```json\n{\n  \"risk\": \"low\",\n  \"review\": true\n}\n```",
            &fields(),
        );
        assert!(fenced.valid, "{:?}", fenced.problems);
    }

    #[test]
    fn missing_field_wrong_value_and_unexpected_key_are_named() {
        let v = validate("{\"risk\": \"high\"}", &fields());
        assert!(!v.valid);
        assert_eq!(v.problems, vec!["field `review` is missing"]);
        assert!(v.fields["risk"].valid && !v.fields["review"].valid);
        let v = validate(
            "{\"risk\": \"medium\", \"review\": \"yes\", \"x\": 1}",
            &fields(),
        );
        assert!(!v.valid);
        assert_eq!(
            v.problems,
            vec![
                "field `risk`: \"medium\" is not one of its choices",
                "field `review`: \"yes\" is not one of its choices",
                "unexpected key `x`",
            ]
        );
        // a boolean written as a string is not a boolean
        let v = validate("{\"risk\": \"low\", \"review\": \"true\"}", &fields());
        assert!(!v.valid && !v.fields["review"].valid);
    }

    #[test]
    fn truncated_extra_text_and_garbage_are_invalid() {
        let v = validate("{\"risk\": \"high\", \"rev", &fields());
        assert!(!v.valid);
        assert_eq!(v.problems, vec!["truncated: the JSON object never closes"]);
        assert_eq!(v.fields["risk"].value, None);
        let v = validate("{\"risk\": \"high\", \"review\": true} and more", &fields());
        assert!(!v.valid);
        assert_eq!(
            v.problems,
            vec!["extra text after the object: \"and more\""]
        );
        assert!(
            v.fields["risk"].valid,
            "the object's fields are still reported"
        );
        let v = validate(
            "Here it is: {\"risk\": \"high\", \"review\": true}",
            &fields(),
        );
        assert!(!v.valid);
        assert!(v.problems[0].starts_with("text before the object"));
        let v = validate("lorem ipsum", &fields());
        assert_eq!(v.problems, vec!["no JSON object in the text"]);
        let v = validate("", &fields());
        assert_eq!(v.problems, vec!["nothing was generated"]);
        let v = validate("{\"risk\": high}", &fields());
        assert!(v.problems[0].starts_with("the object is not valid JSON"));
        let v = validate(
            "{\"risk\": \"low\", \"risk\": \"high\", \"review\": true}",
            &fields(),
        );
        assert!(v.problems[0].contains("duplicate key"), "{:?}", v.problems);
    }
}
