//! `forkscore` for Python: the native module `forkscore._native` (pyo3), re-exported by the
//! pure-Python package `forkscore` (python/forkscore). Everything here is a thin layer over the
//! Rust crates: the model is opened by `forkscore_frontend::load::open` (what the CLI uses), a
//! result is serialized by `forkscore_frontend::result::decision_json` (what `forkscore score`
//! prints) and batch records by `forkscore_frontend::batch::lines::score_lines` (the records of
//! `forkscore batch`), so the Python results cannot drift from the CLI's. Scoring runs with the
//! GIL released (`Python::detach`).

use forkscore_backends::candle::device::{ComputeDType, DeviceSpec};
use forkscore_backends::candle::CandleBackend;
use forkscore_backends::Quantization;
use forkscore_engine::schema::Scoring;
use forkscore_engine::{
    CompiledSchema, Engine, EngineError, GroupBudget, Schema, DEFAULT_MAX_INPUT_TOKENS,
};
use forkscore_frontend::batch::lines::{score_lines, LinesError, LinesJob};
use forkscore_frontend::batch::{item::LineError, BatchMode};
use forkscore_frontend::bounds::{
    check_context_len, check_flags, BoundedReadError, FlagRangeError,
};
use forkscore_frontend::device_memory::cuda_memory_bytes;
use forkscore_frontend::load::{self, LoadError, ModelSpec};
use forkscore_frontend::provenance::ModelProvenance;
use forkscore_frontend::result::decision_json;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};
use std::path::PathBuf;

mod options;
use options::{option_error, options, parse};

create_exception!(
    forkscore,
    Error,
    PyException,
    "Base class of every forkscore error. `kind` is the error kind of `forkscore batch` records."
);
create_exception!(
    forkscore,
    SchemaError,
    Error,
    "The schema was rejected; `path` is the JSON path of the offending value."
);
create_exception!(
    forkscore,
    CompileError,
    Error,
    "A valid schema that cannot be scored with this model's tokenizer (e.g. two literal choices that tokenize alike)."
);
create_exception!(
    forkscore,
    ContextError,
    Error,
    "The context cannot be scored as given (base of EmptyContext and TooManyTokens)."
);
create_exception!(
    forkscore,
    EmptyContext,
    ContextError,
    "The context is empty."
);
create_exception!(
    forkscore,
    TooManyTokens,
    ContextError,
    "The prompt is over max_input_tokens (or the model's limit); forkscore never truncates."
);
create_exception!(
    forkscore,
    OptionsError,
    Error,
    "An option is out of range or unknown (mode, temperature, max_input_tokens, ...)."
);
create_exception!(
    forkscore,
    ModelLoadError,
    Error,
    "The model could not be loaded (missing folder, revision or refs/main, bad checkpoint, tokenizer, calibration file)."
);
create_exception!(
    forkscore,
    TemplateError,
    Error,
    "The chat template failed or dropped the context."
);
create_exception!(
    forkscore,
    ScoringError,
    Error,
    "The model failed while scoring (backend error, non-finite logits, prompt split)."
);

/// The exception of an engine error (an exhaustive match: a new variant must be mapped here),
/// with `kind` set to the batch record kind of the same error.
fn engine_error(py: Python<'_>, e: &EngineError) -> PyErr {
    let message = e.to_string();
    let err = match e {
        EngineError::Compile(_) | EngineError::ForeignSchema | EngineError::ForeignPrepared => {
            CompileError::new_err(message)
        }
        EngineError::Template(_) | EngineError::ContextNotInPrompt => {
            TemplateError::new_err(message)
        }
        EngineError::EmptyContext | EngineError::EmptyText | EngineError::TooFewTokens { .. } => {
            EmptyContext::new_err(message)
        }
        EngineError::TooManyTokens { .. }
        | EngineError::TextTooLong { .. }
        | EngineError::TextOverModelLimit { .. } => TooManyTokens::new_err(message),
        EngineError::Calibration(_)
        | EngineError::ZeroFieldBatch
        | EngineError::ZeroMaxInputTokens
        | EngineError::TopKTooLarge { .. } => OptionsError::new_err(message),
        EngineError::TokenizerLargerThanEmbedding { .. } => ModelLoadError::new_err(message),
        EngineError::Split(_)
        | EngineError::Backend(_)
        | EngineError::Assemble(_)
        | EngineError::MissingMember { .. }
        | EngineError::NonFiniteLogits { .. } => ScoringError::new_err(message),
    };
    with_kind(py, err, &LineError::from_engine(e).kind)
}

