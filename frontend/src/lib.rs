//! What forkscore's front ends share — the `forkscore` command line (pipeline crate), the HTTP
//! service and the Python package — so that each result is built the same way whichever one
//! asked for it: opening a model ([`load`], with [`precision`] and the GGUF text side in
//! [`gguf_tokenizer`]), what a result records about it ([`provenance`]), the result JSON
//! ([`result`]), the bounds on input ([`bounds`]), the default group budget's device memory
//! ([`device_memory`]) and the core of a batch job ([`batch`]).
//!
//! No command-line parser and no HTTP server here: the Python package links this crate alone.

pub mod batch;
pub mod bounds;
pub mod device_memory;
pub mod gguf_tokenizer;
pub mod load;
pub mod precision;
pub mod provenance;
pub mod result;
