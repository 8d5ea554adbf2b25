//! Batch records: one raw input line in, a validated [`Request`] (or a [`LineError`]) out; one
//! decision (or error) in, one output JSON line out.
//!
//! Input line (strict JSON, duplicate keys rejected), keys:
//! - `id` (required): a string or an integer, unique within the file;
//! - `context`: the text to classify (required unless the job has a shared `--context`, and
//!   refused when it has one);
//! - at most one of `schema` (an inline schema object), `schema_file` (a path, relative to the
//!   input file's folder) or `question` (a yes/no question, scored as the one boolean field
//!   `answer`); none → the job's default `--schema-file`.
//!
//! Output line: `{"id", "line", "output", "fields", "temperature", "telemetry", "provenance"}`
//! for a decision, `{"id", "line", "error": {"kind", "message"}, "provenance"}` for an error.
//! `line` is the 1-based input line number; output lines come in input order.

pub use super::item::{ErrorKind, Failed, LineError, RawLine, Request, SchemaRef};
use super::openai::LineFormat;
use crate::bounds::{leading_key, BYTES_PER_TOKEN, LINE_SLACK_BYTES};
use crate::result::{result_json, Layout, RecordKey};
use forkscore_engine::strict_json::{parse_strict, StrictJsonError};
use forkscore_engine::Decision;
use serde_json::{json, Map, Value};
use std::path::PathBuf;

/// Keys an input line may have.
pub const INPUT_KEYS: &str = "id, context, schema, schema_file, question";

/// The schema of a yes/no question.
pub fn question_schema(question: &str) -> Value {
    json!({"answer": {"type": "boolean", "description": question}})
}

/// Parse one input line (without its newline). `shared_context`: the job supplies the context.
pub fn parse_line(line: u64, bytes: &[u8], shared_context: bool) -> Result<Request, Failed> {
    let fail = |id: Option<Value>, kind, message: String| Failed {
        line,
        id,
        error: LineError::new(kind, message),
    };
    let text = std::str::from_utf8(bytes).map_err(|e| {
        fail(
            None,
            ErrorKind::InvalidUtf8,
            format!("line is not valid UTF-8 ({e})"),
        )
    })?;
    let value = parse_strict(text).map_err(|e| {
        // A repeated key inside the inline schema is a schema error of a line whose id can
        // still be read (a lenient parse keeps the last value of the repeated key).
        if let StrictJsonError::DuplicateKey { path, .. } = &e {
            if path == "schema" || path.starts_with("schema.") {
                let id = serde_json::from_str::<Value>(text)
                    .ok()
                    .and_then(|v| v.get("id").cloned())
                    .filter(|id| id.is_string() || id.is_u64() || id.is_i64());
                return fail(id, ErrorKind::InvalidSchema, format!("invalid schema: {e}"));
            }
        }
        fail(
            None,
            ErrorKind::InvalidJson,
            format!("line is not valid JSON: {e}"),
        )
    })?;
    let Value::Object(mut obj) = value else {
        return Err(fail(
            None,
            ErrorKind::NotAnObject,
            "line must be a JSON object".into(),
        ));
    };
    let id = match obj.remove("id") {
        None | Some(Value::Null) => {
            let hint = if super::openai::looks_like_openai(&obj) {
                "; this looks like an OpenAI Batch API line (custom_id, method, url, body); use --format openai"
            } else {
                ""
            };
            return Err(fail(
                None,
                ErrorKind::MissingId,
                format!("line has no \"id\"{hint}"),
            ));
        }
        Some(v @ Value::String(_)) => v,
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Value::Number(n),
        Some(other) => {
            return Err(fail(
                None,
                ErrorKind::InvalidId,
                format!("\"id\" must be a string or an integer, got {other}"),
            ))
        }
    };
    let fail = |kind, message: String| fail(Some(id.clone()), kind, message);
    if let Some(key) = obj.keys().find(|k| {
        !matches!(
            k.as_str(),
            "context" | "schema" | "schema_file" | "question"
        )
    }) {
        return Err(fail(
            ErrorKind::UnknownKey,
            format!("unknown key {key:?} (allowed: {INPUT_KEYS})"),
        ));
    }
    let string = |obj: &mut Map<String, Value>, key: &str| match obj.remove(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(fail(
            ErrorKind::InvalidField,
            format!("{key:?} must be a string, got {other}"),
        )),
    };
    let context = string(&mut obj, "context")?;
    match (&context, shared_context) {
        (Some(_), true) => {
            return Err(fail(
                ErrorKind::UnexpectedContext,
                "this job has a shared --context/--context-file; lines must not bring their own"
                    .into(),
            ))
        }
        (None, false) => {
            return Err(fail(
                ErrorKind::MissingContext,
                "line has no \"context\"".into(),
            ))
        }
        _ => {}
    }
    let schema_file = string(&mut obj, "schema_file")?;
    let question = string(&mut obj, "question")?;
    let inline = obj.remove("schema");
    let schema = match (inline, schema_file, question) {
        (None, None, None) => SchemaRef::Default,
        (Some(v @ Value::Object(_)), None, None) => SchemaRef::Inline(v),
        (Some(other), None, None) => {
            return Err(fail(
                ErrorKind::InvalidField,
                format!("\"schema\" must be an object, got {other}"),
            ))
        }
        (None, Some(f), None) => SchemaRef::File(PathBuf::from(f)),
        (None, None, Some(q)) if q.trim().is_empty() => {
            return Err(fail(
                ErrorKind::InvalidField,
                "\"question\" is empty".into(),
            ))
        }
        (None, None, Some(q)) => SchemaRef::Question(q),
        _ => {
            return Err(fail(
                ErrorKind::ConflictingSchema,
                "give at most one of \"schema\", \"schema_file\" and \"question\"".into(),
            ))
        }
    };
    Ok(Request {
        line,
        id,
        context,
        schema,
    })
}

