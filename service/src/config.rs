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
        }
    }
}
