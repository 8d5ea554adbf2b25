//! An OpenAI chat-completions body parsed once into a [`ChatRequest`]: the context to score, the
//! schema, the scoring options and the log-prob request. Unknown keys are refused (as OpenAI
//! refuses an unrecognized argument); every refusal is an [`ApiError`] whose `path` is the
//! OpenAI `param` (`messages[2].content`, `response_format.json_schema.schema.properties.x`).
//!
//! - **Context**: the text of every `system`, `developer` and `user` message, in order, joined by
//!   a blank line. forkscore has no separate instruction slot (its prompt is built from the
//!   schema), so an instruction in a system message is read by the model as part of the
//!   context rather than dropped. `assistant`, `tool` and `function` messages are refused:
//!   forkscore scores one conversation turn, it does not continue a dialogue.
//! - **Schema**: `response_format: {"type": "json_schema", "json_schema": {"name", "schema",
//!   "strict"?, "description"?}}`; `schema` must be a JSON Schema object
//!   (`{"type": "object", "properties": {...}}`) whose properties are enums or booleans — what
//!   forkscore's schema compiler accepts, with its error naming the property otherwise. Local
//!   `$ref`s to `$defs` (pydantic's enums) are inlined first ([`super::refs`]).
//! - **Sampling parameters** (`temperature`, `top_p`, `seed`, `max_tokens`,
//!   `max_completion_tokens`, `frequency_penalty`, `presence_penalty`, `stop`) and bookkeeping
//!   ones (`user`, `metadata`, `store`, `service_tier`) are type-checked and change nothing: no
//!   token is sampled. The probability temperature is `forkscore_options.temperature`.
//! - **Refused**: `stream: true`, `n` other than 1, tools and functions, `logit_bias`, audio.

use super::refs::inline_refs;
pub use super::refs::SCHEMA_PARAM;
use crate::config::ServeConfig;
use crate::error::ApiError;
use crate::request::{context_byte_bound, parse_body, parse_options, RequestOptions};
use axum::http::StatusCode;
use forkscore_engine::{Schema, ScoreOptions};
use serde_json::{Map, Value};

/// Most `top_logprobs` a request may ask for (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A validated chat-completions request.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub context: String,
    pub schema: Schema,
    pub options: ScoreOptions,
    /// `None`: no `logprobs` in the answer; `Some(k)`: `logprobs.content` with up to `k`
    /// `top_logprobs` per field.
    pub logprobs: Option<usize>,
}

/// Keys OpenAI defines that forkscore answers with a 400 naming them (when not null).
const UNSUPPORTED: &[&str] = &[
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "logit_bias",
    "audio",
    "modalities",
    "prediction",
    "web_search_options",
    "reasoning_effort",
];

fn bad(code: &'static str, param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::bad(code, param, message)
}

/// Parse one body; `served` is the id of the model this server serves (another `model` is a
/// 404 `model_not_found`).
pub fn parse(body: &[u8], cfg: &ServeConfig, served: &str) -> Result<ChatRequest, ApiError> {
    let Value::Object(mut obj) = parse_body(body)? else {
        return Err(bad(
            "invalid_type",
            "<root>",
            "the body must be a JSON object",
        ));
    };
    // null is absent, as in OpenAI's API
    obj.retain(|_, v| !v.is_null());
    let model = match obj.remove("model") {
        Some(Value::String(m)) => m,
        Some(_) => return Err(bad("invalid_type", "model", "model must be a string")),
        None => {
            return Err(bad(
                "missing_required_parameter",
                "model",
                format!("model is required (this server serves {served:?})"),
            ))
        }
    };
    if model != served {
        return Err(bad(
            "model_not_found",
            "model",
            format!(
                "The model {model:?} does not exist on this server; it serves {served:?} (GET /v1/models)"
            ),
        )
        .with_status(StatusCode::NOT_FOUND));
    }
    check_refused(&mut obj)?;
    let RequestOptions {
        score: options,
        scoring,
    } = parse_options(obj.remove("forkscore_options"), cfg).map_err(|mut e| {
        e.path = format!("forkscore_{}", e.path);
        e
    })?;
    let logprobs = parse_logprobs(obj.remove("logprobs"), obj.remove("top_logprobs"))?;
    let mut schema_value = parse_response_format(obj.remove("response_format"))?;
    inline_refs(&mut schema_value)?;
    let schema = Schema::from_value_with(&schema_value, scoring).map_err(|e| {
        let param = if e.path == "<root>" {
            SCHEMA_PARAM.to_string()
        } else {
            format!("{SCHEMA_PARAM}.{}", e.path)
        };
        bad("invalid_schema", param, e.kind.to_string())
    })?;
    let context = parse_messages(
        obj.remove("messages"),
        context_byte_bound(options.max_input_tokens),
    )?;
    check_ignored(&obj)?;
    Ok(ChatRequest {
        context,
        schema,
        options,
        logprobs,
    })
}

