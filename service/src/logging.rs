//! Structured logs through `tracing`: [`init`] installs the process's subscriber (plain text
//! lines on stderr, the level from `RUST_LOG`, `info` when unset), and [`request_log`] is the
//! router's `tower-http` trace layer, which writes one line per request:
//!
//! ```text
//! 2026-01-01T00:00:00.000000Z  INFO request{method=POST path=/v1/score}: forkscore_service::logging: done status=200 latency_ms=3.1
//! ```
//!
//! A 5xx is logged at `error`, a 4xx at `warn` (so `RUST_LOG=warn` keeps only the refusals and
//! failures), everything else at `info`. Requests refused before the router (a `Host` or
//! `Origin` the server does not accept) get their own `warn` line from [`crate::server`].

use axum::http::{Request, Response};
use std::time::Duration;
use tower_http::classify::{ServerErrorsAsFailures, SharedClassifier};
use tower_http::trace::{MakeSpan, OnResponse, TraceLayer};
use tracing::Span;
use tracing_subscriber::EnvFilter;

/// The filter when `RUST_LOG` is unset or empty.
pub const DEFAULT_FILTER: &str = "info";

/// `RUST_LOG` does not parse as a `tracing` filter.
#[derive(Debug, thiserror::Error)]
#[error("RUST_LOG={value:?} is not a valid log filter (e.g. `info`, `warn`, `forkscore_service=debug`): {source}")]
pub struct LogFilterError {
    pub value: String,
    #[source]
    pub source: tracing_subscriber::filter::ParseError,
}

/// The filter `RUST_LOG` (the value given, `None` when unset) asks for.
pub fn filter(rust_log: Option<&str>) -> Result<EnvFilter, LogFilterError> {
    match rust_log.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(EnvFilter::new(DEFAULT_FILTER)),
        Some(v) => EnvFilter::try_new(v).map_err(|source| LogFilterError {
            value: v.to_string(),
            source,
        }),
    }
}

/// Install the process-wide subscriber: text lines on stderr, filtered by `RUST_LOG`. A second
/// call (or a subscriber installed by an embedding program) leaves the first in place.
pub fn init() -> Result<(), LogFilterError> {
    let filter = filter(std::env::var("RUST_LOG").ok().as_deref())?;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    Ok(())
}

/// The span of one request: its method and path (never the query or the body).
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestSpan;

impl<B> MakeSpan<B> for RequestSpan {
    fn make_span(&mut self, request: &Request<B>) -> Span {
        tracing::info_span!(
            "request",
            method = %request.method(),
            path = %request.uri().path(),
        )
    }
}

/// The one line per request: status and latency, at a level by status class.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResponseLine;

impl<B> OnResponse<B> for ResponseLine {
    fn on_response(self, response: &Response<B>, latency: Duration, _span: &Span) {
        let status = response.status().as_u16();
        let latency_ms = latency.as_secs_f64() * 1e3;
        if response.status().is_server_error() {
            tracing::error!(status, latency_ms, "done");
        } else if response.status().is_client_error() {
            tracing::warn!(status, latency_ms, "done");
        } else {
            tracing::info!(status, latency_ms, "done");
        }
    }
}

/// The router's request log layer (no line at the request's start, none per body chunk: one
/// line when the response head is ready).
pub type RequestLog =
    TraceLayer<SharedClassifier<ServerErrorsAsFailures>, RequestSpan, (), ResponseLine, (), (), ()>;

pub fn request_log() -> RequestLog {
    TraceLayer::new_for_http()
        .make_span_with(RequestSpan)
        .on_request(())
        .on_response(ResponseLine)
        .on_body_chunk(())
        .on_eos(())
        .on_failure(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_unset_or_empty_is_info_and_a_bad_filter_is_named() {
        assert_eq!(filter(None).unwrap().to_string(), "info");
        assert_eq!(filter(Some("  ")).unwrap().to_string(), "info");
        assert_eq!(
            filter(Some("forkscore_service=debug")).unwrap().to_string(),
            "forkscore_service=debug"
        );
        let e = filter(Some("forkscore_service=loud")).unwrap_err();
        assert!(
            e.to_string()
                .contains("RUST_LOG=\"forkscore_service=loud\""),
            "{e}"
        );
    }
}
