//! Bounds on what the command line and the input files can make forkscore allocate or read.
//!
//! - Every numeric flag has a range ([`check_flags`]); nothing is pre-allocated from a user
//!   number beyond it (a `--window 18446744073709551615` is refused, not a capacity overflow).
//! - Text is refused by byte length before it is tokenized: a context can hold at most
//!   [`BYTES_PER_TOKEN`] bytes per allowed token ([`max_context_bytes`]), a JSONL line at most
//!   three times that (JSON escapes) plus [`LINE_SLACK_BYTES`] for its inline schema
//!   ([`max_line_bytes`]). These are generous: real tokenizers average 3–5 bytes per token, so a
//!   refused text could never fit `--max-input-tokens`; memory stays bounded by the window
//!   times the line bound, whatever the input holds.
//! - Reading stops at the bound: a `--context-file /dev/zero` or an endless stdin ends with an
//!   error after `bound + 1` bytes, and an over-long line is skipped without being stored (in a
//!   non-regular input, at most [`MAX_SKIP_BYTES`] of it, then the job stops).
//! - The progress bar's total is counted only for a regular input file, on the already-open
//!   handle, which is then rewound ([`progress_total`]): a pipe is never read twice.

use crate::batch::openai::LineFormat;
use crate::batch::reader::RawLine;
use crate::batch::records::{parse_line, ErrorKind, Failed, LineError, Request};
use std::io::{BufRead, Read, Seek, SeekFrom};
use std::path::Path;

use serde_json::Value;

/// Bytes of text allowed per `--max-input-tokens` token.
pub const BYTES_PER_TOKEN: u64 = 64;

/// Smallest context bound, whatever `--max-input-tokens` says.
pub const MIN_CONTEXT_BYTES: u64 = 64 << 10;

/// Room for a line's id, keys and inline schema on top of its context.
pub const LINE_SLACK_BYTES: u64 = 1 << 20;

/// Most bytes of one over-long line skipped in a non-regular input before the job stops (a
/// regular file is finite, so there the rest of the line is always skipped).
pub const MAX_SKIP_BYTES: u64 = 1 << 30;

/// Most bytes a context may have under `max_input_tokens`.
pub fn max_context_bytes(max_input_tokens: usize) -> u64 {
    (max_input_tokens as u64)
        .saturating_mul(BYTES_PER_TOKEN)
        .max(MIN_CONTEXT_BYTES)
}

/// Most bytes one JSONL input line may have under `max_input_tokens`.
pub fn max_line_bytes(max_input_tokens: usize) -> u64 {
    max_context_bytes(max_input_tokens)
        .saturating_mul(3)
        .saturating_add(LINE_SLACK_BYTES)
}

/// A numeric flag out of its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{flag} {value} is out of range: it must be between {min} and {max}")]
pub struct FlagRangeError {
    pub flag: &'static str,
    pub value: String,
    pub min: String,
    pub max: String,
}

/// Ranges of the integer flags: (flag, smallest, largest).
pub const FLAG_RANGES: &[(&str, u64, u64)] = &[
    ("--max-input-tokens", 1, 1 << 20),
    ("--field-batch-size", 1, 1 << 16),
    ("--prefill-chunk", 1, 1 << 20),
    ("--window", 1, 1 << 16),
    ("--group-max-rows", 1, 1 << 24),
    ("--group-max-prefix-tokens", 1, 1 << 32),
    ("--group-max-mib", 1, 1 << 24),
    ("--top-k", 0, forkscore_backends::MAX_TOP_K as u64),
    (
        "--max-new-tokens",
        1,
        forkscore_engine::generate::MAX_NEW_TOKENS_LIMIT as u64,
    ),
];

