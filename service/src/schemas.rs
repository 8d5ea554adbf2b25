//! Compiled schemas, cached by schema hash (bounded; the oldest entry goes first), so a schema
//! sent with every request is compiled once and requests with equal schemas share one
//! `Arc<CompiledSchema>` — which is what lets the queue merge them.
//!
//! A miss compiles on tokio's blocking pool, never on an async worker, so a slow compile cannot
//! stall `/health`, other requests or shutdown. At most `max_concurrent` compiles run at once
//! (a bounded share of the CPU for hostile schemas); the wait for a slot and the compile both
//! count against the request's deadline (504 after it). A compile that outlives its request
//! runs on to its end and its result is cached, so a retry of the same schema is quick.

use crate::error::ApiError;
use axum::http::StatusCode;
use forkscore_engine::{CompiledSchema, Engine, EngineError, Schema};
use forkscore_seam::Backend;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::{timeout_at, Instant};

type Entries = Mutex<VecDeque<(String, Arc<CompiledSchema>)>>;

pub struct SchemaCache {
    capacity: usize,
    entries: Arc<Entries>,
    compiles: Arc<Semaphore>,
}

impl SchemaCache {
    pub fn new(capacity: usize, max_concurrent: usize) -> SchemaCache {
        SchemaCache {
            capacity: capacity.max(1),
            entries: Arc::new(Mutex::new(VecDeque::new())),
            compiles: Arc::new(Semaphore::new(max_concurrent.max(1))),
        }
    }

    /// The compiled form of `schema` (compiled on a miss), by `deadline`: a compile error is the
    /// engine's 4xx at path `schema`, a compile not done by then a 504 `timeout` (`timeout`
    /// names the request's bound in the message).
    pub async fn get<B: Backend + 'static>(
        &self,
        engine: &Arc<Engine<B>>,
        schema: Schema,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Arc<CompiledSchema>, ApiError> {
        let engine = engine.clone();
        self.get_with(schema, deadline, timeout, move |s| engine.compile(s))
            .await
    }

    /// [`SchemaCache::get`] with the compile step given (it runs on the blocking pool).
    pub async fn get_with<F>(
        &self,
        schema: Schema,
        deadline: Instant,
        timeout: Duration,
        compile: F,
    ) -> Result<Arc<CompiledSchema>, ApiError>
    where
        F: FnOnce(&Schema) -> Result<CompiledSchema, EngineError> + Send + 'static,
    {
        let hash = schema.hash();
        if let Some(c) = lookup(&self.entries, &hash) {
            return Ok(c);
        }
        let late = || {
            ApiError::bad(
                "timeout",
                "schema",
                format!("the schema did not compile within the request timeout of {timeout:?}"),
            )
            .with_status(StatusCode::GATEWAY_TIMEOUT)
        };
        let permit = timeout_at(deadline, self.compiles.clone().acquire_owned())
            .await
            .map_err(|_| late())?
            .map_err(|_| {
                ApiError::bad("backend", "<root>", "the schema compiler is shut down")
                    .with_status(StatusCode::INTERNAL_SERVER_ERROR)
            })?;
        // another request may have compiled the same schema while this one waited
        if let Some(c) = lookup(&self.entries, &hash) {
            return Ok(c);
        }
        let (entries, capacity) = (self.entries.clone(), self.capacity);
        let task = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let compiled = Arc::new(compile(&schema)?);
            let mut list = lock(&entries);
            if !list.iter().any(|(h, _)| *h == hash) {
                if list.len() >= capacity {
                    list.pop_front();
                }
                list.push_back((hash, compiled.clone()));
            }
            Ok(compiled)
        });
        match timeout_at(deadline, task).await {
            Ok(Ok(Ok(compiled))) => Ok(compiled),
            Ok(Ok(Err(e))) => Err(ApiError::from_engine(&e, "schema")),
            Ok(Err(_)) => Err(
                ApiError::bad("compile", "schema", "the schema compile failed")
                    .with_status(StatusCode::INTERNAL_SERVER_ERROR),
            ),
            Err(_) => Err(late()),
        }
    }

    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn lookup(entries: &Entries, hash: &str) -> Option<Arc<CompiledSchema>> {
    lock(entries)
        .iter()
        .find(|(h, _)| h == hash)
        .map(|(_, c)| c.clone())
}

