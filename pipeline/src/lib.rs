//! forkscore pipeline: the `forkscore` command line (score one context, write a demo model,
//! run batch JSONL jobs, merge sharded batch outputs) and the provenance every result carries.

pub mod batch;
pub mod calibrate;
pub mod demo;
pub mod eval;
pub mod generate_cmd;
pub mod group_args;
pub mod input_bounds;
pub mod load;
pub mod logprobs_cmd;
pub mod merge;
pub mod score_cmd;
pub mod serve_cmd;

// what the front ends share, under the paths the CLI crate has always offered
pub use forkscore_frontend::{gguf_tokenizer, provenance};
