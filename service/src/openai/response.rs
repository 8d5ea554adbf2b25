//! The `chat.completion` object of one decision, and OpenAI's `logprobs` shape for it.
//!
//! - `choices[0].message.content`: the decision (`output` of `/v1/score`) as a JSON string,
//!   fields in the schema's order; `finish_reason`: `"stop"`.
//! - `usage`: `prompt_tokens` = the tokens the model read (the prompt prefix plus every field
//!   row's suffix), `completion_tokens` = 0 (nothing is generated).
//! - `logprobs.content` (with `logprobs: true`): one entry per field, in the schema's order:
//!   `token` = the chosen value as text (`"high"`, `"true"`), `logprob` = ln of its probability,
//!   `bytes` = the token's UTF-8 bytes, `top_logprobs` = the field's most probable choices,
//!   highest first (the chosen one included, as OpenAI lists it), up to `top_logprobs`. A
//!   probability of 0 is written as -9999.0 (JSON has no -infinity).
//! - `forkscore` (extension, top level): exactly the `/v1/score` result JSON — `output`,
//!   `fields` (per field, per choice `scores` and `logits`), `temperature`, `telemetry`,
//!   `provenance`.

use forkscore_engine::{CompiledSchema, Decision, FieldResult, ScoreOptions};
use forkscore_frontend::result::decision_json;
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};

/// The log-prob written for a probability of 0.
pub const LOGPROB_OF_ZERO: f64 = -9999.0;

/// The whole answer; `logprobs`: the request's top-logprob count when it asked for logprobs.
pub fn completion(
    decision: &Decision,
    compiled: &CompiledSchema,
    options: &ScoreOptions,
    provenance: &Map<String, Value>,
    model: &str,
    logprobs: Option<usize>,
) -> Value {
    let content = Value::Object(decision.output.clone().into_iter().collect()).to_string();
    let t = &decision.telemetry;
    let prompt_tokens = t.prefix_tokens + t.suffix_tokens.iter().sum::<usize>();
    let logprobs = match logprobs {
        Some(k) => json!({
            "content": decision.fields.values().map(|f| field_logprob(f, k)).collect::<Vec<_>>(),
            "refusal": null,
        }),
        None => Value::Null,
    };
    json!({
        "id": completion_id(),
        "object": "chat.completion",
        "created": crate::routes::unix_now(),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "refusal": null},
            "logprobs": logprobs,
            "finish_reason": "stop",
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 0,
            "total_tokens": prompt_tokens,
        },
        "forkscore": decision_json(decision, compiled, options, provenance),
    })
}

/// `chatcmpl-` + the time in nanoseconds and a process-wide counter (unique per process).
fn completion_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "chatcmpl-{nanos:016x}{:06x}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The text of a choice value as it appears in the score maps (`true`/`false` for booleans).
fn key_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn logprob(p: f64) -> f64 {
    if p > 0.0 {
        p.ln()
    } else {
        LOGPROB_OF_ZERO
    }
}

fn token_entry(token: &str, p: f64) -> Value {
    json!({"token": token, "logprob": logprob(p), "bytes": token.as_bytes()})
}

/// One field's entry of `logprobs.content`, with up to `top` of its choices.
fn field_logprob(f: &FieldResult, top: usize) -> Value {
    let chosen = key_of(&f.value);
    let p = f.scores.get(&chosen).copied().unwrap_or(0.0);
    let mut ranked: Vec<(&String, f64)> = f.scores.iter().map(|(k, p)| (k, *p)).collect();
    // stable: equal probabilities keep the schema's choice order
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut entry = token_entry(&chosen, p);
    entry["top_logprobs"] = ranked
        .into_iter()
        .take(top)
        .map(|(k, p)| token_entry(k, p))
        .collect();
    entry
}
