//! Helpers shared by the batch tests: the fake-backend engine with the real Qwen2.5 tokenizer,
//! the example files, a default job, and record readers.
#![allow(dead_code)] // each test file uses its own subset

use forkscore_backends::{Architecture, DType, Device};
use forkscore_engine::template::TemplateOrigin;
use forkscore_engine::{
    CalibrationRegistry, ChatTokenizer, CheckpointIdentity, Engine, GroupBudget, Schema,
    ScoreOptions,
};
use forkscore_pipeline::batch::openai::LineFormat;
use forkscore_pipeline::batch::resume::OutputPolicy;
use forkscore_pipeline::batch::{run_job, BatchMode, Job};
use forkscore_pipeline::provenance::ModelProvenance;
use forkscore_testkit::fake::FakeBackend;
use forkscore_testkit::tokenizers::{Family, Fixture};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub fn engine() -> &'static (Engine<FakeBackend>, ModelProvenance) {
    static E: OnceLock<(Engine<FakeBackend>, ModelProvenance)> = OnceLock::new();
    E.get_or_init(|| {
        let f = Family::Qwen2;
        let json = f.tokenizer_json().expect("tokenizer fixture");
        let tok = ChatTokenizer::from_parts(
            &json,
            Some(f.tokenizer_config_json()),
            None,
            "qwen2",
            Path::new("fixtures"),
        )
        .expect("tokenizer");
        let engine = Engine::new(
            FakeBackend::new(5),
            tok,
            CheckpointIdentity::default(),
            CalibrationRegistry::built_in(),
        )
        .unwrap();
        let chat_template: TemplateOrigin = engine.tokenizer().template().origin().clone();
        let prov = ModelProvenance {
            forkscore_version: "test",
            forkscore_commit: "test",
            model_id: "fake/qwen2.5-tokenizer".into(),
            revision: "fake".into(),
            source: "folder".into(),
            fingerprint: "fake".into(),
            architecture: Architecture::Fake,
            dtype: DType::F32,
            device: Device::Cpu,
            quantization: None,
            deterministic: false,
            chat_template,
            adapter_sha256: None,
            gguf: None,
            switches: Default::default(),
        };
        (engine, prov)
    })
}

pub fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/examples")
}

pub fn job(input: &Path, output: &Path, mode: BatchMode) -> Job {
    let schema = std::fs::read_to_string(examples().join("parallel_schema.json")).unwrap();
    Job {
        input: input.to_path_buf(),
        output: output.to_path_buf(),
        format: LineFormat::Native,
        batch_mode: mode,
        options: ScoreOptions::default(),
        budget: GroupBudget::default(),
        default_schema: Some(Schema::from_json_str(&schema).unwrap()),
        shared_context: None,
        policy: OutputPolicy::Fresh,
        fail_fast: false,
        quiet: true,
        window: 8,
        resume_any_provenance: false,
        shard: None,
    }
}

pub fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// What must not depend on batching: id, line, values, probabilities and logits, or the error.
pub fn essence(r: &Value) -> Value {
    match r.get("error") {
        Some(e) => json!({"id": r["id"], "line": r["line"], "error": e["kind"]}),
        None => {
            json!({"id": r["id"], "line": r["line"], "output": r["output"], "fields": r["fields"], "schema_hash": r["provenance"]["schema_hash"]})
        }
    }
}

pub fn run(job: &Job) -> forkscore_pipeline::batch::JobSummary {
    let (e, p) = engine();
    run_job(e, p, job).unwrap()
}