/// Check `(flag, value)` pairs against [`FLAG_RANGES`] (absent optional flags are skipped).
pub fn check_flags(values: &[(&'static str, Option<usize>)]) -> Result<(), FlagRangeError> {
    for &(flag, value) in values {
        let Some(v) = value else { continue };
        let Some(&(_, min, max)) = FLAG_RANGES.iter().find(|(f, _, _)| *f == flag) else {
            continue;
        };
        if (v as u64) < min || (v as u64) > max {
            return Err(FlagRangeError {
                flag,
                value: v.to_string(),
                min: min.to_string(),
                max: max.to_string(),
            });
        }
    }
    Ok(())
}

/// `--device-memory-gib` and `--temperature`: finite, positive, and not absurd.
pub fn check_float_flag(
    flag: &'static str,
    value: Option<f64>,
    max: f64,
) -> Result<(), FlagRangeError> {
    match value {
        Some(v) if !(v.is_finite() && v > 0.0 && v <= max) => Err(FlagRangeError {
            flag,
            value: v.to_string(),
            min: "a positive number".into(),
            max: max.to_string(),
        }),
        _ => Ok(()),
    }
}

/// Why a bounded text could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BoundedReadError {
    #[error("{what} is longer than {max} bytes, the limit for --max-input-tokens {tokens} ({per} bytes per token); it could never fit, so it is refused before tokenizing (raise --max-input-tokens to allow longer text)", per = BYTES_PER_TOKEN)]
    TooLong {
        what: String,
        max: u64,
        tokens: usize,
    },
    #[error("{what} is a directory")]
    Directory { what: String },
    #[error("cannot read {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} is not UTF-8 text")]
    NotUtf8 { what: String },
}

/// Read at most the context bound of `max_input_tokens` from `reader` (a file, a pipe, stdin,
/// a device): more is an error after `bound + 1` bytes, however long the source is.
pub fn read_context(
    reader: impl Read,
    what: &str,
    max_input_tokens: usize,
) -> Result<String, BoundedReadError> {
    let max = max_context_bytes(max_input_tokens);
    let mut bytes = Vec::new();
    reader
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| BoundedReadError::Io {
            what: what.to_string(),
            source,
        })?;
    if bytes.len() as u64 > max {
        return Err(BoundedReadError::TooLong {
            what: what.to_string(),
            max,
            tokens: max_input_tokens,
        });
    }
    String::from_utf8(bytes).map_err(|_| BoundedReadError::NotUtf8 {
        what: what.to_string(),
    })
}

/// [`read_context`] from a path (`-` is stdin). Directories are refused; a FIFO, a pipe or a
/// device is read up to the bound.
pub fn read_context_file(path: &Path, max_input_tokens: usize) -> Result<String, BoundedReadError> {
    read_text_file(path, "context", max_input_tokens)
}

/// [`read_context_file`] for any text under the same bound; `noun` names it in errors
/// (`"context"`: "context file x.txt", "the context from stdin"; `"text"` for `logprobs`).
pub fn read_text_file(
    path: &Path,
    noun: &str,
    max_input_tokens: usize,
) -> Result<String, BoundedReadError> {
    let what = format!("{noun} file {}", path.display());
    if path.as_os_str() == "-" {
        return read_context(
            std::io::stdin().lock(),
            &format!("the {noun} from stdin"),
            max_input_tokens,
        );
    }
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(BoundedReadError::Directory { what });
    }
    let file = std::fs::File::open(path).map_err(|source| BoundedReadError::Io {
        what: what.clone(),
        source,
    })?;
    read_context(file, &what, max_input_tokens)
}

/// An inline `--context` over the bound is refused the same way.
pub fn check_context_len(context: &str, max_input_tokens: usize) -> Result<(), BoundedReadError> {
    check_text_len(context, "context", max_input_tokens)
}

/// [`check_context_len`] for any inline text; `noun` names it in errors.
pub fn check_text_len(
    text: &str,
    noun: &str,
    max_input_tokens: usize,
) -> Result<(), BoundedReadError> {
    let max = max_context_bytes(max_input_tokens);
    if text.len() as u64 > max {
        return Err(BoundedReadError::TooLong {
            what: format!("the {noun}"),
            max,
            tokens: max_input_tokens,
        });
    }
    Ok(())
}

