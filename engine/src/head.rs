//! The prompt head that a group's contexts share, prefilled once per process and cached.
//!
//! Every context scored against one schema renders the same text before the context itself:
//! the system instructions and the opening of the user turn. Those tokens (the head) are found
//! by preparing two probe contexts that differ from their first character and taking the longest
//! common token prefix of their prompts ([`SharedPrefix::common_prefix`]). A context whose
//! prefix strictly extends the head continues the head's cached state (`Backend::extend_many`,
//! all of a group's contexts in one call); any other context is prefilled whole. The same tokens
//! reach the model either way, so a decision equals the whole prefill's within f32 rounding.
//!
//! The head depends only on the compiled schema and the engine's tokenizer settings, never on
//! the other contexts of a group, so a context's result still does not depend on its group.
//! States are kept for the [`HEADS`] most recently used heads (a head's state is the model's
//! state after a few hundred tokens: tens of MB on a 4B model's GPU, far less on the CPU).

use crate::fork::SharedPrefix;
use crate::prepare::PreparedContext;
use forkscore_seam::{Backend, PrefixState};
use std::sync::{Arc, Mutex};

/// How many head states are kept.
pub const HEADS: usize = 4;

/// The two probe contexts whose common prompt prefix is the head: different first characters
/// of different classes, so no tokenizer merges them with the text before them alike.
pub const PROBES: [&str; 2] = ["a", "0"];

/// How many prompts' head ids are kept (the probes' tokenization, skipped on a hit).
pub const HEAD_IDS: usize = 32;

/// A prompt's key (the first probe's rendered text) and its head ids (None: no head to share).
type HeadIds = (String, Option<Arc<[u32]>>);

/// The head ids found per prompt (keyed by the first probe's rendered prompt text, which holds
/// everything the head depends on: template, instructions, catalogue, layout), and the cached
/// head states, most recently used last.
pub(crate) struct HeadCache<S> {
    ids: Mutex<Vec<HeadIds>>,
    states: Mutex<Vec<Arc<SharedPrefix<S>>>>,
}

impl<S> Default for HeadCache<S> {
    fn default() -> Self {
        HeadCache {
            ids: Mutex::new(Vec::new()),
            states: Mutex::new(Vec::new()),
        }
    }
}

impl<S: PrefixState> HeadCache<S> {
    /// The head's tokens from the two probes' prepared prompts; None when they share fewer than
    /// [`crate::fork::MIN_SHARED_PREFIX`] tokens (nothing worth a separate prefill).
    pub(crate) fn head_ids(probes: [&PreparedContext; 2]) -> Option<Vec<u32>> {
        let [a, b] = probes.map(|p| p.split().prefix_ids.as_slice());
        SharedPrefix::<S>::common_prefix(a, [b]).map(<[u32]>::to_vec)
    }

    /// The head ids of the prompt rendered as `key`, found by `find` (the probes' preparation)
    /// on a miss and kept for the next [`HEAD_IDS`] prompts; None (also cached) when there is no
    /// head worth sharing.
    pub(crate) fn ids_for(
        &self,
        key: &str,
        find: impl FnOnce() -> Option<Vec<u32>>,
    ) -> Option<Arc<[u32]>> {
        {
            let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(pos) = ids.iter().position(|(k, _)| k == key) {
                let hit = ids.remove(pos);
                let found = hit.1.clone();
                ids.push(hit);
                return found;
            }
        }
        let found: Option<Arc<[u32]>> = find().map(Arc::from);
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        if !ids.iter().any(|(k, _)| k == key) {
            if ids.len() >= HEAD_IDS {
                ids.remove(0);
            }
            ids.push((key.to_string(), found.clone()));
        }
        found
    }

    /// The state of `ids`, from the cache or prefilled now (outside the lock: two threads may
    /// prefill one head at once; the later insert is dropped). None when the prefill fails: the
    /// caller prefills its contexts whole.
    pub(crate) fn state<B: Backend<State = S>>(
        &self,
        backend: &B,
        ids: &[u32],
    ) -> Option<Arc<SharedPrefix<S>>> {
        if let Some(hit) = self.take(ids) {
            return Some(hit);
        }
        let fresh = Arc::new(SharedPrefix::prefill(backend, ids).ok()?);
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pos) = states.iter().position(|s| s.ids() == ids) {
            return Some(states[pos].clone());
        }
        if states.len() >= HEADS {
            states.remove(0);
        }
        states.push(fresh.clone());
        Some(fresh)
    }

    /// A cached state of `ids`, moved to the most recently used end.
    fn take(&self, ids: &[u32]) -> Option<Arc<SharedPrefix<S>>> {
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        let pos = states.iter().position(|s| s.ids() == ids)?;
        let hit = states.remove(pos);
        states.push(hit.clone());
        Some(hit)
    }

    /// How many head states are cached.
    pub(crate) fn len(&self) -> usize {
        self.states.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}