/// Parse a raw line, or the error record of a line that was over the byte bound (with the id
/// found in its first bytes, when there is one).
pub fn parse_bounded(
    raw: &RawLine,
    shared_context: bool,
    format: LineFormat,
) -> Result<Request, Failed> {
    let id_key = match format {
        LineFormat::Native => "id",
        LineFormat::Openai => "custom_id",
    };
    match raw.too_long {
        Some(n) => Err(Failed {
            line: raw.line,
            id: leading_key(&raw.bytes, id_key),
            error: LineError::new(
                ErrorKind::LineTooLong,
                format!(
                    "line is {n} bytes, over the limit derived from --max-input-tokens ({BYTES_PER_TOKEN} bytes per token, 3x for JSON escapes, plus {LINE_SLACK_BYTES} for the schema); it was neither stored nor tokenized"
                ),
            ),
        }),
        None => match format {
            LineFormat::Native => parse_line(raw.line, &raw.bytes, shared_context),
            LineFormat::Openai => super::openai::parse_line(raw.line, &raw.bytes),
        },
    }
}

/// The output record of a decision: the one result builder ([`crate::result::result_json`])
/// with the record's `id` and `line` first; `extra` holds batch-level facts (e.g. a reused
/// prefix), placed before `provenance`.
pub fn decision_value(
    id: &Value,
    line: u64,
    decision: &Decision,
    provenance: Value,
    extra: Option<(&str, Value)>,
) -> Value {
    let layout = Layout {
        record: Some(RecordKey { id, line }),
        extra: extra.into_iter().collect(),
    };
    result_json(decision, layout, provenance)
}

/// The output record of an error.
pub fn error_value(failed: &Failed, provenance: Value) -> Value {
    json!({
        "id": failed.id.clone().unwrap_or(Value::Null),
        "line": failed.line,
        "error": {"kind": failed.error.kind, "message": failed.error.message},
        "provenance": provenance,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(bytes: &[u8], shared: bool) -> ErrorKind {
        parse_line(1, bytes, shared).unwrap_err().error.kind
    }

    #[test]
    fn a_duplicate_key_inside_the_schema_keeps_the_id() {
        let e = parse_line(
            4,
            br#"{"id": "x", "context": "c", "schema": {"a": {"type": "boolean"}, "a": {"type": "boolean"}}}"#,
            false,
        )
        .unwrap_err();
        assert_eq!(e.id, Some(serde_json::json!("x")));
        assert_eq!(e.error.kind, ErrorKind::InvalidSchema);
        let e = parse_line(5, br#"{"id": "y", "id": "z", "context": "c"}"#, false).unwrap_err();
        assert_eq!(e.error.kind, ErrorKind::InvalidJson);
    }

    #[test]
    fn lines_parse_into_requests_or_typed_errors() {
        let r = parse_line(
            3,
            br#"{"id": 7, "context": "x", "question": "Is it?"}"#,
            false,
        )
        .unwrap();
        assert_eq!(
            (r.line, r.id, r.schema),
            (3, json!(7), SchemaRef::Question("Is it?".into()))
        );
        assert_eq!(
            parse_line(1, br#"{"id": "a", "context": "x"}"#, false)
                .unwrap()
                .schema,
            SchemaRef::Default
        );
        assert_eq!(kind(b"\xff\xfe", false), ErrorKind::InvalidUtf8);
        assert_eq!(kind(b"{\"id\": 1,", false), ErrorKind::InvalidJson);
        assert_eq!(
            kind(br#"{"id": 1, "id": 2, "context": "x"}"#, false),
            ErrorKind::InvalidJson
        );
        assert_eq!(kind(b"[1]", false), ErrorKind::NotAnObject);
        assert_eq!(kind(br#"{"context": "x"}"#, false), ErrorKind::MissingId);
        let openai = parse_line(
            1,
            br#"{"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {}}"#,
            false,
        )
        .unwrap_err();
        assert_eq!(openai.error.kind, ErrorKind::MissingId);
        assert!(
            openai.error.message.contains(
                "this looks like an OpenAI Batch API line (custom_id, method, url, body); use --format openai"
            ),
            "{}",
            openai.error.message
        );
        assert_eq!(
            kind(br#"{"id": 1.5, "context": "x"}"#, false),
            ErrorKind::InvalidId
        );
        assert_eq!(
            kind(br#"{"id": 1, "context": "x", "extra": 1}"#, false),
            ErrorKind::UnknownKey
        );
        assert_eq!(kind(br#"{"id": 1}"#, false), ErrorKind::MissingContext);
        assert_eq!(
            kind(br#"{"id": 1, "context": "x"}"#, true),
            ErrorKind::UnexpectedContext
        );
        assert_eq!(
            kind(
                br#"{"id": 1, "context": "x", "schema": {}, "question": "q"}"#,
                false
            ),
            ErrorKind::ConflictingSchema
        );
        assert_eq!(
            kind(br#"{"id": 1, "context": 5}"#, false),
            ErrorKind::InvalidField
        );
        assert_eq!(
            parse_line(9, br#"{"id": "k", "context": 5}"#, false)
                .unwrap_err()
                .id,
            Some(json!("k"))
        );
    }
}
