//! Prometheus metrics in the text exposition format (version 0.0.4), written by hand: a few
//! counters, one gauge and fixed-bucket histograms, behind one mutex (updates are per request
//! and per merged call, never per token).
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

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];
const SIZE_BUCKETS: [f64; 9] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

#[derive(Debug, Clone, Default)]
struct Histogram {
    /// Cumulative counts per bucket bound (same order as the bounds).
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, bounds: &[f64], v: f64) {
        if self.buckets.is_empty() {
            self.buckets = vec![0; bounds.len()];
        }
        for (b, bound) in self.buckets.iter_mut().zip(bounds) {
            if v <= *bound {
                *b += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }
    fn write(&self, out: &mut String, name: &str, labels: &str, bounds: &[f64]) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, bound) in bounds.iter().enumerate() {
            let n = self.buckets.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        );
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", self.count);
    }
}

#[derive(Default)]
struct Inner {
    requests: BTreeMap<(String, u16), u64>,
    latency: BTreeMap<String, Histogram>,
    prefix_tokens: u64,
    rows: u64,
    decisions: u64,
    group_size: Histogram,
    merged: Histogram,
    refused: BTreeMap<&'static str, u64>,
}

#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
    queue_depth: AtomicI64,
    open_connections: AtomicI64,
    evicted: AtomicU64,
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
    pub fn request(&self, route: &str, status: u16, seconds: f64) {
        let mut m = self.lock();
        *m.requests.entry((route.to_string(), status)).or_default() += 1;
        m.latency
            .entry(route.to_string())
            .or_default()
            .observe(&LATENCY_BUCKETS, seconds);
    }
    pub fn queue_add(&self, n: i64) {
        self.queue_depth.fetch_add(n, Ordering::Relaxed);
    }
    pub fn queue_depth(&self) -> i64 {
        self.queue_depth.load(Ordering::Relaxed)
    }
    /// A connection opened (+1) or closed (-1).
    pub fn connections_add(&self, n: i64) {
        self.open_connections.fetch_add(n, Ordering::Relaxed);
    }
    pub fn open_connections(&self) -> i64 {
        self.open_connections.load(Ordering::Relaxed)
    }
    /// An idle connection closed to admit a new one at the cap.
    pub fn connection_evicted(&self) {
        self.evicted.fetch_add(1, Ordering::Relaxed);
    }
    /// A request or connection refused before any route, for `reason`.
    pub fn refused(&self, reason: &'static str) {
        *self.lock().refused.entry(reason).or_default() += 1;
    }
    /// One merged `decide_many` call of `contexts` contexts.
    pub fn merged_call(&self, contexts: usize) {
        self.lock().merged.observe(&SIZE_BUCKETS, contexts as f64);
    }
    /// One decision; `group_size` when it opened its group (slot 0).
    pub fn decision(&self, prefix_tokens: usize, rows: usize, group_size: Option<usize>) {
        let mut m = self.lock();
        m.prefix_tokens += prefix_tokens as u64;
        m.rows += rows as u64;
        m.decisions += 1;
        if let Some(n) = group_size {
            m.group_size.observe(&SIZE_BUCKETS, n as f64);
        }
    }

    pub fn render(&self) -> String {
        let m = self.lock();
        let mut out = String::new();
        out.push_str("# HELP forkscore_requests_total HTTP requests by route and status.\n# TYPE forkscore_requests_total counter\n");
        for ((route, status), n) in &m.requests {
            let _ = writeln!(
                out,
                "forkscore_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        out.push_str("# HELP forkscore_request_duration_seconds Request latency.\n# TYPE forkscore_request_duration_seconds histogram\n");
        for (route, h) in &m.latency {
            h.write(
                &mut out,
                "forkscore_request_duration_seconds",
                &format!("route=\"{route}\""),
                &LATENCY_BUCKETS,
            );
        }
        let _ = writeln!(
            out,
            "# HELP forkscore_queue_depth Jobs waiting for the model thread.\n# TYPE forkscore_queue_depth gauge\nforkscore_queue_depth {}",
            self.queue_depth()
        );
        for (name, help, v) in [
            (
                "forkscore_prefix_tokens_total",
                "Prefix tokens of scored contexts.",
                m.prefix_tokens,
            ),
            ("forkscore_rows_total", "Field rows scored.", m.rows),
            (
                "forkscore_decisions_total",
                "Decisions returned.",
                m.decisions,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP forkscore_open_connections Open client connections.\n# TYPE forkscore_open_connections gauge\nforkscore_open_connections {}",
            self.open_connections()
        );
        let _ = writeln!(
            out,
            "# HELP forkscore_connections_evicted_total Idle connections closed to admit a new one at the connection cap.\n# TYPE forkscore_connections_evicted_total counter\nforkscore_connections_evicted_total {}",
            self.evicted.load(Ordering::Relaxed)
        );
        out.push_str("# HELP forkscore_refused_total Requests or connections refused before any route, by reason.\n# TYPE forkscore_refused_total counter\n");
        for (reason, n) in &m.refused {
            let _ = writeln!(out, "forkscore_refused_total{{reason=\"{reason}\"}} {n}");
        }
        out.push_str("# HELP forkscore_group_size Contexts per scored context group.\n# TYPE forkscore_group_size histogram\n");
        m.group_size
            .write(&mut out, "forkscore_group_size", "", &SIZE_BUCKETS);
        out.push_str("# HELP forkscore_merged_contexts Contexts per merged decide_many call.\n# TYPE forkscore_merged_contexts histogram\n");
        m.merged
            .write(&mut out, "forkscore_merged_contexts", "", &SIZE_BUCKETS);
        out
    }
}
