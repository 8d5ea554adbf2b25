//! Compiled schemas, cached by schema hash (bounded; the oldest entry goes first), so a schema
//! sent with every request is compiled once and requests with equal schemas share one
//! `Arc<CompiledSchema>` — which is what lets the queue merge them.

use forkscore_engine::{CompiledSchema, Engine, EngineError, Schema};
use forkscore_seam::Backend;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

pub struct SchemaCache {
    capacity: usize,
    entries: Mutex<VecDeque<(String, Arc<CompiledSchema>)>>,
}

impl SchemaCache {
    pub fn new(capacity: usize) -> SchemaCache {
        SchemaCache {
            capacity: capacity.max(1),
            entries: Mutex::new(VecDeque::new()),
        }
    }

    /// The compiled form of `schema` (compiled on a miss).
    pub fn get<B: Backend>(
        &self,
        engine: &Engine<B>,
        schema: &Schema,
    ) -> Result<Arc<CompiledSchema>, EngineError> {
        let hash = schema.hash();
        if let Some((_, c)) = self.lock().iter().find(|(h, _)| *h == hash) {
            return Ok(c.clone());
        }
        let compiled = Arc::new(engine.compile(schema)?);
        let mut entries = self.lock();
        if entries.len() >= self.capacity {
            entries.pop_front();
        }
        entries.push_back((hash, compiled.clone()));
        Ok(compiled)
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(String, Arc<CompiledSchema>)>> {
        // a panic while holding the lock cannot leave the list inconsistent (push/pop only)
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}