/// Why a schema file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SchemaFileError {
    #[error("schema file {path} is longer than {max} bytes, the most a schema may have; it is refused before parsing or tokenizing anything", max = forkscore_engine::schema::MAX_SCHEMA_BYTES)]
    TooLong { path: String },
    #[error("schema file {path} is a directory")]
    Directory { path: String },
    #[error("cannot read schema file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("schema file {path} is not UTF-8 text")]
    NotUtf8 { path: String },
}

/// Read a schema file, at most [`forkscore_engine::schema::MAX_SCHEMA_BYTES`] of it: a larger
/// file (or an endless device) is refused after that many bytes plus one, so memory stays flat.
pub fn read_schema_file(path: &Path) -> Result<String, SchemaFileError> {
    let max = forkscore_engine::schema::MAX_SCHEMA_BYTES as u64;
    let shown = path.display().to_string();
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(SchemaFileError::Directory { path: shown });
    }
    let io = |source| SchemaFileError::Io {
        path: shown.clone(),
        source,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > max {
        return Err(SchemaFileError::TooLong { path: shown });
    }
    String::from_utf8(bytes).map_err(|_| SchemaFileError::NotUtf8 { path: shown })
}

/// One line read by [`read_line_bounded`].
#[derive(Debug, PartialEq, Eq)]
pub enum LineRead {
    /// End of input.
    Eof,
    /// A line (its bytes in the buffer, without the newline).
    Line,
    /// A line of this many bytes (without the newline), over the bound: the buffer holds
    /// only its first `max` bytes, the rest was skipped.
    TooLong(u64),
}

/// Read one line into `buf` (cleared first), storing at most `max` bytes of it; the rest of an
/// over-long line is consumed without being stored, up to `max_skip` bytes (then an error).
pub fn read_line_bounded(
    input: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: u64,
    max_skip: u64,
) -> std::io::Result<LineRead> {
    buf.clear();
    let mut total = 0u64;
    let mut any = false;
    loop {
        let chunk = match input.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            break;
        }
        any = true;
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        let room = max.saturating_sub(buf.len() as u64) as usize;
        buf.extend_from_slice(&chunk[..take.min(room)]);
        total += take as u64;
        input.consume(if done { take + 1 } else { take });
        if done {
            break;
        }
        if total > max.saturating_add(max_skip) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "a line runs past {} bytes without a newline; stopping (lines are limited to {max} bytes)",
                    max.saturating_add(max_skip)
                ),
            ));
        }
    }
    Ok(match (any, total > max) {
        (false, _) => LineRead::Eof,
        (true, false) => LineRead::Line,
        (true, true) => LineRead::TooLong(total),
    })
}

/// How much of an over-long line is kept to find its `"id"` (see [`leading_id`]).
pub const LEADING_BYTES: usize = 4096;

/// The `"id"` of a JSON object line from the line's first bytes alone, when it appears among
/// the leading members before any member whose value is not a complete scalar (string, number,
/// `true`, `false`, `null`) within those bytes: `{"id": "a1", "context": "…megabytes…"}` → `"a1"`.
/// `None` when it cannot be found that way (the error record then has no id).
pub fn leading_id(prefix: &[u8]) -> Option<Value> {
    leading_key(prefix, "id")
}

