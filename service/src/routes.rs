//! The HTTP surface: routes and handlers (the connection layer under them is [`crate::server`]).
//!
//! Every POST body must be sent as `Content-Type: application/json` (415 otherwise: a browser
//! page of another origin cannot send that without a CORS preflight, which this server never
//! grants) and must arrive whole within `body_read_timeout` (408, connection closed). The schema
//! compile (on a blocking thread), the queue wait and the scoring share one deadline,
//! `request_timeout` from the body's arrival (504 after it).
//!
//! | route | does |
//! | --- | --- |
//! | `POST /v1/score` | one context + schema → the `forkscore score` result JSON |
//! | `POST /v1/decide_many` | many contexts + one schema → `{"results": [result or {"error"}…]}` in input order |
//! | `POST /v1/ask` | context + yes/no question → the result of the one boolean field `answer` |
//! | `POST /v1/generate` | context + schema → forkscore's decision beside a greedy generation of the answer (the `forkscore generate` report) |
//! | `GET /` | the web page (one self-contained HTML file: paste a context, pick a preset, score) |
//! | `GET /v1/presets` | the example schemas the page offers |
//! | `GET /health` | `{"status": "ok", "model", "queue_depth"}` |
//! | `GET /metrics` | Prometheus text format |
//! | `GET /openapi.json` | the OpenAPI 3.1 description of these routes, generated ([`crate::openapi`]) |
//! | `POST /v1/chat/completions` | OpenAI-compatible: a chat request with a `json_schema` response format → a `chat.completion` ([`crate::openai`]) |
//! | `GET /v1/models` | OpenAI-compatible: the one served model |
//!
//! Any other path is a 404 and another method on a known path a 405 (with `Allow`), both with
//! the JSON error body of every other refusal.

