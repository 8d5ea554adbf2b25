//! Request bodies parsed once into validated types. Strict JSON (a repeated key is an error
//! naming its path), unknown keys refused, every rejection an [`ApiError`] with the JSON path.
//!
//! - `/v1/score`: `{"context": str, "schema": object, "options"?: Options}`
//! - `/v1/decide_many`: `{"contexts": [str, …], "schema": object, "options"?: Options}`
//! - `/v1/ask`: `{"context": str, "question": str, "options"?: Options}` (one boolean field `answer`)
//! - `/v1/generate`: `{"context": str, "schema": object, "options"?: Options,
//!   "max_new_tokens"?: 1 ..= [`MAX_NEW_TOKENS`]}` (forkscore's decision beside a greedy
//!   generation of the answer; default length: the schema's longest answer + 16 tokens)
//!
//! Options (the table every front end shares, `forkscore_engine::request_options::OPTIONS`):
//! `mode` (`parallel` | `cached-serial` | `independent` | `tree`), `temperature` (finite > 0),
//! `allow_uncalibrated`, `max_input_tokens` (1 ..= the server's bound), `field_batch_size` (≥ 1),
//! `include_prompt`, `allowed_mass` (bool) and `top_k` (0 ..= 1024, needs `allowed_mass`; default 5),
//! as `forkscore score --allowed-mass --top-k`, and `scoring` (`code` | `literal` |
//! `literal-first-token` | `literal-sum-loglik` | `literal-mean-loglik` | `json`: how the schema's fields
//! that name no `scoring` of their own are scored, as `forkscore score --scoring`), and
//! `literal_value` (`argmax` | `greedy`, as `--literal-value`).

use crate::config::ServeConfig;
use crate::error::ApiError;
use forkscore_engine::strict_json::{parse_strict, StrictJsonError};
use forkscore_engine::{Schema, ScoreOptions};
use serde_json::{json, Map, Value};

/// Unconstrained tokens listed per field with `allowed_mass` and no `top_k` (as `--top-k`).
pub use forkscore_engine::request_options::DEFAULT_TOP_K;

/// Most tokens a `/v1/generate` request may ask for (a generation holds the model thread for
/// one forward per token).
pub const MAX_NEW_TOKENS: usize = 4096;

/// Contexts + schema + options, whichever endpoint they came from.
#[derive(Debug, Clone, PartialEq)]
pub struct DecideRequest {
    pub contexts: Vec<String>,
    pub schema: Schema,
    pub options: ScoreOptions,
    /// `/v1/generate` only: the request's `max_new_tokens` (None: the schema's default).
    pub max_new_tokens: Option<usize>,
}

pub use forkscore_engine::request_options::RequestOptions;

/// Which endpoint a body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Score,
    DecideMany,
    Ask,
    Generate,
}

impl Endpoint {
    /// The keys a body for this endpoint may have.
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            Endpoint::Score => &["context", "schema", "options"],
            Endpoint::DecideMany => &["contexts", "schema", "options"],
            Endpoint::Ask => &["context", "question", "options"],
            Endpoint::Generate => &["context", "schema", "options", "max_new_tokens"],
        }
    }
}

