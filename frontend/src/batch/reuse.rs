//! Reuse across lines in `serial` and `shared` batch modes.
//!
//! - Decisions: `serial` answers consecutive lines with the same schema and context from one
//!   decision; `shared` (one job-wide context) answers every line whose schema was already
//!   decided. A reused decision is recorded with `reused_from_line`.
//! - Shared prefix: lines with the same context keep one retained state of their longest common
//!   token prefix (instructions + context, checked per line through the engine's
//!   [`SharedPrefix`]); each schema's prompt extends it instead of prefilling from scratch.

use super::prepare::{ready, Item, Ready};
use super::BatchMode;
use forkscore_backends::Backend;
use forkscore_engine::{Decision, Engine, SharedPrefix};
use std::collections::HashMap;

/// Decisions kept at once in `shared` mode (cleared when it grows past this).
const REUSE_ENTRIES: usize = 4_096;

/// What a line is reused by: its schema hash and (serial) its context hash.
pub type ReuseKey = (String, u64);

/// The reuse state of one job.
pub struct Reuse<S> {
    mode: BatchMode,
    /// serial: the last decision, keyed by (schema hash, context hash); shared: by schema hash.
    decisions: HashMap<ReuseKey, (u64, Decision)>,
    /// The retained prefix that lines of one context share (context hash, state).
    shared: Option<(u64, SharedPrefix<S>)>,
}

impl<S: forkscore_backends::PrefixState> Reuse<S> {
    pub fn new(mode: BatchMode) -> Self {
        Reuse {
            mode,
            decisions: HashMap::new(),
            shared: None,
        }
    }

    /// The key `r` is reused by.
    pub fn key(&self, r: &Ready) -> ReuseKey {
        let ctx = if self.mode == BatchMode::Serial {
            r.context_hash
        } else {
            0
        };
        (r.compiled.schema_hash().to_string(), ctx)
    }

    /// The line and decision a line with `key` can reuse.
    pub fn lookup(&self, key: &ReuseKey) -> Option<(u64, &Decision)> {
        self.decisions.get(key).map(|(line, d)| (*line, d))
    }

    /// Remember `decision` (decided for `line`) for later lines with `key`.
    pub fn remember(&mut self, key: ReuseKey, line: u64, decision: &Decision) {
        if self.mode == BatchMode::Serial || self.decisions.len() >= REUSE_ENTRIES {
            self.decisions.clear();
        }
        self.decisions.insert(key, (line, decision.clone()));
    }

    /// The retained shared prefix, if one is kept.
    pub fn shared(&self) -> Option<&SharedPrefix<S>> {
        self.shared.as_ref().map(|(_, s)| s)
    }

    /// Keep (or build) the retained state of the prefix that `first` shares with the other
    /// lines of its context (`ctx`): serial — the lines of the same context in this chunk;
    /// shared — every line. Without a second line (or a long enough common prefix) there is
    /// nothing to share and no state is kept.
    pub fn refresh_shared<B: Backend<State = S>>(
        &mut self,
        engine: &Engine<B>,
        first: &Ready,
        ctx: u64,
        items: &[Item],
    ) {
        let ids = &first.prepared.split().prefix_ids;
        if let Some((h, shared)) = &self.shared {
            if *h == ctx && shared.covers(ids) {
                return;
            }
        }
        self.shared = None;
        let serial = self.mode == BatchMode::Serial;
        let others = items
            .iter()
            .filter_map(ready)
            .filter(|r| r.line != first.line && !(serial && r.context_hash != ctx))
            .map(|r| r.prepared.split().prefix_ids.as_slice());
        let Some(common) = SharedPrefix::<S>::common_prefix(ids, others) else {
            return;
        };
        // A failed prefill only means no sharing: each line then prefills on its own.
        if let Ok(shared) = engine.share_prefix(common) {
            self.shared = Some((ctx, shared));
        }
    }
}