use crate::api_types::{
    AskRequest, DecideManyRequest, DecideManyResponse, ErrorBody, GenerateRequest, GenerateResult,
    Health, Presets, ScoreRequest, ScoreResult,
};
use crate::config::ServeConfig;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::queue::{GenerateJob, Job, Queue};
use crate::request::{self, Endpoint};
use crate::scheduler::prepare_contexts;
use crate::schemas::SchemaCache;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use forkscore_engine::{
    CompiledSchema, Decision, Engine, EngineError, GenerateOptions, Schema, ScoreOptions,
};
use forkscore_frontend::result::{decision_json, decision_provenance, result_json, Layout};
use forkscore_seam::Backend;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Every route (method, path); the generated `/openapi.json` describes exactly these (tested).
pub const ROUTES: &[(&str, &str)] = &[
    ("post", "/v1/score"),
    ("post", "/v1/decide_many"),
    ("post", "/v1/ask"),
    ("post", "/v1/generate"),
    ("get", "/"),
    ("get", "/v1/presets"),
    ("get", "/health"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
    ("post", "/v1/chat/completions"),
    ("get", "/v1/models"),
];

/// The web page served at `/` (inline CSS and JS, no external resources).
pub const PAGE: &str = include_str!("page.html");

/// What every handler shares: the loaded engine (through the queue), limits, caches, metrics.
pub struct AppState<B: Backend> {
    pub engine: Arc<Engine<B>>,
    pub config: ServeConfig,
    /// The loaded model's provenance object (copied into every result).
    pub model: Map<String, Value>,
    pub metrics: Arc<Metrics>,
    /// When the server started (Unix seconds; `/v1/models` reports it as `created`).
    pub started: u64,
    schemas: SchemaCache,
    queue: Queue,
}

impl<B: Backend + 'static> AppState<B> {
    /// Start the model thread; it ends once the state (and every router holding it) is dropped.
    /// Fails only if the operating system refuses a new thread.
    pub fn start(
        engine: Engine<B>,
        model: Map<String, Value>,
        config: ServeConfig,
    ) -> std::io::Result<(Arc<AppState<B>>, std::thread::JoinHandle<()>)> {
        let engine = Arc::new(engine);
        let metrics = Arc::new(Metrics::default());
        let (queue, handle) = Queue::start(
            engine.clone(),
            config.queue_capacity,
            config.max_merged_contexts,
            config.budget,
            metrics.clone(),
        )?;
        let state = AppState {
            engine,
            schemas: SchemaCache::new(config.schema_cache, config.max_concurrent_compiles),
            config,
            model,
            metrics,
            started: unix_now(),
            queue,
        };
        Ok((Arc::new(state), handle))
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// 404 for a path no route serves, naming the routes there are.
pub(crate) async fn not_found(method: Method, uri: Uri) -> Response {
    let routes: Vec<String> = ROUTES
        .iter()
        .map(|(m, p)| format!("{} {p}", m.to_uppercase()))
        .collect();
    ApiError::bad(
        "not_found",
        "<root>",
        format!(
            "no route {method} {} (routes: {})",
            uri.path(),
            routes.join(", ")
        ),
    )
    .with_status(StatusCode::NOT_FOUND)
    .into_response()
}

/// 405 for a known path asked with another method (axum adds the `Allow` header).
pub(crate) async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    let allowed: Vec<String> = ROUTES
        .iter()
        .filter(|(_, p)| *p == uri.path())
        .map(|(m, _)| m.to_uppercase())
        .collect();
    ApiError::bad(
        "method_not_allowed",
        "<root>",
        format!(
            "{} does not answer {method} (allowed: {})",
            uri.path(),
            allowed.join(", ")
        ),
    )
    .with_status(StatusCode::METHOD_NOT_ALLOWED)
    .into_response()
}

#[utoipa::path(
    post,
    tag = "forkscore",
    path = "/v1/score",
    summary = "Score one context against a schema",
    request_body = ScoreRequest,
    responses(
        (status = 200, description = "The forkscore score result", body = ScoreResult),
        (status = 400, description = "What is wrong and where", body = ErrorBody),
        (status = 403, description = "Host or Origin not accepted", body = ErrorBody),
        (status = 408, description = "The body did not arrive in time", body = ErrorBody),
        (status = 413, description = "Body, contexts or a context over the server's limits", body = ErrorBody),
        (status = 415, description = "Not sent as application/json", body = ErrorBody),
        (status = 503, description = "The queue is full", body = ErrorBody),
        (status = 504, description = "No result within the request timeout", body = ErrorBody),
    )
)]
pub(crate) async fn score<B: Backend + 'static>(
    State(s): State<Arc<AppState<B>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    handle(s, Endpoint::Score, "/v1/score", &headers, body).await
}
#[utoipa::path(
    post,
    tag = "forkscore",
    path = "/v1/decide_many",
    summary = "Score many contexts against one schema (results in input order)",
    request_body = DecideManyRequest,
    responses(
        (status = 200, description = "One result or error object per context", body = DecideManyResponse),
        (status = 400, description = "What is wrong and where", body = ErrorBody),
        (status = 403, description = "Host or Origin not accepted", body = ErrorBody),
        (status = 408, description = "The body did not arrive in time", body = ErrorBody),
        (status = 413, description = "Body, contexts or a context over the server's limits", body = ErrorBody),
        (status = 415, description = "Not sent as application/json", body = ErrorBody),
        (status = 503, description = "The queue is full", body = ErrorBody),
        (status = 504, description = "No result within the request timeout", body = ErrorBody),
    )
)]
pub(crate) async fn decide_many<B: Backend + 'static>(
    State(s): State<Arc<AppState<B>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    handle(s, Endpoint::DecideMany, "/v1/decide_many", &headers, body).await
}
#[utoipa::path(
    post,
    tag = "forkscore",
    path = "/v1/ask",
    summary = "A yes/no question, scored as one boolean field `answer`",
    request_body = AskRequest,
    responses(
        (status = 200, description = "The result of the field `answer`", body = ScoreResult),
        (status = 400, description = "What is wrong and where", body = ErrorBody),
        (status = 403, description = "Host or Origin not accepted", body = ErrorBody),
        (status = 408, description = "The body did not arrive in time", body = ErrorBody),
        (status = 413, description = "Body, contexts or a context over the server's limits", body = ErrorBody),
        (status = 415, description = "Not sent as application/json", body = ErrorBody),
        (status = 503, description = "The queue is full", body = ErrorBody),
        (status = 504, description = "No result within the request timeout", body = ErrorBody),
    )
)]
pub(crate) async fn ask<B: Backend + 'static>(
    State(s): State<Arc<AppState<B>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    handle(s, Endpoint::Ask, "/v1/ask", &headers, body).await
}
#[utoipa::path(
    post,
    tag = "forkscore",
    path = "/v1/generate",
    summary = "The autoregressive baseline: forkscore's decision beside a greedy generation of the JSON answer",
    request_body = GenerateRequest,
    responses(
        (status = 200, description = "forkscore's side, the generation (text, validity, stop reason, timings, tokens/s), field agreement and the speed-up", body = GenerateResult),
        (status = 400, description = "What is wrong and where", body = ErrorBody),
        (status = 403, description = "Host or Origin not accepted", body = ErrorBody),
        (status = 408, description = "The body did not arrive in time", body = ErrorBody),
        (status = 413, description = "Body, contexts or a context over the server's limits", body = ErrorBody),
        (status = 415, description = "Not sent as application/json", body = ErrorBody),
        (status = 503, description = "The queue is full", body = ErrorBody),
        (status = 504, description = "No result within the request timeout", body = ErrorBody),
    )
)]
pub(crate) async fn generate<B: Backend + 'static>(
    State(s): State<Arc<AppState<B>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    handle(s, Endpoint::Generate, "/v1/generate", &headers, body).await
}