/// Parse one body for `endpoint` under the server's limits.
pub fn parse(
    endpoint: Endpoint,
    body: &[u8],
    cfg: &ServeConfig,
) -> Result<DecideRequest, ApiError> {
    let Value::Object(mut obj) = parse_body(body)? else {
        return Err(ApiError::bad(
            "not_an_object",
            "<root>",
            "body must be a JSON object",
        ));
    };
    if let Some(key) = obj.keys().find(|k| !endpoint.keys().contains(&k.as_str())) {
        return Err(ApiError::bad(
            "unknown_key",
            key.clone(),
            format!("unknown key (allowed: {})", endpoint.keys().join(", ")),
        ));
    }
    let RequestOptions {
        score: options,
        scoring,
    } = parse_options(obj.remove("options"), cfg)?;
    let context_bytes = context_byte_bound(options.max_input_tokens);
    let contexts = match endpoint {
        Endpoint::Score | Endpoint::Ask | Endpoint::Generate => {
            vec![context_string(
                obj.remove("context"),
                "context",
                context_bytes,
            )?]
        }
        Endpoint::DecideMany => {
            let list = match obj.remove("contexts") {
                Some(Value::Array(a)) => a,
                None => return Err(ApiError::bad("missing_context", "contexts", "required")),
                Some(_) => {
                    return Err(ApiError::bad(
                        "invalid_field",
                        "contexts",
                        "must be an array of strings",
                    ))
                }
            };
            if list.is_empty() {
                return Err(ApiError::bad(
                    "invalid_field",
                    "contexts",
                    "must not be empty",
                ));
            }
            if list.len() > cfg.max_contexts_per_request {
                return Err(ApiError::bad(
                    "too_many_contexts",
                    "contexts",
                    format!(
                        "{} contexts, over this server's limit of {}",
                        list.len(),
                        cfg.max_contexts_per_request
                    ),
                )
                .with_status(axum::http::StatusCode::PAYLOAD_TOO_LARGE));
            }
            list.into_iter()
                .enumerate()
                .map(|(i, v)| context_string(Some(v), &format!("contexts[{i}]"), context_bytes))
                .collect::<Result<_, _>>()?
        }
    };
    let schema_value = match endpoint {
        Endpoint::Ask => match obj.remove("question") {
            Some(Value::String(q)) if !q.trim().is_empty() => {
                json!({"answer": {"type": "boolean", "description": q}})
            }
            Some(Value::String(_)) => {
                return Err(ApiError::bad(
                    "invalid_field",
                    "question",
                    "must not be empty",
                ))
            }
            Some(_) => {
                return Err(ApiError::bad(
                    "invalid_field",
                    "question",
                    "must be a string",
                ))
            }
            None => return Err(ApiError::bad("missing_question", "question", "required")),
        },
        _ => obj
            .remove("schema")
            .ok_or_else(|| ApiError::bad("missing_schema", "schema", "required"))?,
    };
    let max_new_tokens = match obj.remove("max_new_tokens") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|n| (1..=MAX_NEW_TOKENS as u64).contains(n))
                .ok_or_else(|| {
                    ApiError::bad(
                        "invalid_field",
                        "max_new_tokens",
                        format!("must be an integer from 1 to {MAX_NEW_TOKENS}"),
                    )
                })? as usize,
        ),
    };
    let schema = Schema::from_value_with(&schema_value, scoring).map_err(|e| {
        // /v1/ask builds its schema from the question: a problem with it is the question's
        let path = if endpoint == Endpoint::Ask {
            "question".to_string()
        } else if e.path == "<root>" {
            "schema".to_string()
        } else {
            format!("schema.{}", e.path)
        };
        ApiError::bad("invalid_schema", path, e.kind.to_string())
    })?;
    Ok(DecideRequest {
        contexts,
        schema,
        options,
        max_new_tokens,
    })
}

/// A body as strict JSON (a repeated key is an error naming its path).
pub fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad("invalid_utf8", "<root>", format!("body is not UTF-8 ({e})")))?;
    parse_strict(text).map_err(|e| match &e {
        StrictJsonError::DuplicateKey { path, .. } => {
            ApiError::bad("invalid_json", path.clone(), e.to_string())
        }
        StrictJsonError::Syntax { .. } => ApiError::bad("invalid_json", "<root>", e.to_string()),
    })
}

/// Bytes a context may have for a token bound: 64 per token, at least 64 KiB (real tokenizers
/// average 3–5 bytes per token, so a longer context could never fit; the same bound as the CLI).
pub fn context_byte_bound(max_input_tokens: usize) -> usize {
    max_input_tokens.saturating_mul(64).max(64 << 10)
}

fn context_string(v: Option<Value>, path: &str, max_bytes: usize) -> Result<String, ApiError> {
    match v {
        Some(Value::String(s)) if s.len() > max_bytes => Err(ApiError::bad(
            "too_many_tokens",
            path,
            format!(
                "{} bytes, over the {max_bytes}-byte bound of max_input_tokens",
                s.len()
            ),
        )
        .with_status(axum::http::StatusCode::PAYLOAD_TOO_LARGE)),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(ApiError::bad("invalid_field", path, "must be a string")),
        None => Err(ApiError::bad("missing_context", path, "required")),
    }
}

/// An `options` object (absent: the defaults under the server's bounds); errors at
/// `options.<key>`.
pub fn parse_options(v: Option<Value>, cfg: &ServeConfig) -> Result<RequestOptions, ApiError> {
    let obj: Map<String, Value> = match v {
        None => return Ok(RequestOptions::with_bound(cfg.max_input_tokens)),
        Some(Value::Object(o)) => o,
        Some(_) => {
            return Err(ApiError::bad(
                "invalid_field",
                "options",
                "must be an object",
            ))
        }
    };
    // the one options parser every front end shares (forkscore_engine::request_options)
    RequestOptions::from_json(&obj, cfg.max_input_tokens)
        .map_err(|e| ApiError::bad("options", format!("options.{}", e.name), e.rule))
}
