//! OpenAI Batch API lines (`forkscore batch --format openai`): an input line of the OpenAI
//! Batch API in, a validated [`Request`] (or a [`Failed`]) out; a native output record in, the
//! OpenAI batch output line out. See docs/batch.md ("OpenAI Batch API files").
//!
//! Input: `{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {"model",
//! "messages", "response_format": {"type": "json_schema", "json_schema": {"name", "schema"}},
//! …}}`. The mapping onto a native line (which has no instruction field):
//! - `custom_id` → `id` (a string, as the Batch API requires);
//! - the text of every `system`, `developer` and `user` message, in order, joined by a blank
//!   line → `context` (forkscore's prompt brings its own fixed instructions; what the caller's
//!   system message says is kept as part of the text being classified, never dropped);
//!   `assistant` / `tool` / `function` messages are refused (nothing is generated);
//! - `response_format.json_schema.schema` → the inline `schema` (the engine's JSON Schema form:
//!   an object whose properties are string enums or booleans; anything else is an
//!   `invalid_schema` error naming the property); no `response_format` → the job's default
//!   schema, as a native line without one;
//! - every other body key (`model`, `temperature`, `max_tokens`, `seed`, …) is accepted and not
//!   used: the loaded model scores every allowed value rather than sampling one.
//!
//! Output: the shape mirrors the service's `POST /v1/chat/completions` route (a
//! `chat.completion` whose `choices[0].message.content` is the decision as a JSON string, with
//! the per-field probabilities in the `forkscore` extension field); the two are built
//! separately for now, so a change to one must be made to the other. Each output line also
//! carries a top-level `forkscore` object with the input `line` and the record's `provenance`,
//! which `--resume`, `--shard` and `forkscore merge` read ([`record_line`], [`record_id`],
//! [`record_provenance_mut`]).

use super::item::{ErrorKind, Failed, LineError, Request, SchemaRef};
use forkscore_engine::strict_json::parse_strict;
use serde_json::{json, Map, Value};

/// Which line format a batch job reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LineFormat {
    /// forkscore's own lines (`id`, `context`, `schema` …) and records.
    #[default]
    Native,
    /// OpenAI Batch API lines in (`custom_id`, `body` with a chat request), OpenAI batch
    /// output lines out (`custom_id`, `response`, `error`).
    Openai,
}

/// The only endpoint an OpenAI batch line may name.
pub const CHAT_COMPLETIONS_URL: &str = "/v1/chat/completions";

/// Keys an OpenAI batch input line may have.
pub const INPUT_KEYS: &str = "custom_id, method, url, body";

/// True when a line without `id` looks like an OpenAI Batch API line: the hint for a line read
/// in the native format.
pub fn looks_like_openai(obj: &Map<String, Value>) -> bool {
    obj.contains_key("custom_id") && (obj.contains_key("body") || obj.contains_key("url"))
}

/// Parse one OpenAI Batch API input line (without its newline).
pub fn parse_line(line: u64, bytes: &[u8]) -> Result<Request, Failed> {
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
    let id = match obj.remove("custom_id") {
        None | Some(Value::Null) => {
            let hint = if obj.contains_key("id") && obj.contains_key("context") {
                "; this looks like a native forkscore line: drop --format openai"
            } else {
                ""
            };
            return Err(fail(
                None,
                ErrorKind::MissingId,
                format!("line has no \"custom_id\"{hint}"),
            ));
        }
        Some(v @ Value::String(_)) => v,
        Some(other) => {
            return Err(fail(
                None,
                ErrorKind::InvalidId,
                format!("\"custom_id\" must be a string, got {other}"),
            ))
        }
    };
    let fail = |kind, message: String| fail(Some(id.clone()), kind, message);
    if let Some(key) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "method" | "url" | "body"))
    {
        return Err(fail(
            ErrorKind::UnknownKey,
            format!("unknown key {key:?} (allowed: {INPUT_KEYS})"),
        ));
    }
    match obj.get("method") {
        None => {}
        Some(Value::String(m)) if m.eq_ignore_ascii_case("POST") => {}
        Some(other) => {
            return Err(fail(
                ErrorKind::InvalidField,
                format!("\"method\" must be \"POST\", got {other}"),
            ))
        }
    }
    match obj.get("url") {
        None => {}
        Some(Value::String(u)) if u == CHAT_COMPLETIONS_URL => {}
        Some(other) => {
            return Err(fail(
                ErrorKind::InvalidField,
                format!("\"url\" must be \"{CHAT_COMPLETIONS_URL}\" (the only endpoint forkscore batch answers), got {other}"),
            ))
        }
    }
    let body = match obj.remove("body") {
        Some(Value::Object(b)) => b,
        None => return Err(fail(ErrorKind::InvalidField, "line has no \"body\"".into())),
        Some(other) => {
            return Err(fail(
                ErrorKind::InvalidField,
                format!("\"body\" must be an object, got {other}"),
            ))
        }
    };
    let context = context_of(&body).map_err(|(kind, m)| fail(kind, m))?;
    let schema = schema_of(&body).map_err(|m| fail(ErrorKind::InvalidField, m))?;
    Ok(Request {
        line,
        id,
        context: Some(context),
        schema,
    })
}