/// [`leading_id`] for any top-level key (`custom_id` in OpenAI batch lines).
pub fn leading_key(prefix: &[u8], wanted: &str) -> Option<Value> {
    let mut at = 0usize;
    let skip_ws = |at: &mut usize| {
        while prefix.get(*at).is_some_and(u8::is_ascii_whitespace) {
            *at += 1;
        }
    };
    // One complete scalar starting at `at`: its bytes' end.
    let scalar_end = |at: usize| -> Option<usize> {
        match prefix.get(at)? {
            b'"' => {
                let mut i = at + 1;
                loop {
                    match prefix.get(i)? {
                        b'\\' => i += 2,
                        b'"' => return Some(i + 1),
                        _ => i += 1,
                    }
                }
            }
            b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                let len = prefix[at..]
                    .iter()
                    .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.'))
                    .count();
                // a number or literal cut off by the end of the prefix is not complete
                (at + len < prefix.len()).then_some(at + len)
            }
            _ => None,
        }
    };
    skip_ws(&mut at);
    if prefix.get(at) != Some(&b'{') {
        return None;
    }
    at += 1;
    loop {
        skip_ws(&mut at);
        let key_end = scalar_end(at)?;
        let key: String = serde_json::from_slice(&prefix[at..key_end]).ok()?;
        at = key_end;
        skip_ws(&mut at);
        if prefix.get(at) != Some(&b':') {
            return None;
        }
        at += 1;
        skip_ws(&mut at);
        let value_end = scalar_end(at)?;
        let value: Value = serde_json::from_slice(&prefix[at..value_end]).ok()?;
        if key == wanted {
            return Some(value);
        }
        at = value_end;
        skip_ws(&mut at);
        if prefix.get(at) != Some(&b',') {
            return None;
        }
        at += 1;
    }
}

/// Parse a raw line, or the error record of a line that was over the byte bound (with the id
/// found in its first bytes, when there is one).
pub fn parse_bounded(
    raw: &RawLine,
    shared_context: bool,
    format: LineFormat,
) -> Result<Request, Failed> {
    let id_key = match format {
        LineFormat::Native => "id",
        LineFormat::Openai => "custom_id",
    };
    match raw.too_long {
        Some(n) => Err(Failed {
            line: raw.line,
            id: leading_key(&raw.bytes, id_key),
            error: LineError::new(
                ErrorKind::LineTooLong,
                format!(
                    "line is {n} bytes, over the limit derived from --max-input-tokens ({BYTES_PER_TOKEN} bytes per token, 3x for JSON escapes, plus {LINE_SLACK_BYTES} for the schema); it was neither stored nor tokenized"
                ),
            ),
        }),
        None => match format {
            LineFormat::Native => parse_line(raw.line, &raw.bytes, shared_context),
            LineFormat::Openai => crate::batch::openai::parse_line(raw.line, &raw.bytes),
        },
    }
}

/// The progress bar's total: non-blank lines of a regular input file, counted on `file` (then
/// rewound); `None` for pipes, devices and when no bar is shown. Streams, never holds a line.
pub fn progress_total(file: &mut std::fs::File, shown: bool) -> Option<u64> {
    if !shown || !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut reader = std::io::BufReader::with_capacity(1 << 20, &mut *file);
    let (mut n, mut blank) = (0u64, true);
    loop {
        let chunk = reader.fill_buf().ok()?;
        if chunk.is_empty() {
            break;
        }
        for &b in chunk {
            if b == b'\n' {
                n += u64::from(!blank);
                blank = true;
            } else if !b.is_ascii_whitespace() {
                blank = false;
            }
        }
        let len = chunk.len();
        reader.consume(len);
    }
    n += u64::from(!blank);
    drop(reader);
    file.seek(SeekFrom::Start(0)).ok()?;
    Some(n)
}

/// The folder `output` would be created in exists (checked before a model loads).
pub fn check_output_dir(flag: &str, output: &Path) -> anyhow::Result<()> {
    let parent = output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !parent.is_dir() {
        anyhow::bail!(
            "{flag} {}: the directory {} does not exist",
            output.display(),
            parent.display()
        );
    }
    if output.is_dir() {
        anyhow::bail!("{flag} {} is a directory", output.display());
    }
    Ok(())
}