async fn handle<B: Backend + 'static>(
    s: Arc<AppState<B>>,
    endpoint: Endpoint,
    route: &str,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let start = Instant::now();
    let response = match decide(&s, endpoint, headers, body).await {
        Ok(v) => Json(v).into_response(),
        Err(e) if e.status == StatusCode::REQUEST_TIMEOUT => {
            // the rest of the body is never read: the connection cannot carry another request
            let mut r = e.into_response();
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            r
        }
        Err(e) => e.into_response(),
    };
    s.metrics.request(
        route,
        response.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    response
}

/// Ok when the request declares a JSON body (`application/json`, parameters allowed), else 415.
pub fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let declared = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let essence = declared
        .as_deref()
        .map(|c| c.split(';').next().unwrap_or("").trim());
    match essence {
        Some(e) if e.eq_ignore_ascii_case("application/json") => Ok(()),
        _ => Err(ApiError::bad(
            "unsupported_media_type",
            "<root>",
            format!(
                "request bodies must be sent with Content-Type: application/json (got {})",
                declared.map_or("none".to_string(), |c| format!("{c:?}"))
            ),
        )
        .with_status(StatusCode::UNSUPPORTED_MEDIA_TYPE)),
    }
}

/// The whole body, at most `limit` bytes (413), arriving within `within` (408).
async fn read_body(
    body: Body,
    limit: usize,
    within: Duration,
) -> Result<axum::body::Bytes, ApiError> {
    match tokio::time::timeout(within, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(ApiError::bad(
            "request_too_large",
            "<root>",
            format!("body over this server's limit of {limit} bytes"),
        )
        .with_status(StatusCode::PAYLOAD_TOO_LARGE)),
        Err(_) => Err(ApiError::bad(
            "body_timeout",
            "<root>",
            format!("the request body did not arrive within {within:?}"),
        )
        .with_status(StatusCode::REQUEST_TIMEOUT)),
    }
}