/// The context of a chat request: system, developer and user texts in order, blank-line joined.
fn context_of(body: &Map<String, Value>) -> Result<String, (ErrorKind, String)> {
    let invalid = |m: String| (ErrorKind::InvalidField, m);
    let messages = match body.get("messages") {
        Some(Value::Array(m)) => m,
        None => return Err(invalid("\"body\" has no \"messages\"".into())),
        Some(other) => {
            return Err(invalid(format!(
                "\"body.messages\" must be an array, got {other}"
            )))
        }
    };
    let mut parts = Vec::new();
    let mut users = 0usize;
    for (i, m) in messages.iter().enumerate() {
        let at = format!("body.messages[{i}]");
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("{at} has no string \"role\"")))?;
        match role {
            "system" | "developer" => {}
            "user" => users += 1,
            other => {
                return Err(invalid(format!(
                    "{at}: role {other:?} is not supported; forkscore classifies the text of system, developer and user messages and generates nothing"
                )))
            }
        }
        parts.push(message_text(m.get("content"), &at).map_err(invalid)?);
    }
    if users == 0 {
        return Err((
            ErrorKind::MissingContext,
            "\"body.messages\" has no user message (its text is the context to classify)".into(),
        ));
    }
    Ok(parts.join("\n\n"))
}

