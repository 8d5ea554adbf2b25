//! Service limits, fixed at start-up (the CLI range-checks them before the model loads).

use forkscore_engine::{GroupBudget, DEFAULT_MAX_INPUT_TOKENS};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Largest request body in bytes (larger: 413, unread beyond the bound).
    pub max_body_bytes: usize,
    /// Most contexts in one `/v1/decide_many` request.
    pub max_contexts_per_request: usize,
    /// Token bound of every prompt; a request may lower it, never raise it.
    pub max_input_tokens: usize,
    /// Jobs waiting for the model thread; a full queue answers 503 at once.
    pub queue_capacity: usize,
    /// Most contexts the model thread merges into one drain of the queue.
    pub max_merged_contexts: usize,
    /// How long a request may wait for its result (then 504; the job is dropped unscored).
    pub request_timeout: Duration,
    /// Group budget, the same as `forkscore batch` uses.
    pub budget: GroupBudget,
    /// Distinct compiled schemas kept.
    pub schema_cache: usize,
    /// End-of-sequence ids `/v1/generate` stops at besides the tokenizer's own (the CLI reads
    /// them from the checkpoint's `generation_config.json` / `config.json`, as `forkscore
    /// generate` does).
    pub eos_ids: Vec<u32>,
    /// Open connections at most. A connection past the cap evicts the one that has gone longest
    /// without a request in flight; when every open connection has one, it is refused (503).
    pub max_connections: usize,
    /// A request head must arrive complete within this of the connection opening or of the
    /// previous response; otherwise the connection is closed (slow heads, idle keep-alive and
    /// half-open connections alike).
    pub header_read_timeout: Duration,
    /// A request body must arrive complete within this of its head (then 408, connection closed).
    pub body_read_timeout: Duration,
    /// After the stop signal: requests in flight may finish for this long; then every remaining
    /// connection is dropped and [`crate::serve`] returns.
    pub shutdown_deadline: Duration,
    /// Schema compiles running at once (each on a blocking thread, off the async workers);
    /// a request waiting for a slot waits within its `request_timeout`.
    pub max_concurrent_compiles: usize,
    /// `Host` names accepted besides the bound address's own (see [`crate::guard`]); `*`: any.
    pub allowed_hosts: Vec<String>,
    /// `Origin`s accepted besides the server's own (see [`crate::guard`]); `*`: any.
    pub allowed_origins: Vec<String>,
    /// Whether handlers prepare a job's contexts before queuing it (the default), or leave it to
    /// the model thread between passes (the earlier form, kept for A/B timings:
    /// `FORKSCORE_SERVE_PREPARE=model-thread`). Decisions are the same either way.
    pub prepare_in_handlers: bool,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            max_body_bytes: 4 << 20,
            max_contexts_per_request: 256,
            max_input_tokens: DEFAULT_MAX_INPUT_TOKENS,
            queue_capacity: 1024,
            max_merged_contexts: 256,
            request_timeout: Duration::from_secs(60),
            budget: GroupBudget::default(),
            schema_cache: 64,
            eos_ids: Vec::new(),
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            shutdown_deadline: Duration::from_secs(10),
            max_concurrent_compiles: 2,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            prepare_in_handlers: true,
        }
    }
}