async fn decide<B: Backend + 'static>(
    s: &AppState<B>,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: Body,
) -> Result<Value, ApiError> {
    let bytes = read_json_body(s, headers, body).await?;
    let req = request::parse(endpoint, &bytes, &s.config)?;
    if endpoint != Endpoint::Generate {
        let (compiled, results) = score_contexts(s, req.schema, req.contexts, &req.options)
            .await
            .map_err(|e| at_schema_path(e, endpoint))?;
        return decisions_json(s, endpoint, &compiled, &req.options, &results);
    }
    // compile, queue wait and generation: one deadline
    let timeout = s.config.request_timeout;
    let deadline = tokio::time::Instant::now() + timeout;
    let compiled = s
        .schemas
        .get(&s.engine, req.schema, deadline, timeout)
        .await
        .map_err(|e| at_schema_path(e, endpoint))?;
    let temperature = s
        .engine
        .resolve_temperature(&req.options)
        .map_err(|e| ApiError::from_engine(&e, "options"))?;
    let (reply, rx) = oneshot::channel();
    let context = req.contexts.into_iter().next().unwrap_or_default();
    s.queue.submit_generate(GenerateJob {
        compiled: compiled.clone(),
        context,
        options: req.options.clone(),
        generate: GenerateOptions {
            max_new_tokens: req.max_new_tokens,
            max_input_tokens: req.options.max_input_tokens,
            eos_ids: s.config.eos_ids.clone(),
            include_prompt: req.options.include_prompt,
            layout: req.options.layout,
        },
        reply,
    })?;
    let baseline = wait(rx, deadline, timeout)
        .await?
        .map_err(|e| ApiError::from_generate(&e))?;
    // forkscore's decision beside the greedy generation, as `forkscore generate` prints it
    // (`temperature`: the one the decision used)
    let provenance =
        decision_provenance(&s.model, &req.options, &temperature, compiled.schema_hash());
    let layout = Layout {
        record: None,
        extra: vec![("decoding", forkscore_engine::generate::DECODING.into())],
    };
    Ok(result_json(&baseline, layout, provenance))
}

/// The request body of a POST: declared JSON (415), whole within the body timeout (408), at
/// most the body limit (413).
pub(crate) async fn read_json_body<B: Backend + 'static>(
    s: &AppState<B>,
    headers: &HeaderMap,
    body: Body,
) -> Result<axum::body::Bytes, ApiError> {
    require_json(headers)?;
    read_body(body, s.config.max_body_bytes, s.config.body_read_timeout).await
}

/// Compile `schema` (cached), queue `contexts` and wait for their decisions, all within one
/// `request_timeout` from now (504 after it). Schema errors are at path `schema`.
pub(crate) async fn score_contexts<B: Backend + 'static>(
    s: &AppState<B>,
    schema: Schema,
    contexts: Vec<String>,
    options: &ScoreOptions,
) -> Result<(Arc<CompiledSchema>, Vec<Result<Decision, EngineError>>), ApiError> {
    let timeout = s.config.request_timeout;
    let deadline = tokio::time::Instant::now() + timeout;
    let compiled = s.schemas.get(&s.engine, schema, deadline, timeout).await?;
    // a place in the queue first: a full queue refuses before anything is prepared
    let slot = s.queue.reserve()?;
    // prepared here, off the model thread (options it refuses are its per-context errors)
    let (contexts, prepared) = if s.config.prepare_in_handlers
        && s.engine.check_request(options).is_ok()
    {
        let (engine, schema, opts) = (s.engine.clone(), compiled.clone(), options.clone());
        let work = tokio::task::spawn_blocking(move || {
            let p = prepare_contexts(&engine, &contexts, &schema, &opts);
            (contexts, p)
        });
        let (contexts, p) = match tokio::time::timeout_at(deadline, work).await {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => {
                return Err(
                    ApiError::bad("backend", "<root>", format!("preparing failed: {e}"))
                        .with_status(StatusCode::INTERNAL_SERVER_ERROR),
                )
            }
            Err(_) => {
                return Err(ApiError::bad(
                    "timeout",
                    "<root>",
                    format!("no result within {timeout:?}"),
                )
                .with_status(StatusCode::GATEWAY_TIMEOUT))
            }
        };
        (contexts, Some(p))
    } else {
        (contexts, None)
    };
    let (reply, rx) = oneshot::channel();
    slot.submit(Job {
        compiled: compiled.clone(),
        contexts,
        options: options.clone(),
        prepared,
        reply,
    });
    let results = wait(rx, deadline, timeout).await?;
    Ok((compiled, results))
}

/// `/v1/ask` builds its schema from the question: a schema error there is the question's.
fn at_schema_path(mut e: ApiError, endpoint: Endpoint) -> ApiError {
    if e.path == "schema" {
        e.path = schema_path(endpoint).to_string();
    }
    e
}