/// A message's text: a string, or an array of `{"type": "text", "text": …}` parts (joined by
/// a newline); any other part type is refused.
fn message_text(content: Option<&Value>, at: &str) -> Result<String, String> {
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => texts.push(t),
                    (Some("text"), None) => {
                        return Err(format!("{at}.content[{j}] has no string \"text\""))
                    }
                    (other, _) => {
                        return Err(format!(
                            "{at}.content[{j}]: part type {} is not supported (text only)",
                            other.map_or("(none)".to_string(), |t| format!("{t:?}"))
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        None | Some(Value::Null) => Err(format!("{at} has no \"content\"")),
        Some(other) => Err(format!(
            "{at}.content must be a string or an array of text parts, got {other}"
        )),
    }
}

/// The schema of a chat request: `response_format.json_schema.schema`, else the job's default.
fn schema_of(body: &Map<String, Value>) -> Result<SchemaRef, String> {
    let Some(format) = body.get("response_format") else {
        return Ok(SchemaRef::Default);
    };
    let ty = format.get("type").and_then(Value::as_str);
    if ty != Some("json_schema") {
        return Err(format!(
            "\"body.response_format.type\" must be \"json_schema\" (an object of enum / boolean properties), got {}",
            format.get("type").map_or("nothing".into(), Value::to_string)
        ));
    }
    match format.get("json_schema").and_then(|j| j.get("schema")) {
        Some(s @ Value::Object(_)) => Ok(SchemaRef::Inline(s.clone())),
        Some(other) => Err(format!(
            "\"body.response_format.json_schema.schema\" must be an object, got {other}"
        )),
        None => Err("\"body.response_format.json_schema\" has no \"schema\"".into()),
    }
}

/// The OpenAI batch output line of a native output record (a decision or an error record, as
/// [`super::records`] builds them). `created` is the Unix time stamped on completions.
pub fn output_line(native: Value, created: u64) -> Value {
    let Value::Object(mut rec) = native else {
        return native;
    };
    let line = rec.remove("line").unwrap_or(Value::Null);
    let custom_id = rec.remove("id").unwrap_or(Value::Null);
    let provenance = rec.remove("provenance").unwrap_or(Value::Null);
    let n = line.as_u64().unwrap_or(0);
    let meta = json!({"line": line, "provenance": provenance});
    if let Some(error) = rec.remove("error") {
        return json!({
            "id": format!("batch_req_{n}"),
            "custom_id": custom_id,
            "response": null,
            "error": {"code": error.get("kind").cloned().unwrap_or(Value::Null),
                      "message": error.get("message").cloned().unwrap_or(Value::Null)},
            "forkscore": meta,
        });
    }
    let output = rec.remove("output").unwrap_or(Value::Null);
    let prompt_tokens = rec
        .get("telemetry")
        .and_then(|t| t.get("prefix_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let model = meta["provenance"]
        .get("model_id")
        .cloned()
        .unwrap_or(Value::Null);
    // what is left of the native record: fields (probabilities), temperature, telemetry, …
    let extension = Value::Object(rec);
    json!({
        "id": format!("batch_req_{n}"),
        "custom_id": custom_id,
        "response": {
            "status_code": 200,
            "request_id": format!("req_{n}"),
            "body": {
                "id": format!("chatcmpl-{n}"),
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": output.to_string(), "refusal": null},
                    "logprobs": null,
                    "finish_reason": "stop",
                }],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens},
                "forkscore": extension,
            },
        },
        "error": null,
        "forkscore": meta,
    })
}

/// True for an OpenAI-shaped output record.
fn is_openai_record(v: &Value) -> bool {
    v.get("custom_id").is_some() && v.get("forkscore").is_some_and(Value::is_object)
}

/// The input line number of an output record of either format.
pub fn record_line(v: &Value) -> Option<u64> {
    if is_openai_record(v) {
        v["forkscore"].get("line").and_then(Value::as_u64)
    } else {
        v.get("line").and_then(Value::as_u64)
    }
}

/// The input id of an output record of either format (null when it had none).
pub fn record_id(v: &Value) -> Value {
    let key = if is_openai_record(v) {
        "custom_id"
    } else {
        "id"
    };
    v.get(key).cloned().unwrap_or(Value::Null)
}

/// The provenance of an output record of either format.
pub fn record_provenance(v: &Value) -> Option<&Map<String, Value>> {
    if is_openai_record(v) {
        v["forkscore"].get("provenance")
    } else {
        v.get("provenance")
    }
    .and_then(Value::as_object)
}

/// [`record_provenance`], mutable (`forkscore merge` removes the shard from it).
pub fn record_provenance_mut(v: &mut Value) -> Option<&mut Map<String, Value>> {
    let holder = if is_openai_record(v) {
        v.get_mut("forkscore")?
    } else {
        v
    };
    holder.get_mut("provenance").and_then(Value::as_object_mut)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(body: Value) -> Vec<u8> {
        json!({"custom_id": "r1", "method": "POST", "url": CHAT_COMPLETIONS_URL, "body": body})
            .to_string()
            .into_bytes()
    }

    fn err(bytes: &[u8]) -> (ErrorKind, String) {
        let f = parse_line(2, bytes).unwrap_err();
        (f.error.kind, f.error.message)
    }

    #[test]
    fn a_chat_request_maps_onto_a_native_request() {
        let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}});
        let r = parse_line(
            4,
            &line(json!({"model": "gpt-4o-mini", "temperature": 0,
                "messages": [{"role": "system", "content": "Classify the ticket."},
                             {"role": "user", "content": [{"type": "text", "text": "It is down."},
                                                          {"type": "text", "text": "Help."}]}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": schema}}})),
        )
        .unwrap();
        assert_eq!(r.line, 4);
        assert_eq!(r.id, json!("r1"));
        assert_eq!(
            r.context.as_deref(),
            Some("Classify the ticket.\n\nIt is down.\nHelp.")
        );
        assert_eq!(r.schema, SchemaRef::Inline(schema));
        let r = parse_line(
            1,
            &line(json!({"messages": [{"role": "user", "content": "x"}]})),
        )
        .unwrap();
        assert_eq!(r.schema, SchemaRef::Default);
    }

    #[test]
    fn bad_lines_are_typed_errors_that_name_what_is_wrong() {
        let user = json!([{"role": "user", "content": "x"}]);
        let cases: Vec<(Vec<u8>, ErrorKind, &str)> = vec![
            (
                br#"{"id": 1, "context": "x"}"#.to_vec(),
                ErrorKind::MissingId,
                "native",
            ),
            (
                br#"{"custom_id": 5, "body": {}}"#.to_vec(),
                ErrorKind::InvalidId,
                "string",
            ),
            (
                br#"{"custom_id": "a", "body": {}, "extra": 1}"#.to_vec(),
                ErrorKind::UnknownKey,
                "extra",
            ),
            (
                br#"{"custom_id": "a", "url": "/v1/embeddings", "body": {}}"#.to_vec(),
                ErrorKind::InvalidField,
                "/v1/chat/completions",
            ),
            (line(json!({})), ErrorKind::InvalidField, "messages"),
            (
                line(json!({"messages": [{"role": "system", "content": "s"}]})),
                ErrorKind::MissingContext,
                "no user message",
            ),
            (
                line(json!({"messages": [{"role": "assistant", "content": "s"}]})),
                ErrorKind::InvalidField,
                "messages[0]: role \"assistant\"",
            ),
            (
                line(json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})),
                ErrorKind::InvalidField,
                "content[0]",
            ),
            (
                line(json!({"messages": user, "response_format": {"type": "json_object"}})),
                ErrorKind::InvalidField,
                "json_schema",
            ),
        ];
        for (bytes, kind, needle) in cases {
            let (k, m) = err(&bytes);
            assert_eq!(k, kind, "{m}");
            assert!(m.contains(needle), "{needle}: {m}");
        }
    }

    #[test]
    fn records_convert_to_the_batch_output_shape_and_stay_readable() {
        let prov = json!({"model_id": "m", "shard": "0/2"});
        let decision = json!({"id": "r1", "line": 3, "output": {"ok": true},
            "fields": {"ok": {"scores": {"false": 0.25, "true": 0.75}}},
            "telemetry": {"prefix_tokens": 40}, "provenance": prov});
        let mut out = output_line(decision, 7);
        assert_eq!(out["custom_id"], "r1");
        assert_eq!(out["error"], Value::Null);
        let body = &out["response"]["body"];
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["model"], "m");
        let content = body["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(content).unwrap(),
            json!({"ok": true})
        );
        assert_eq!(body["forkscore"]["fields"]["ok"]["scores"]["true"], 0.75);
        assert_eq!(body["usage"]["prompt_tokens"], 40);
        assert_eq!((record_line(&out), record_id(&out)), (Some(3), json!("r1")));
        record_provenance_mut(&mut out).unwrap().remove("shard");
        assert_eq!(record_provenance(&out).unwrap().len(), 1);

        let error = json!({"id": null, "line": 9, "error": {"kind": "invalid_json", "message": "bad"},
            "provenance": {}});
        let out = output_line(error, 7);
        assert_eq!(out["response"], Value::Null);
        assert_eq!(
            out["error"],
            json!({"code": "invalid_json", "message": "bad"})
        );
        assert_eq!((record_line(&out), record_id(&out)), (Some(9), Value::Null));
        // native records read the same way
        let native = json!({"id": 4, "line": 2, "provenance": {"a": 1}});
        assert_eq!(
            (record_line(&native), record_id(&native)),
            (Some(2), json!(4))
        );
    }
}