/// Sets `kind` (the snake_case record kind) on the exception value.
fn with_kind(py: Python<'_>, err: PyErr, kind: &impl serde::Serialize) -> PyErr {
    let kind = match serde_json::to_value(kind) {
        Ok(serde_json::Value::String(s)) => s,
        _ => "error".to_string(),
    };
    // setting an attribute on a fresh exception instance cannot fail in practice; if it did,
    // the exception still carries its message
    let _ = err.value(py).setattr("kind", kind);
    err
}

fn load_error(py: Python<'_>, e: &LoadError) -> PyErr {
    match e {
        // a dtype this CPU cannot run fast: the caller's option, named with the alternatives
        LoadError::Precision(_) => with_kind(py, OptionsError::new_err(e.to_string()), &"options"),
        LoadError::Backend(_)
        | LoadError::Tokenizer(_)
        | LoadError::Engine(_)
        | LoadError::Calibration(_)
        | LoadError::NothingQuantized { .. } => {
            with_kind(py, ModelLoadError::new_err(e.to_string()), &"model_load")
        }
    }
}

fn schema_error(py: Python<'_>, e: &forkscore_engine::SchemaError) -> PyErr {
    let err = with_kind(py, SchemaError::new_err(e.to_string()), &"invalid_schema");
    let _ = err.value(py).setattr("path", e.path.clone());
    let _ = err.value(py).setattr("rule", e.kind.to_string());
    err
}

fn flag_error(py: Python<'_>, e: &FlagRangeError) -> PyErr {
    with_kind(py, OptionsError::new_err(e.to_string()), &"options")
}

fn bounded_error(py: Python<'_>, e: &BoundedReadError) -> PyErr {
    match e {
        BoundedReadError::TooLong { .. } => with_kind(
            py,
            TooManyTokens::new_err(e.to_string()),
            &"too_many_tokens",
        ),
        BoundedReadError::Directory { .. }
        | BoundedReadError::Io { .. }
        | BoundedReadError::NotUtf8 { .. } => {
            with_kind(py, ContextError::new_err(e.to_string()), &"context")
        }
    }
}

fn lines_error(py: Python<'_>, e: &LinesError) -> PyErr {
    match e {
        LinesError::Options(e) => engine_error(py, e),
        LinesError::Flag(e) => flag_error(py, e),
        LinesError::SharedMode => with_kind(py, OptionsError::new_err(e.to_string()), &"options"),
        LinesError::Provenance(_) | LinesError::Stage(_) => {
            with_kind(py, Error::new_err(e.to_string()), &"batch")
        }
    }
}

/// The schema's JSON text: a `str` as it is, anything else through `json.dumps` (dict order
/// kept, NaN refused).
fn schema_text(py: Python<'_>, schema: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = schema.cast::<PyString>() {
        return s.extract::<String>();
    }
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("allow_nan", false)?;
    kwargs.set_item("ensure_ascii", false)?;
    py.import("json")?
        .call_method("dumps", (schema,), Some(&kwargs))
        .and_then(|t| t.extract::<String>())
        .map_err(|e| {
            let err = with_kind(
                py,
                SchemaError::new_err(format!(
                    "schema error at `<root>`: the schema is neither a JSON string nor JSON-serializable ({e})"
                )),
                &"invalid_schema",
            );
            let _ = err.value(py).setattr("path", "<root>");
            err
        })
}

fn parse_schema(py: Python<'_>, schema: &Bound<'_, PyAny>, scoring: Scoring) -> PyResult<Schema> {
    let text = schema_text(py, schema)?;
    Schema::from_json_str_with(&text, scoring).map_err(|e| schema_error(py, &e))
}

fn to_python<'py>(py: Python<'py>, value: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value).map_err(|e| Error::new_err(e.to_string()))?;
    py.import("json")?.call_method1("loads", (text,))
}

