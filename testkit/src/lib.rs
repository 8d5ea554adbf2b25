//! forkscore test kit: tiny real-architecture models, a deterministic fake backend, proptest
//! strategies and named tolerances.

pub mod fake;
pub mod snapshot;
pub mod tiny_model;
pub mod tiny_qwen35;
pub mod tokenizers;
pub mod tolerance;