/// Checks of `forkscore batch` arguments that need no model: flag ranges, the input exists and
/// is not a directory (a FIFO is not opened here, so its writer is not cut off), the output's
/// folder exists and no other job holds the output, a shared context is not empty.
pub fn precheck_batch(args: &crate::batch::BatchArgs) -> anyhow::Result<()> {
    check_flags(&[
        ("--max-input-tokens", Some(args.scoring.max_input_tokens)),
        ("--field-batch-size", args.scoring.field_batch_size),
        ("--prefill-chunk", args.model.prefill_chunk),
        ("--top-k", Some(args.scoring.top_k)),
        ("--window", Some(args.window)),
        ("--group-max-rows", args.group.group_max_rows),
        (
            "--group-max-prefix-tokens",
            args.group.group_max_prefix_tokens,
        ),
        ("--group-max-mib", args.group.group_max_mib),
    ])?;
    check_float_flag("--temperature", args.scoring.temperature, 1e6)?;
    check_float_flag(
        "--device-memory-gib",
        args.group.device_memory_gib,
        (1u64 << 20) as f64,
    )?;
    match std::fs::metadata(&args.input) {
        _ if crate::batch::is_stdio(&args.input) => {}
        Ok(m) if m.is_dir() => anyhow::bail!("--input {} is a directory", args.input.display()),
        Ok(m) if m.is_file() => {
            std::fs::File::open(&args.input)
                .map_err(|e| anyhow::anyhow!("cannot open input {}: {e}", args.input.display()))?;
        }
        Ok(_) => {}
        Err(e) => anyhow::bail!("cannot open input {}: {e}", args.input.display()),
    }
    if !crate::batch::is_stdio(&args.output) {
        check_output_dir("--output", &args.output)?;
        crate::batch::lock::OutputLock::probe(&args.output)?;
    }
    if args
        .context
        .context
        .as_deref()
        .is_some_and(|c| c.trim().is_empty())
    {
        anyhow::bail!("--context is empty: a shared context must have text");
    }
    Ok(())
}

