//! OpenAI-compatible routes, so that OpenAI clients and SDKs get decisions unchanged:
//! `POST /v1/chat/completions` (a chat request whose `response_format` is a JSON Schema of enum
//! and boolean fields → a `chat.completion` carrying the decision) and `GET /v1/models` (the one
//! served model). [`request`] says how a chat request maps onto a context and a schema,
//! [`response`] how the decision maps onto the completion.
//!
//! Errors use OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: `type` is
//! `invalid_request_error` for a 4xx and `server_error` for a 5xx, `param` the JSON path in the
//! request (null for the whole body), `code` the rule (the service's error kinds, plus OpenAI's
//! `model_not_found`, `unsupported_parameter`, …).

pub mod refs;
pub mod request;
pub mod response;

use crate::api_types::openai::{ChatCompletion, ChatRequest, ModelList, OpenAIError};
use crate::api_types::ErrorBody;
use crate::error::ApiError;
use crate::routes::{read_json_body, score_contexts, AppState};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use forkscore_engine::EngineError;
use forkscore_seam::Backend;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

const CHAT_ROUTE: &str = "/v1/chat/completions";

/// The served model's id: its provenance `model_id` (what `/v1/models` lists).
pub fn model_id<B: Backend>(s: &AppState<B>) -> String {
    s.model
        .get("model_id")
        .and_then(Value::as_str)
        .unwrap_or("forkscore")
        .to_string()
}

/// An [`ApiError`] in OpenAI's error shape (the status kept).
pub fn error_response(e: &ApiError) -> Response {
    let kind = if e.status.is_server_error() {
        "server_error"
    } else {
        "invalid_request_error"
    };
    let param = match e.path.as_str() {
        "<root>" => Value::Null,
        p => Value::String(p.to_string()),
    };
    let body = json!({"error": {
        "message": e.message,
        "type": kind,
        "param": param,
        "code": e.kind,
    }});
    let mut r = (e.status, Json(body)).into_response();
    if e.status == StatusCode::REQUEST_TIMEOUT {
        // the rest of the body is never read: the connection cannot carry another request
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

#[utoipa::path(
    post,
    tag = "openai",
    path = "/v1/chat/completions",
    summary = "OpenAI-compatible: a chat request whose response_format is a JSON Schema of enum/boolean properties; the decision is the assistant message's JSON content",
    request_body = ChatRequest,
    responses(
        (status = 200, description = "An OpenAI chat.completion, plus the forkscore extension field", body = ChatCompletion),
        (status = 400, description = "What is wrong and where", body = OpenAIError),
        (status = 403, description = "Host or Origin not accepted", body = ErrorBody),
        (status = 404, description = "Another model than the served one", body = OpenAIError),
        (status = 408, description = "The body did not arrive in time", body = OpenAIError),
        (status = 413, description = "Body or context over the server's limits", body = OpenAIError),
        (status = 415, description = "Not sent as application/json", body = OpenAIError),
        (status = 503, description = "The queue is full", body = OpenAIError),
        (status = 504, description = "No result within the request timeout", body = OpenAIError),
    )
)]
pub async fn chat_completions<B: Backend + 'static>(
    State(s): State<Arc<AppState<B>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let start = Instant::now();
    let response = match complete(&s, &headers, body).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => error_response(&e),
    };
    s.metrics.request(
        CHAT_ROUTE,
        response.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    response
}

async fn complete<B: Backend + 'static>(
    s: &AppState<B>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Value, ApiError> {
    let bytes = read_json_body(s, headers, body).await?;
    let model = model_id(s);
    let req = request::parse(&bytes, &s.config, &model)?;
    let (compiled, results) = score_contexts(s, req.schema, vec![req.context], &req.options)
        .await
        .map_err(|mut e| {
            if e.path == "schema" {
                e.path = request::SCHEMA_PARAM.to_string();
            }
            e
        })?;
    match results.first() {
        Some(Ok(d)) => Ok(response::completion(
            d,
            &compiled,
            &req.options,
            &s.model,
            &model,
            req.logprobs,
        )),
        Some(Err(e)) => Err(ApiError::from_engine(e, engine_error_param(e))),
        None => Err(ApiError::bad("backend", "<root>", "no result")
            .with_status(StatusCode::INTERNAL_SERVER_ERROR)),
    }
}

/// A schema too long whatever the context is the schema's; the engine's options errors are the
/// options'; anything else is the messages'.
fn engine_error_param(e: &EngineError) -> &'static str {
    match e {
        EngineError::TooManyTokens {
            schema_only: true, ..
        } => request::SCHEMA_PARAM,
        EngineError::Calibration(_)
        | EngineError::ZeroFieldBatch
        | EngineError::ZeroMaxInputTokens
        | EngineError::TopKTooLarge { .. } => "forkscore_options",
        _ => "messages",
    }
}

/// `GET /v1/models`: the one model this server serves.
#[utoipa::path(
    get,
    tag = "openai",
    path = "/v1/models",
    summary = "OpenAI-compatible: the one served model",
    responses((status = 200, description = "The model list", body = ModelList))
)]
pub async fn models<B: Backend + 'static>(State(s): State<Arc<AppState<B>>>) -> Response {
    let start = Instant::now();
    let body = json!({
        "object": "list",
        "data": [{
            "id": model_id(&s),
            "object": "model",
            "created": s.started,
            "owned_by": "forkscore",
        }],
    });
    s.metrics
        .request("/v1/models", 200, start.elapsed().as_secs_f64());
    Json(body).into_response()
}
