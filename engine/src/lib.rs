//! forkscore engine: one context + a schema of enum/boolean fields in, a typed decision with a
//! probability for every choice out — without generating or parsing model text.
//!
//! Stages (one module each): [`schema`] (parse, validate) → [`rows`] (1: compile rows once per
//! schema) → [`prepare`] (2: render + exact token split) → [`group`] (3: bounded context
//! groups) → [`fork`] (4 + 5: prefill once, score every row over the backend seam) →
//! [`assemble`] (6: softmax over each field's codes, typed values, telemetry). [`calibration`]
//! holds the temperature policy; [`allowed_mass`] (opt-in, per field) and [`logprobs`]
//! (`Engine::logprobs`, per token of a text) are the full-vocabulary diagnostics; [`generate`] is
//! the autoregressive baseline (`Engine::generate`: the model writes the JSON, decoded greedily); [`engine`] wires the stages for one context and [`many`] for
//! many (`Engine::decide_many`). [`options`] holds the per-request options every stage reads
//! and [`softmax`] the numeric core of assembly; both depend on nothing in the crate, and each
//! stage's error type sits in a module of its own, so the files import each other without a
//! circle. The engine depends on the seam only (`forkscore-seam`): it never sees a tensor.

pub mod allowed_mass;
pub mod assemble;
pub mod calibration;
pub mod engine;
pub mod error;
pub mod finite;
pub mod fork;
pub mod generate;
pub mod group;
pub mod head;
pub mod literal;
pub mod logprobs;
pub mod many;
pub mod options;
pub mod prepare;
pub mod request_options;
pub mod rows;
pub mod schema;
pub mod softmax;
pub mod strict_json;
pub mod template;
pub mod tokenizer;

pub use allowed_mass::{AllowedMass, TopToken};
pub use assemble::{Decision, FieldResult};
pub use calibration::{
    CalibrationRegistry, CheckpointIdentity, FieldCalibration, Temperature, TemperatureSource,
};
pub use engine::Engine;
pub use error::EngineError;
pub use fork::SharedPrefix;
pub use generate::{Baseline, GenerateError, GenerateOptions, Generation, StopReason};
pub use group::{ContextGroup, GroupBudget, GroupPlanner, MemoryModel};
pub use logprobs::{LogprobOptions, TextLogprobs};
pub use options::{Layout, LiteralValue, Mode, ScoreOptions, DEFAULT_MAX_INPUT_TOKENS};
pub use prepare::PreparedContext;
pub use request_options::{OptionError, OptionSpec, RequestOptions, OPTIONS};
pub use rows::CompiledSchema;
pub use schema::{Schema, SchemaError, SchemaErrorKind};
pub use tokenizer::ChatTokenizer;
