//! Compiled schemas cached by schema hash, and schema files by path, so a job compiles each
//! distinct schema once whatever the number of lines that use it.

use super::records::{question_schema, ErrorKind, LineError, SchemaRef};
use forkscore_backends::Backend;
use forkscore_engine::{CompiledSchema, Engine, Schema};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Distinct schemas kept compiled at once (the cache is cleared when it grows past this).
const SCHEMA_CACHE_ENTRIES: usize = 4_096;

/// Compiled schemas by schema hash, and schema files by path.
pub struct SchemaCache {
    default: Option<Result<Arc<CompiledSchema>, LineError>>,
    base_dir: PathBuf,
    compiled: Mutex<HashMap<String, Result<Arc<CompiledSchema>, LineError>>>,
    files: Mutex<HashMap<PathBuf, Result<Schema, LineError>>>,
}

impl SchemaCache {
    pub fn new<B: Backend>(
        engine: &Engine<B>,
        default: Option<&Schema>,
        base_dir: &Path,
    ) -> SchemaCache {
        SchemaCache {
            default: default.map(|s| {
                engine
                    .compile(s)
                    .map(Arc::new)
                    .map_err(|e| LineError::from_engine(&e))
            }),
            base_dir: base_dir.to_path_buf(),
            compiled: Mutex::new(HashMap::new()),
            files: Mutex::new(HashMap::new()),
        }
    }

    fn compile<B: Backend>(
        &self,
        engine: &Engine<B>,
        schema: &Schema,
    ) -> Result<Arc<CompiledSchema>, LineError> {
        let hash = schema.hash();
        if let Some(hit) = self
            .compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&hash)
        {
            return hit.clone();
        }
        let made = engine
            .compile(schema)
            .map(Arc::new)
            .map_err(|e| LineError::from_engine(&e));
        let mut map = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= SCHEMA_CACHE_ENTRIES {
            map.clear();
        }
        map.entry(hash).or_insert(made).clone()
    }

    fn file(&self, path: &Path) -> Result<Schema, LineError> {
        let full = self.base_dir.join(path);
        if let Some(hit) = self
            .files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&full)
        {
            return hit.clone();
        }
        let loaded = std::fs::read_to_string(&full)
            .map_err(|e| {
                LineError::new(
                    ErrorKind::SchemaFile,
                    format!("cannot read schema file {}: {e}", full.display()),
                )
            })
            .and_then(|text| {
                Schema::from_json_str(&text).map_err(|e| {
                    LineError::new(
                        ErrorKind::InvalidSchema,
                        format!("invalid schema file {}: {e}", full.display()),
                    )
                })
            });
        let mut map = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= SCHEMA_CACHE_ENTRIES {
            map.clear();
        }
        map.entry(full).or_insert(loaded).clone()
    }

    /// The compiled schema a line asks for.
    pub fn resolve<B: Backend>(
        &self,
        engine: &Engine<B>,
        r: &SchemaRef,
    ) -> Result<Arc<CompiledSchema>, LineError> {
        let invalid = |e: forkscore_engine::SchemaError| {
            LineError::new(ErrorKind::InvalidSchema, format!("invalid schema: {e}"))
        };
        match r {
            SchemaRef::Default => self.default.clone().unwrap_or_else(|| {
                Err(LineError::new(
                    ErrorKind::MissingSchema,
                    "line has no \"schema\", \"schema_file\" or \"question\" and the job has no default --schema-file",
                ))
            }),
            SchemaRef::Inline(v) => self.compile(engine, &Schema::from_value(v).map_err(invalid)?),
            SchemaRef::Question(q) => self.compile(engine, &Schema::from_value(&question_schema(q)).map_err(invalid)?),
            SchemaRef::File(p) => self.compile(engine, &self.file(p)?),
        }
    }
}