fn lock(entries: &Entries) -> std::sync::MutexGuard<'_, VecDeque<(String, Arc<CompiledSchema>)>> {
    // a panic while holding the lock cannot leave the list inconsistent (push/pop only)
    entries.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkscore_engine::{CalibrationRegistry, ChatTokenizer, CheckpointIdentity};
    use forkscore_testkit::fake::FakeBackend;
    use forkscore_testkit::tokenizers::{Family, Fixture};
    use serde_json::json;
    use std::time::Instant as StdInstant;

    fn engine() -> Arc<Engine<FakeBackend>> {
        let f = Family::Qwen2;
        let tok = ChatTokenizer::from_parts(
            &f.tokenizer_json().expect("tokenizer fixture"),
            Some(f.tokenizer_config_json()),
            None,
            "qwen2",
            std::path::Path::new("fixtures"),
        )
        .expect("fixture tokenizer loads");
        Arc::new(
            Engine::new(
                FakeBackend::new(1),
                tok,
                CheckpointIdentity::default(),
                CalibrationRegistry::built_in(),
            )
            .expect("engine"),
        )
    }

    fn schema() -> Schema {
        Schema::from_value(&json!({"f": {"type": "boolean", "description": "d"}})).unwrap()
    }

    // A current-thread runtime has ONE async worker: had the compile run on it, the timeout
    // could not fire before the compile ended. It fires on time, the compile finishes in the
    // background, and its result is cached for the next request.
    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_compile_is_a_504_at_the_deadline_off_the_async_worker() {
        let e = engine();
        let cache = SchemaCache::new(4, 1);
        let timeout = Duration::from_millis(100);
        let started = StdInstant::now();
        let slow = {
            let e = e.clone();
            move |s: &Schema| {
                std::thread::sleep(Duration::from_millis(1500));
                e.compile(s)
            }
        };
        let err = cache
            .get_with(schema(), Instant::now() + timeout, timeout, slow)
            .await
            .unwrap_err();
        assert_eq!(
            (err.status, err.kind, err.path.as_str()),
            (StatusCode::GATEWAY_TIMEOUT, "timeout", "schema")
        );
        assert!(
            started.elapsed() < Duration::from_millis(1000),
            "{:?}",
            started.elapsed()
        );
        // a second compile waits for the only slot, within its own deadline
        let err = cache
            .get_with(
                schema(),
                Instant::now() + timeout,
                timeout,
                |_| unreachable!(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.status, StatusCode::GATEWAY_TIMEOUT);
        // the abandoned compile ends and is cached: a later request gets it without compiling
        while cache.is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "compile never cached"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let far = Instant::now() + Duration::from_secs(5);
        let got = cache
            .get_with(schema(), far, timeout, |_| unreachable!("cached"))
            .await
            .unwrap();
        assert_eq!(
            got.schema_hash(),
            e.compile(&schema()).unwrap().schema_hash()
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_compile_error_is_the_engines_4xx_at_schema() {
        let e = engine();
        let cache = SchemaCache::new(4, 2);
        let far = Instant::now() + Duration::from_secs(30);
        let got = cache
            .get_with(schema(), far, Duration::from_secs(30), |_| {
                Err(EngineError::ZeroFieldBatch)
            })
            .await
            .unwrap_err();
        assert_eq!(
            got,
            ApiError::from_engine(&EngineError::ZeroFieldBatch, "schema")
        );
        assert!(cache.is_empty(), "a failed compile is not cached");
        let ok = cache
            .get(&e, schema(), far, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(cache.len(), 1);
        let again = cache
            .get(&e, schema(), far, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(Arc::ptr_eq(&ok, &again), "one compile shared");
    }
}
