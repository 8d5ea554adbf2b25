//! Bounds on what a front end's arguments and input can make forkscore allocate or read.
//!
//! - Every numeric flag has a range ([`flags`]).
//! - Text is refused by byte length before it is tokenized ([`text`]), a JSONL line likewise
//!   ([`lines`]). These bounds are generous: real tokenizers average 3–5 bytes per token, so a
//!   refused text could never fit `--max-input-tokens`; memory stays bounded by the window
//!   times the line bound, whatever the input holds.
//! - Reading stops at the bound: a `--context-file /dev/zero` or an endless stdin ends with an
//!   error after `bound + 1` bytes.

pub mod flags;
pub mod lines;
pub mod text;

pub use flags::{check_flags, check_float_flag, FlagRangeError, FLAG_RANGES};
pub use lines::{
    leading_id, leading_key, max_line_bytes, progress_total, read_line_bounded, LineRead,
    LEADING_BYTES, LINE_SLACK_BYTES, MAX_SKIP_BYTES,
};
pub use text::{
    check_context_len, check_text_len, max_context_bytes, read_context, read_context_file,
    read_schema_file, read_text_file, BoundedReadError, SchemaFileError, BYTES_PER_TOKEN,
    MIN_CONTEXT_BYTES,
};
