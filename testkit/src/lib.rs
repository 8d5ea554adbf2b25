//! forkscore test kit: a deterministic fake backend, named tolerances and snapshot rounding;
//! the tiny real-architecture checkpoints and tokenizer fixtures are re-exported from
//! `forkscore-checkpoints` (which the binary also uses, for `demo-model`).

pub mod fake;
pub mod snapshot;
pub mod tolerance;

pub use forkscore_checkpoints::{tiny_model, tiny_qwen35, tokenizers};