/// A loaded model, ready to score. Thread-safe: calls from several Python threads run with
/// the GIL released and share the one model.
#[pyclass(frozen, module = "forkscore")]
struct Scorer {
    engine: Engine<CandleBackend>,
    provenance: ModelProvenance,
    /// `provenance` as the JSON object every result's provenance starts from.
    model: serde_json::Map<String, serde_json::Value>,
    device: DeviceSpec,
}

impl Scorer {
    /// Compile `schema`, refused at once when it alone is over `max_input_tokens`.
    fn compile(
        &self,
        py: Python<'_>,
        schema: &Schema,
        max_input_tokens: usize,
    ) -> PyResult<CompiledSchema> {
        py.detach(|| self.engine.compile_within(schema, max_input_tokens))
            .map_err(|e| engine_error(py, &e))
    }

    fn budget(&self) -> GroupBudget {
        GroupBudget::for_device(cuda_memory_bytes(self.device), &self.engine.memory_model())
    }
}

#[pymethods]
impl Scorer {
    /// Load a model exactly as `forkscore score --model ... --revision ...` does (see
    /// docs/python.md).
    #[staticmethod]
    #[pyo3(signature = (model, revision=None, device="cpu", dtype=None, *, prefill_chunk=None, quantize=None, calibration_file=None, context_special_tokens=false, deterministic=false))]
    #[allow(clippy::too_many_arguments)]
    fn load(
        py: Python<'_>,
        model: String,
        revision: Option<String>,
        device: &str,
        dtype: Option<&str>,
        prefill_chunk: Option<usize>,
        quantize: Option<&str>,
        calibration_file: Option<PathBuf>,
        context_special_tokens: bool,
        deterministic: bool,
    ) -> PyResult<Scorer> {
        check_flags(&[("--prefill-chunk", prefill_chunk)]).map_err(|e| flag_error(py, &e))?;
        let device = parse::<DeviceSpec>(py, "device", device)?;
        let args = ModelSpec {
            model,
            revision,
            device,
            dtype: dtype
                .map(|d| parse::<ComputeDType>(py, "dtype", d))
                .transpose()?,
            prefill_chunk,
            quantize: quantize
                .map(|q| parse::<Quantization>(py, "quantize", q))
                .transpose()?,
            calibration_file,
            deterministic,
        };
        let loaded = py
            .detach(|| load::open(&args))
            .map_err(|e| load_error(py, &e))?;
        let model = loaded.provenance.object();
        let model = model.map_err(|e| Error::new_err(e.to_string()))?;
        Ok(Scorer {
            engine: loaded
                .engine
                .with_context_special_tokens(context_special_tokens),
            provenance: loaded.provenance,
            model,
            device,
        })
    }

