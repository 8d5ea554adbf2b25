//! The router: which handler serves which route (the table is in [`crate::routes`], whose
//! handlers serve the native routes; [`crate::openai`]'s serve the OpenAI-compatible ones), and
//! the 404 / 405 fallbacks after every route.

use crate::openai;
use crate::routes::{
    ask, decide_many, generate, health, method_not_allowed, metrics, not_found, page, presets,
    score, AppState,
};
use axum::routing::{get, post};
use axum::Router;
use forkscore_seam::Backend;
use std::sync::Arc;

pub fn router<B: Backend + 'static>(state: Arc<AppState<B>>) -> Router {
    Router::new()
        .route("/v1/score", post(score::<B>))
        .route("/v1/decide_many", post(decide_many::<B>))
        .route("/v1/ask", post(ask::<B>))
        .route("/v1/generate", post(generate::<B>))
        .route("/", get(page))
        .route("/v1/presets", get(presets))
        .route("/health", get(health::<B>))
        .route("/metrics", get(metrics::<B>))
        .route("/openapi.json", get(crate::openapi::serve))
        .route("/v1/chat/completions", post(openai::chat_completions::<B>))
        .route("/v1/models", get(openai::models::<B>))
        // after every route: it applies to the routes already added
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        // one log line per request, fallbacks included (see `crate::logging`)
        .layer(crate::logging::request_log())
        .with_state(state)
}
