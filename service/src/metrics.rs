//! Prometheus metrics through the `prometheus` crate: one registry per server (so that tests
//! can run many servers in one process), rendered in the text exposition format (0.0.4) by its
//! `TextEncoder`. Updates are per request and per merged call, never per token.
//!
//! - `forkscore_requests_total{route,status}`
//! - `forkscore_request_duration_seconds{route}` (histogram)
//! - `forkscore_queue_depth` (jobs waiting for the model thread)
//! - `forkscore_prefix_tokens_total`, `forkscore_rows_total`, `forkscore_decisions_total`
//! - `forkscore_group_size` (histogram: contexts per scored context group)
//! - `forkscore_merged_contexts` (histogram: contexts per merged `decide_many` call)
//! - `forkscore_open_connections` (gauge), `forkscore_connections_evicted_total` (idle connections
//!   closed to admit a new one at the connection cap)
//! - `forkscore_refused_total{reason}`: requests or connections refused before any route —
//!   `connections_full` (at the cap with no idle connection to evict), `host`, `origin`
//!
//! A labelled family appears once it has a sample (the crate writes no empty family).

use prometheus::core::Collector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];
const SIZE_BUCKETS: [f64; 9] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
    queue_depth: IntGauge,
    prefix_tokens: IntCounter,
    rows: IntCounter,
    decisions: IntCounter,
    group_size: Histogram,
    merged: Histogram,
    open_connections: IntGauge,
    evicted: IntCounter,
    refused: IntCounterVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Register `c` with `registry` and hand it back. Every name below is a valid, distinct
/// Prometheus name, so registration cannot fail (a test renders them all).
fn registered<C: Collector + Clone + 'static>(registry: &Registry, c: prometheus::Result<C>) -> C {
    let c = c.expect("valid metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("distinct metric names");
    c
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        };
        Metrics {
            requests: registered(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "forkscore_requests_total",
                        "HTTP requests by route and status.",
                    ),
                    &["route", "status"],
                ),
            ),
            latency: registered(
                &r,
                HistogramVec::new(
                    HistogramOpts::new("forkscore_request_duration_seconds", "Request latency.")
                        .buckets(LATENCY_BUCKETS.to_vec()),
                    &["route"],
                ),
            ),
            queue_depth: registered(
                &r,
                IntGauge::new(
                    "forkscore_queue_depth",
                    "Jobs waiting for the model thread.",
                ),
            ),
            prefix_tokens: registered(
                &r,
                IntCounter::new(
                    "forkscore_prefix_tokens_total",
                    "Prefix tokens of scored contexts.",
                ),
            ),
            rows: registered(
                &r,
                IntCounter::new("forkscore_rows_total", "Field rows scored."),
            ),
            decisions: registered(
                &r,
                IntCounter::new("forkscore_decisions_total", "Decisions returned."),
            ),
            group_size: registered(
                &r,
                histogram(
                    "forkscore_group_size",
                    "Contexts per scored context group.",
                    &SIZE_BUCKETS,
                ),
            ),
            merged: registered(
                &r,
                histogram(
                    "forkscore_merged_contexts",
                    "Contexts per merged decide_many call.",
                    &SIZE_BUCKETS,
                ),
            ),
            open_connections: registered(
                &r,
                IntGauge::new("forkscore_open_connections", "Open client connections."),
            ),
            evicted: registered(
                &r,
                IntCounter::new(
                    "forkscore_connections_evicted_total",
                    "Idle connections closed to admit a new one at the connection cap.",
                ),
            ),
            refused: registered(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "forkscore_refused_total",
                        "Requests or connections refused before any route, by reason.",
                    ),
                    &["reason"],
                ),
            ),
            registry: r,
        }
    }

    pub fn request(&self, route: &str, status: u16, seconds: f64) {
        self.requests
            .with_label_values(&[route, &status.to_string()])
            .inc();
        self.latency.with_label_values(&[route]).observe(seconds);
    }
    pub fn queue_add(&self, n: i64) {
        self.queue_depth.add(n);
    }
    pub fn queue_depth(&self) -> i64 {
        self.queue_depth.get()
    }
    /// A connection opened (+1) or closed (-1).
    pub fn connections_add(&self, n: i64) {
        self.open_connections.add(n);
    }
    pub fn open_connections(&self) -> i64 {
        self.open_connections.get()
    }
    /// An idle connection closed to admit a new one at the cap.
    pub fn connection_evicted(&self) {
        self.evicted.inc();
    }
    /// A request or connection refused before any route, for `reason`.
    pub fn refused(&self, reason: &'static str) {
        self.refused.with_label_values(&[reason]).inc();
    }
    /// One merged `decide_many` call of `contexts` contexts.
    pub fn merged_call(&self, contexts: usize) {
        self.merged.observe(contexts as f64);
    }
    /// One decision; `group_size` when it opened its group (slot 0).
    pub fn decision(&self, prefix_tokens: usize, rows: usize, group_size: Option<usize>) {
        self.prefix_tokens.inc_by(prefix_tokens as u64);
        self.rows.inc_by(rows as u64);
        self.decisions.inc();
        if let Some(n) = group_size {
            self.group_size.observe(n as f64);
        }
    }

    /// Every metric in the text exposition format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // the text encoder fails only on a metric family without samples of a known type,
        // which the typed constructors above never produce; the rest is still written then
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_renders_under_its_name() {
        let m = Metrics::new();
        m.request("/v1/score", 200, 0.003);
        m.refused("host");
        m.decision(7, 3, Some(2));
        m.merged_call(4);
        m.queue_add(2);
        m.queue_add(-1);
        m.connections_add(1);
        m.connection_evicted();
        let text = m.render();
        for needle in [
            "# TYPE forkscore_requests_total counter",
            "forkscore_requests_total{route=\"/v1/score\",status=\"200\"} 1",
            "forkscore_request_duration_seconds_bucket{route=\"/v1/score\",le=\"0.001\"} 0",
            "forkscore_request_duration_seconds_bucket{route=\"/v1/score\",le=\"0.005\"} 1",
            "forkscore_request_duration_seconds_count{route=\"/v1/score\"} 1",
            "forkscore_queue_depth 1",
            "forkscore_prefix_tokens_total 7",
            "forkscore_rows_total 3",
            "forkscore_decisions_total 1",
            "forkscore_group_size_count 1",
            "forkscore_merged_contexts_sum 4",
            "forkscore_open_connections 1",
            "forkscore_connections_evicted_total 1",
            "forkscore_refused_total{reason=\"host\"} 1",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