/// Checks of `forkscore score` arguments that need no model.
pub fn precheck_score(args: &crate::score_cmd::ScoreArgs) -> anyhow::Result<()> {
    check_flags(&[
        ("--max-input-tokens", Some(args.scoring.max_input_tokens)),
        ("--field-batch-size", args.scoring.field_batch_size),
        ("--prefill-chunk", args.model.prefill_chunk),
        ("--top-k", Some(args.scoring.top_k)),
    ])?;
    check_float_flag("--temperature", args.scoring.temperature, 1e6)?;
    if let Some(out) = &args.output {
        check_output_dir("--output", out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn leading_id_is_found_before_the_first_long_value() {
        let huge = "x".repeat(10_000);
        let cases: Vec<(String, Option<Value>)> = vec![
            (
                format!(r#"{{"id": "a1", "context": "{huge}"}}"#),
                Some(json!("a1")),
            ),
            (
                format!(r#"  {{"n": 3, "ok": true, "id":17,"context":"{huge}"}}"#),
                Some(json!(17)),
            ),
            (
                format!(r#"{{"id": "q\"uote", "context": "{huge}"}}"#),
                Some(json!("q\"uote")),
            ),
            (format!(r#"{{"context": "{huge}", "id": "late"}}"#), None),
            (
                format!(r#"{{"schema": {{"a": 1}}, "id": "x", "c": "{huge}"}}"#),
                None,
            ),
            (format!(r#"["id", "{huge}"]"#), None),
            (r#"{"id": 12"#.to_string(), None),
            (r#"{"id": "unterminated"#.to_string(), None),
            (String::new(), None),
        ];
        for (line, want) in cases {
            let prefix = &line.as_bytes()[..line.len().min(LEADING_BYTES)];
            assert_eq!(leading_id(prefix), want, "{}", &line[..line.len().min(60)]);
        }
    }

    #[test]
    fn bounded_lines_table() {
        // (input, max, expected reads as (kind, stored bytes))
        let cases: &[(&[u8], u64, &[(&str, &[u8])])] = &[
            (
                b"ab\ncd",
                8,
                &[("line", b"ab"), ("line", b"cd"), ("eof", b"")],
            ),
            (
                b"abcdef\nx\n",
                3,
                &[("long6", b"abc"), ("line", b"x"), ("eof", b"")],
            ),
            (b"", 3, &[("eof", b"")]),
            (b"\n\n", 3, &[("line", b""), ("line", b""), ("eof", b"")]),
            (b"abc", 3, &[("line", b"abc"), ("eof", b"")]),
            (b"abcd", 3, &[("long4", b"abc"), ("eof", b"")]),
        ];
        for (input, max, want) in cases {
            let mut r = std::io::BufReader::with_capacity(2, *input);
            let mut buf = Vec::new();
            for (kind, bytes) in *want {
                let got = read_line_bounded(&mut r, &mut buf, *max, u64::MAX).unwrap();
                let k = match got {
                    LineRead::Eof => "eof".to_string(),
                    LineRead::Line => "line".to_string(),
                    LineRead::TooLong(n) => format!("long{n}"),
                };
                assert_eq!((k.as_str(), buf.as_slice()), (*kind, *bytes), "{input:?}");
            }
        }
    }

    #[test]
    fn endless_sources_stop_at_the_bound() {
        let endless = std::io::repeat(b'x');
        let e = read_context(endless, "zeros", 10).unwrap_err();
        assert!(matches!(e, BoundedReadError::TooLong { .. }), "{e}");
        let mut r = std::io::BufReader::new(std::io::repeat(0));
        let mut buf = Vec::new();
        let e = read_line_bounded(&mut r, &mut buf, 100, 1000).unwrap_err();
        assert!(e.to_string().contains("without a newline"), "{e}");
        assert!(buf.len() <= 100);
    }

    #[cfg(unix)]
    #[test]
    fn a_pipe_gets_no_total_and_loses_no_byte() {
        use std::io::Write;
        let (reader, mut writer) = std::io::pipe().unwrap();
        writer.write_all(b"{\"id\":1}\n{\"id\":2}\n").unwrap();
        drop(writer);
        let mut file = std::fs::File::from(std::os::fd::OwnedFd::from(reader));
        assert_eq!(progress_total(&mut file, true), None);
        let mut rest = String::new();
        file.read_to_string(&mut rest).unwrap();
        assert_eq!(rest.lines().count(), 2);
        // a regular file is counted, then rewound
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("in.jsonl");
        std::fs::write(&p, "a\n\n  \nb\nc").unwrap();
        let mut f = std::fs::File::open(&p).unwrap();
        assert_eq!(progress_total(&mut f, true), Some(3));
        let mut all = String::new();
        f.read_to_string(&mut all).unwrap();
        assert_eq!(all, "a\n\n  \nb\nc");
        assert_eq!(progress_total(&mut f, false), None);
    }

    #[test]
    fn flag_ranges_table() {
        let cases: &[(&'static str, Option<usize>, bool)] = &[
            ("--window", Some(256), true),
            ("--window", Some(0), false),
            ("--window", Some(4_294_967_296), false),
            ("--window", Some(usize::MAX), false),
            ("--max-input-tokens", Some(0), false),
            ("--max-input-tokens", Some(4096), true),
            ("--field-batch-size", None, true),
            ("--group-max-mib", Some(usize::MAX), false),
            ("--prefill-chunk", Some(usize::MAX), false),
        ];
        for &(flag, v, ok) in cases {
            assert_eq!(check_flags(&[(flag, v)]).is_ok(), ok, "{flag} {v:?}");
        }
        assert!(check_float_flag("--temperature", Some(f64::NAN), 1e6).is_err());
        assert!(check_float_flag("--temperature", Some(1e300), 1e6).is_err());
        assert!(check_float_flag("--temperature", Some(0.7), 1e6).is_ok());
    }

    #[test]
    fn line_and_context_bounds_follow_max_input_tokens() {
        assert_eq!(max_context_bytes(4096), 4096 * 64);
        assert_eq!(max_context_bytes(1), MIN_CONTEXT_BYTES);
        assert_eq!(max_line_bytes(4096), 3 * 4096 * 64 + LINE_SLACK_BYTES);
        assert_eq!(max_line_bytes(usize::MAX), u64::MAX);
    }
}
