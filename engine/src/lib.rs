//! forkscore engine: one context + a schema of enum/boolean fields in, a typed decision with a
//! probability for every choice out — without generating or parsing model text.
//!
//! Stages (one module each): [`schema`] (parse, validate) → [`rows`] (compile rows once per
//! schema) → [`render`] + [`split`] (one shared prefix, exact token split) → [`modes`] (prefill
//! once, score rows over the backend seam) → [`assemble`] (softmax over each field's codes,
//! typed values). [`calibration`] holds the temperature policy; [`engine`] wires the stages; [`group`] bounds
//! context groups and [`many`] runs many contexts through them (`Engine::decide_many`).

pub mod assemble;
pub mod calibration;
pub mod engine;
pub mod finite;
pub mod group;
pub mod many;
pub mod modes;
pub mod render;
pub mod rows;
pub mod schema;
pub mod split;
pub mod strict_json;
pub mod template;
pub mod tokenizer;
pub mod untrusted;

pub use assemble::{Decision, FieldResult};
pub use calibration::{CalibrationRegistry, CheckpointIdentity, Temperature, TemperatureSource};
pub use engine::{Engine, EngineError, PreparedContext, ScoreOptions, DEFAULT_MAX_INPUT_TOKENS};
pub use group::{ContextGroup, GroupBudget, GroupPlanner, MemoryModel};
pub use modes::Mode;
pub use rows::CompiledSchema;
pub use schema::{Schema, SchemaError, SchemaErrorKind};
pub use tokenizer::ChatTokenizer;