    /// What provenance records about the loaded model (a dict).
    #[getter]
    fn provenance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &serde_json::Value::Object(self.model.clone()))
    }

    fn __repr__(&self) -> String {
        format!(
            "Scorer(model={:?}, revision={:?}, device={:?}, dtype={:?})",
            self.provenance.model_id,
            self.provenance.revision,
            self.provenance.device.to_string(),
            self.provenance.dtype.to_string()
        )
    }

    /// One context against one schema: the dict `forkscore score` prints as JSON.
    #[pyo3(signature = (context, schema, *, mode="parallel", temperature=None, max_input_tokens=DEFAULT_MAX_INPUT_TOKENS, field_batch_size=None, allow_uncalibrated=false, include_prompt=false, allowed_mass=false, top_k=5, scoring="code", literal_value="argmax", layout="context-first"))]
    #[allow(clippy::too_many_arguments)]
    fn score<'py>(
        &self,
        py: Python<'py>,
        context: String,
        schema: &Bound<'py, PyAny>,
        mode: &str,
        temperature: Option<f64>,
        max_input_tokens: usize,
        field_batch_size: Option<usize>,
        allow_uncalibrated: bool,
        include_prompt: bool,
        allowed_mass: bool,
        top_k: usize,
        scoring: &str,
        literal_value: &str,
        layout: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let opts = options(
            py,
            mode,
            temperature,
            max_input_tokens,
            field_batch_size,
            allow_uncalibrated,
            include_prompt,
            allowed_mass,
            top_k,
            scoring,
            literal_value,
            layout,
        )?;
        let schema = parse_schema(py, schema, opts.scoring)?;
        check_context_len(&context, max_input_tokens).map_err(|e| bounded_error(py, &e))?;
        let compiled = self.compile(py, &schema, max_input_tokens)?;
        let decision = py
            .detach(|| self.engine.decide(&context, &compiled, &opts.score))
            .map_err(|e| engine_error(py, &e))?;
        let value = decision_json(&decision, &compiled, &opts.score, &self.model);
        to_python(py, &value)
    }

    /// Many contexts against one schema, in bounded merged groups (one prefill per context,
    /// one scoring pass per group). Returns a list in input order: per context the same dict as
    /// `score`, or the exception instance (not raised) for that context. A bad schema or bad
    /// options raise, since they concern every context.
    ///
    /// `progress`, when given, is called as `progress(done, total)` (contexts finished so far)
    /// after preparation and after each merged group, with the GIL held; the groups are the
    /// same with or without it, so the results are too. An exception it raises is raised once
    /// the call has finished (the results are dropped).
    #[pyo3(signature = (contexts, schema, *, mode="parallel", temperature=None, max_input_tokens=DEFAULT_MAX_INPUT_TOKENS, field_batch_size=None, allow_uncalibrated=false, include_prompt=false, allowed_mass=false, top_k=5, scoring="code", literal_value="argmax", layout="context-first", progress=None))]
    #[allow(clippy::too_many_arguments)]
    fn decide_many<'py>(
        &self,
        py: Python<'py>,
        contexts: Vec<String>,
        schema: &Bound<'py, PyAny>,
        mode: &str,
        temperature: Option<f64>,
        max_input_tokens: usize,
        field_batch_size: Option<usize>,
        allow_uncalibrated: bool,
        include_prompt: bool,
        allowed_mass: bool,
        top_k: usize,
        scoring: &str,
        literal_value: &str,
        layout: &str,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let opts = options(
            py,
            mode,
            temperature,
            max_input_tokens,
            field_batch_size,
            allow_uncalibrated,
            include_prompt,
            allowed_mass,
            top_k,
            scoring,
            literal_value,
            layout,
        )?;
        let schema = parse_schema(py, schema, opts.scoring)?;
        self.engine
            .check_request(&opts.score)
            .map_err(|e| engine_error(py, &e))?;
        let compiled = self.compile(py, &schema, max_input_tokens)?;
        // contexts over the byte bound are refused before anything tokenizes them
        let bounded: Vec<Result<(), BoundedReadError>> = contexts
            .iter()
            .map(|c| check_context_len(c, max_input_tokens))
            .collect();
        let ok: Vec<&str> = contexts
            .iter()
            .zip(&bounded)
            .filter(|(_, b)| b.is_ok())
            .map(|(c, _)| c.as_str())
            .collect();
        let budget = self.budget();
        // contexts refused by the byte bound above count as done from the start
        let refused = contexts.len() - ok.len();
        let mut callback_error: Option<PyErr> = None;
        let decided = py.detach(|| {
            self.engine
                .decide_many_observed(&ok, &compiled, &opts.score, &budget, |done, _| {
                    let Some(callback) = &progress else { return };
                    if callback_error.is_some() {
                        return;
                    }
                    Python::attach(|py| {
                        if let Err(e) = callback.call1(py, (done + refused, contexts.len())) {
                            callback_error = Some(e);
                        }
                    });
                })
        });
        if let Some(e) = callback_error {
            return Err(e);
        }
        let mut decided = decided.into_iter();
        let out = PyList::empty(py);
        for b in bounded {
            let item = match b {
                Err(e) => bounded_error(py, &e).into_value(py).into_any(),
                Ok(()) => match decided.next() {
                    Some(Ok(d)) => {
                        let value = decision_json(&d, &compiled, &opts.score, &self.model);
                        to_python(py, &value)?.unbind()
                    }
                    Some(Err(e)) => engine_error(py, &e).into_value(py).into_any(),
                    None => Error::new_err("decide_many returned fewer results than contexts")
                        .into_value(py)
                        .into_any(),
                },
            };
            out.append(item)?;
        }
        Ok(out)
    }

    /// `forkscore batch` in memory: `lines` are (1-based line number, JSONL input line as `str` or `bytes`) pairs;
    /// returns the output records (JSON text, one per non-blank line, in order), exactly as
    /// `forkscore batch` writes them. `schema` is the default schema (`--schema-file`);
    /// `schema_dir` is the folder a line's relative `schema_file` is read from (default: the
    /// working directory). Used by `forkscore.ray.ForkscoreActor`.
    #[pyo3(signature = (lines, schema=None, *, batch_mode="grouped", schema_dir=None, mode="parallel", temperature=None, max_input_tokens=DEFAULT_MAX_INPUT_TOKENS, field_batch_size=None, allow_uncalibrated=false, include_prompt=false, allowed_mass=false, top_k=5, scoring="code", literal_value="argmax", layout="context-first"))]
    #[allow(clippy::too_many_arguments)]
    fn batch_records(
        &self,
        py: Python<'_>,
        lines: Vec<(u64, Bound<'_, PyAny>)>,
        schema: Option<&Bound<'_, PyAny>>,
        batch_mode: &str,
        schema_dir: Option<PathBuf>,
        mode: &str,
        temperature: Option<f64>,
        max_input_tokens: usize,
        field_batch_size: Option<usize>,
        allow_uncalibrated: bool,
        include_prompt: bool,
        allowed_mass: bool,
        top_k: usize,
        scoring: &str,
        literal_value: &str,
        layout: &str,
    ) -> PyResult<Vec<String>> {
        let opts = options(
            py,
            mode,
            temperature,
            max_input_tokens,
            field_batch_size,
            allow_uncalibrated,
            include_prompt,
            allowed_mass,
            top_k,
            scoring,
            literal_value,
            layout,
        )?;
        let batch_mode = match batch_mode {
            "grouped" => BatchMode::Grouped,
            "direct" => BatchMode::Direct,
            "serial" => BatchMode::Serial,
            other => {
                return Err(option_error(
                    py,
                    "batch_mode",
                    other,
                    "expected grouped, direct or serial",
                ))
            }
        };
        let default_schema = schema
            .map(|s| parse_schema(py, s, opts.scoring))
            .transpose()?;
        let base_dir = schema_dir.unwrap_or_default();
        let job = LinesJob {
            batch_mode,
            options: &opts.score,
            budget: self.budget(),
            default_schema: default_schema.as_ref(),
            base_dir: &base_dir,
        };
        // `bytes` as they are (a line that is not UTF-8 gets its `invalid_utf8` record), `str` as UTF-8
        let lines: Vec<(u64, Vec<u8>)> = lines
            .into_iter()
            .map(|(n, text)| match text.cast::<PyBytes>() {
                Ok(b) => Ok((n, b.as_bytes().to_vec())),
                Err(_) => Ok((n, text.extract::<String>()?.into_bytes())),
            })
            .collect::<PyResult<_>>()?;
        py.detach(|| score_lines(&self.engine, &self.provenance, &job, lines))
            .map_err(|e| lines_error(py, &e))
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Scorer>()?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("SchemaError", py.get_type::<SchemaError>())?;
    m.add("CompileError", py.get_type::<CompileError>())?;
    m.add("ContextError", py.get_type::<ContextError>())?;
    m.add("EmptyContext", py.get_type::<EmptyContext>())?;
    m.add("TooManyTokens", py.get_type::<TooManyTokens>())?;
    m.add("OptionsError", py.get_type::<OptionsError>())?;
    m.add("ModelLoadError", py.get_type::<ModelLoadError>())?;
    m.add("TemplateError", py.get_type::<TemplateError>())?;
    m.add("ScoringError", py.get_type::<ScoringError>())?;
    m.add("__version__", forkscore_frontend::provenance::VERSION)?;
    m.add("DEFAULT_MAX_INPUT_TOKENS", DEFAULT_MAX_INPUT_TOKENS)?;
    m.add("OPTIONS", options::option_table(py)?)?;
    Ok(())
}