/// `stream`, `stream_options`, `n` and the [`UNSUPPORTED`] keys.
fn check_refused(obj: &mut Map<String, Value>) -> Result<(), ApiError> {
    if let Some(key) = UNSUPPORTED.iter().find(|k| obj.contains_key(**k)) {
        return Err(bad(
            "unsupported_parameter",
            *key,
            format!("{key} is not supported: forkscore returns a decision over the response_format schema, it does not generate"),
        ));
    }
    let stream = match obj.remove("stream") {
        None => false,
        Some(Value::Bool(b)) => b,
        Some(_) => return Err(bad("invalid_type", "stream", "stream must be a boolean")),
    };
    if stream {
        return Err(bad(
            "unsupported_parameter",
            "stream",
            "stream: true is not supported: the decision is one answer, sent whole (send stream: false or leave it out)",
        ));
    }
    if obj.remove("stream_options").is_some() {
        return Err(bad(
            "unsupported_parameter",
            "stream_options",
            "stream_options is only allowed with stream: true, which is not supported",
        ));
    }
    match obj.remove("n") {
        None => Ok(()),
        Some(v) if v.as_u64() == Some(1) => Ok(()),
        Some(v) => Err(bad(
            "unsupported_value",
            "n",
            format!("n must be 1 (got {v}): the decision is deterministic, one choice per request"),
        )),
    }
}

/// The keys that are type-checked and change nothing; anything else left is unknown.
fn check_ignored(obj: &Map<String, Value>) -> Result<(), ApiError> {
    for (key, v) in obj {
        let ok = match key.as_str() {
            "temperature" => v.as_f64().is_some_and(|t| (0.0..=2.0).contains(&t)),
            "top_p" => v.as_f64().is_some_and(|t| (0.0..=1.0).contains(&t)),
            "frequency_penalty" | "presence_penalty" => {
                v.as_f64().is_some_and(|t| (-2.0..=2.0).contains(&t))
            }
            "seed" => v.is_i64() || v.is_u64(),
            "max_tokens" | "max_completion_tokens" => v.as_u64().is_some_and(|n| n >= 1),
            "user" | "service_tier" => v.is_string(),
            "store" => v.is_boolean(),
            "metadata" => v.is_object(),
            "stop" => v.is_string() || v.as_array().is_some_and(|a| a.iter().all(Value::is_string)),
            _ => {
                return Err(bad(
                    "unknown_parameter",
                    key.clone(),
                    format!("Unrecognized request argument supplied: {key}"),
                ))
            }
        };
        if !ok {
            let rule = match key.as_str() {
                "temperature" => "a number from 0 to 2",
                "top_p" => "a number from 0 to 1",
                "frequency_penalty" | "presence_penalty" => "a number from -2 to 2",
                "seed" => "an integer",
                "max_tokens" | "max_completion_tokens" => "an integer >= 1",
                "store" => "a boolean",
                "metadata" => "an object",
                "stop" => "a string or an array of strings",
                _ => "a string",
            };
            return Err(bad(
                "invalid_value",
                key.clone(),
                format!("{key} must be {rule}"),
            ));
        }
    }
    Ok(())
}

