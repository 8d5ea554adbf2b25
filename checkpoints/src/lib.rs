//! Tiny, seeded, random-weight checkpoints written in the exact Hugging Face layout
//! ([`tiny_model`]: Qwen2.5 / Qwen3 dense; [`tiny_qwen35`]: the Qwen3.5 hybrid, multimodal or
//! text-only), with the families' real tokenizers ([`tokenizers`], embedded fixtures).
//!
//! The same seed and spec always give byte-identical files. `forkscore demo-model` writes these
//! so the tool runs without downloads; the test kit re-exports them for the tests.

pub mod tiny_model;
pub mod tiny_qwen35;
pub mod tokenizers;