/// The answer of a decision endpoint: one result, or `{"results": [...]}` for decide_many.
fn decisions_json<B: Backend + 'static>(
    s: &AppState<B>,
    endpoint: Endpoint,
    compiled: &CompiledSchema,
    options: &ScoreOptions,
    results: &[Result<Decision, EngineError>],
) -> Result<Value, ApiError> {
    let one = |d: &Decision| decision_json(d, compiled, options, &s.model);
    match endpoint {
        Endpoint::Score | Endpoint::Ask | Endpoint::Generate => match results.first() {
            Some(Ok(d)) => Ok(one(d)),
            Some(Err(e)) => Err(ApiError::from_engine(e, error_path(e, endpoint, "context"))),
            None => Err(ApiError::bad("backend", "<root>", "no result")
                .with_status(StatusCode::INTERNAL_SERVER_ERROR)),
        },
        Endpoint::DecideMany => {
            let list: Vec<Value> = results
                .iter()
                .enumerate()
                .map(|(i, r)| match r {
                    Ok(d) => one(d),
                    Err(e) => {
                        ApiError::from_engine(e, error_path(e, endpoint, &format!("contexts[{i}]")))
                            .body()
                    }
                })
                .collect();
            Ok(json!({ "results": list }))
        }
    }
}

/// Where the schema is in a request body: `/v1/ask` builds its schema from the question.
fn schema_path(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Ask => "question",
        _ => "schema",
    }
}

/// Where a context's engine error points: a schema too long for the token bound whatever the
/// context is the schema's (or the question's), anything else the context's.
fn error_path<'a>(e: &EngineError, endpoint: Endpoint, context_path: &'a str) -> &'a str {
    match e {
        EngineError::TooManyTokens {
            schema_only: true, ..
        } => schema_path(endpoint),
        _ => context_path,
    }
}

/// The model thread's reply, or 504 once `deadline` (the request's `timeout` after its body
/// arrived) has passed (the job is then dropped unrun).
async fn wait<T>(
    rx: oneshot::Receiver<T>,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Result<T, ApiError> {
    match tokio::time::timeout_at(deadline, rx).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(_)) => Err(
            ApiError::bad("backend", "<root>", "the model thread stopped")
                .with_status(StatusCode::INTERNAL_SERVER_ERROR),
        ),
        Err(_) => Err(
            ApiError::bad("timeout", "<root>", format!("no result within {timeout:?}"))
                .with_status(StatusCode::GATEWAY_TIMEOUT),
        ),
    }
}

#[utoipa::path(get, tag = "forkscore", path = "/health", summary = "Liveness and queue depth", responses((status = 200, description = "ok", body = Health)))]
pub(crate) async fn health<B: Backend + 'static>(State(s): State<Arc<AppState<B>>>) -> Response {
    let start = Instant::now();
    let body = json!({
        "status": "ok",
        "model": s.model.get("model_id").cloned().unwrap_or(Value::Null),
        "revision": s.model.get("revision").cloned().unwrap_or(Value::Null),
        "queue_depth": s.metrics.queue_depth(),
    });
    s.metrics
        .request("/health", 200, start.elapsed().as_secs_f64());
    Json(body).into_response()
}

#[utoipa::path(get, tag = "forkscore", path = "/metrics", summary = "Prometheus metrics (text exposition format 0.0.4)", responses((status = 200, description = "metrics", body = String, content_type = "text/plain")))]
pub(crate) async fn metrics<B: Backend + 'static>(State(s): State<Arc<AppState<B>>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

#[utoipa::path(get, tag = "forkscore", path = "/", summary = "The web page: paste a context, pick a preset schema, score, see probability bars", responses((status = 200, description = "One self-contained HTML page", body = String, content_type = "text/html")))]
pub(crate) async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
            ),
        ],
        PAGE,
    )
        .into_response()
}

#[utoipa::path(get, tag = "forkscore", path = "/v1/presets", summary = "The example schemas the web page offers", responses((status = 200, description = "Named schemas", body = Presets)))]
pub(crate) async fn presets() -> Response {
    Json(crate::presets::presets_json()).into_response()
}