fn parse_logprobs(logprobs: Option<Value>, top: Option<Value>) -> Result<Option<usize>, ApiError> {
    let on = match logprobs {
        None => false,
        Some(Value::Bool(b)) => b,
        Some(_) => {
            return Err(bad(
                "invalid_type",
                "logprobs",
                "logprobs must be a boolean",
            ))
        }
    };
    let top = match top {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|n| *n as usize <= MAX_TOP_LOGPROBS)
                .ok_or_else(|| {
                    bad(
                        "invalid_value",
                        "top_logprobs",
                        format!("top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}"),
                    )
                })? as usize,
        ),
    };
    match (on, top) {
        (false, Some(_)) => Err(bad(
            "invalid_value",
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        )),
        (false, None) => Ok(None),
        (true, k) => Ok(Some(k.unwrap_or(0))),
    }
}

/// The JSON Schema inside `response_format` (refusing every other response format).
fn parse_response_format(v: Option<Value>) -> Result<Value, ApiError> {
    const P: &str = "response_format";
    let mut rf = match v {
        Some(Value::Object(o)) => o,
        Some(_) => return Err(bad("invalid_type", P, "response_format must be an object")),
        None => return Err(bad(
            "missing_response_format",
            P,
            "response_format is required: forkscore decides the fields of a schema, so send response_format: {\"type\": \"json_schema\", \"json_schema\": {\"name\", \"schema\"}}",
        )),
    };
    match rf.remove("type") {
        Some(Value::String(t)) if t == "json_schema" => {}
        Some(Value::String(t)) => {
            return Err(bad(
                "unsupported_response_format",
                "response_format.type",
                format!("response_format.type {t:?} is not supported: only \"json_schema\" (an object whose properties are enums or booleans) can be decided"),
            ))
        }
        _ => {
            return Err(bad(
                "invalid_value",
                "response_format.type",
                "response_format.type must be \"json_schema\"",
            ))
        }
    }
    let mut js = match rf.remove("json_schema") {
        Some(Value::Object(o)) => o,
        Some(_) => {
            return Err(bad(
                "invalid_type",
                "response_format.json_schema",
                "must be an object",
            ))
        }
        None => {
            return Err(bad(
                "missing_required_parameter",
                "response_format.json_schema",
                "required with type \"json_schema\"",
            ))
        }
    };
    if let Some(key) = rf.keys().next() {
        return Err(bad(
            "unknown_parameter",
            format!("response_format.{key}"),
            format!("unknown key {key:?} (allowed: type, json_schema)"),
        ));
    }
    match js.remove("name") {
        Some(Value::String(n)) if valid_name(&n) => {}
        Some(_) => {
            return Err(bad(
                "invalid_value",
                "response_format.json_schema.name",
                "name must be 1–64 characters of a–z, A–Z, 0–9, _ and -",
            ))
        }
        None => {
            return Err(bad(
                "missing_required_parameter",
                "response_format.json_schema.name",
                "required",
            ))
        }
    }
    if js
        .remove("strict")
        .is_some_and(|s| !s.is_boolean() && !s.is_null())
    {
        return Err(bad(
            "invalid_type",
            "response_format.json_schema.strict",
            "must be a boolean",
        ));
    }
    if js
        .remove("description")
        .is_some_and(|d| !d.is_string() && !d.is_null())
    {
        return Err(bad(
            "invalid_type",
            "response_format.json_schema.description",
            "must be a string",
        ));
    }
    let schema = js.remove("schema").ok_or_else(|| {
        bad(
            "missing_required_parameter",
            SCHEMA_PARAM,
            "required: the JSON Schema of the decision",
        )
    })?;
    if let Some(key) = js.keys().next() {
        return Err(bad(
            "unknown_parameter",
            format!("response_format.json_schema.{key}"),
            format!("unknown key {key:?} (allowed: name, schema, strict, description)"),
        ));
    }
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(bad(
            "invalid_schema",
            SCHEMA_PARAM,
            "the schema must be a JSON Schema object, {\"type\": \"object\", \"properties\": {...}}, whose properties are enums or booleans",
        ));
    }
    Ok(schema)
}

fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The context: every system, developer and user message's text, in order, joined by a blank
/// line; at most `max_bytes` (413).
fn parse_messages(v: Option<Value>, max_bytes: usize) -> Result<String, ApiError> {
    let list = match v {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => {
            return Err(bad(
                "invalid_value",
                "messages",
                "messages must not be empty",
            ))
        }
        Some(_) => return Err(bad("invalid_type", "messages", "messages must be an array")),
        None => {
            return Err(bad(
                "missing_required_parameter",
                "messages",
                "messages is required",
            ))
        }
    };
    let mut parts = Vec::with_capacity(list.len());
    let mut users = 0;
    for (i, m) in list.into_iter().enumerate() {
        let path = format!("messages[{i}]");
        let Value::Object(mut m) = m else {
            return Err(bad("invalid_type", path, "a message must be an object"));
        };
        let role = match m.remove("role") {
            Some(Value::String(r)) => r,
            _ => {
                return Err(bad(
                    "invalid_value",
                    format!("{path}.role"),
                    "role must be a string",
                ))
            }
        };
        match role.as_str() {
            "system" | "developer" => {}
            "user" => users += 1,
            "assistant" | "tool" | "function" => {
                return Err(bad(
                    "unsupported_message_role",
                    format!("{path}.role"),
                    format!("{role} messages are not supported: the context is the system, developer and user messages of one turn"),
                ))
            }
            other => {
                return Err(bad(
                    "invalid_value",
                    format!("{path}.role"),
                    format!("unknown role {other:?} (expected system, developer or user)"),
                ))
            }
        }
        if m.remove("name").is_some_and(|n| !n.is_string()) {
            return Err(bad(
                "invalid_type",
                format!("{path}.name"),
                "name must be a string",
            ));
        }
        let content = m.remove("content");
        if let Some(key) = m.keys().next() {
            return Err(bad(
                "unknown_parameter",
                format!("{path}.{key}"),
                format!("unknown key {key:?} (allowed: role, content, name)"),
            ));
        }
        parts.push(message_text(content, &format!("{path}.content"))?);
    }
    if users == 0 {
        return Err(bad(
            "invalid_value",
            "messages",
            "no user message: the user's content is the context to score",
        ));
    }
    let context = parts.join("\n\n");
    if context.len() > max_bytes {
        return Err(bad(
            "too_many_tokens",
            "messages",
            format!(
                "{} bytes, over the {max_bytes}-byte bound of max_input_tokens",
                context.len()
            ),
        )
        .with_status(StatusCode::PAYLOAD_TOO_LARGE));
    }
    Ok(context)
}

/// A message's content: a string, or text parts (`{"type": "text", "text"}`) joined by a newline.
fn message_text(content: Option<Value>, path: &str) -> Result<String, ApiError> {
    match content {
        Some(Value::String(s)) => Ok(s),
        Some(Value::Array(items)) => {
            let mut texts = Vec::with_capacity(items.len());
            for (j, item) in items.iter().enumerate() {
                let p = format!("{path}[{j}]");
                match item.get("type").and_then(Value::as_str) {
                    Some("text") => {}
                    Some(other) => {
                        return Err(bad(
                            "unsupported_content",
                            format!("{p}.type"),
                            format!(
                                "content parts of type {other:?} are not supported (only \"text\")"
                            ),
                        ))
                    }
                    None => {
                        return Err(bad(
                            "invalid_value",
                            format!("{p}.type"),
                            "a content part needs a type",
                        ))
                    }
                }
                match item.get("text") {
                    Some(Value::String(t)) => texts.push(t.as_str()),
                    _ => {
                        return Err(bad(
                            "invalid_value",
                            format!("{p}.text"),
                            "a text part needs a string text",
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(bad(
            "invalid_type",
            path,
            "content must be a string or an array of text parts",
        )),
        None => Err(bad(
            "missing_required_parameter",
            path,
            "content is required",
        )),
    }
}
